"""The cost of ``audit --live``'s replay stage alone (tools/audit/live_stage.py).

Usage: python benchmarks/audit_live_stage.py REPORT.json [--repeat N]

Reads an audit's JSON report (``kvcontract audit --target ... --json REPORT.json``, with
or without ``--live``), drops any ``live`` status it has and runs the live stage again:
every defect's system-level witnesses replayed on the installed vLLM in a sandbox child
(with the report's target laid over it when it is a patch). Prints the stage's wall
time, the child's CPU time and peak memory, how many cases ran, and each defect's
status. Needs vLLM (``.ci/install-live``); nothing here asserts on timing.
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from typing import Any

from _live import live_backend_missing


def _children() -> tuple[float, float]:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", help="an audit's JSON report")
    parser.add_argument("--repeat", type=int, default=1, help="runs of the stage (default 1)")
    args = parser.parse_args(argv)
    from kvcontract.tools.audit.live_stage import confirm_defects

    if live_backend_missing(import_modules=False):
        return 3
    with open(args.report, encoding="utf-8") as handle:
        original: dict[str, Any] = json.load(handle)
    for run in range(args.repeat):
        report = json.loads(json.dumps(original))
        for defect in report.get("defects", []):
            defect.pop("live", None)
        cpu_before, _ = _children()
        start = time.perf_counter()
        confirm_defects(report, None)
        wall = time.perf_counter() - start
        cpu_after, peak = _children()
        defects = [d for d in report.get("defects", []) if "live" in d]
        cases = sum(len(d["live"].get("replays", ())) for d in defects)
        print(f"run {run + 1}: live stage {wall:.1f} s wall, {cpu_after - cpu_before:.1f} s "
              f"CPU in the child (peak {peak:.0f} MiB), {cases} cases on vLLM "
              f"{report['live'].get('vllm')}")
        for defect in defects:
            print(f"  {defect['id']} {defect['impact']}: {defect['live']['status']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
