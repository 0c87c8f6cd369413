"""The engine-judged audit beside the stand-in audit of the same target, in one run:
wall-clock time, CPU time and peak memory of each, and their ratio (target: the engine
judge takes no more than 2x the stand-ins' wall time, and under 150 s on 2 cores).

Usage: ``python benchmarks/audit_time.py [TARGET] [--jobs N] [--model NAME ...]
[--no-costs] [--only engine|stand-ins]``. TARGET is what ``kvcontract audit --target``
takes (default ``vllm:installed``), or a release version (``0.33.0``: its audited files
fetched with ``pip download --no-deps`` into the kvcontract cache, composed over the
installed vLLM for the engine). Each audit is ``kvcontract audit --target TARGET --quiet
--json ...`` with ``--judge engine`` or ``--judge stand-ins``, run in a process of its
own (a process runs one vLLM; the measures do not mix), the stand-in audit first.

Two cores are often shared: the CPU time (user + system of the audit's process and all
its children) and the load average are printed next to the wall time, since the wall
time alone says little on a loaded machine. Peak RSS is the largest of the audit's
process and any one of its children (``ru_maxrss`` of the waited process tree).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TARGET_SECONDS = 150.0
TARGET_RATIO = 2.0


@dataclass
class Timed:
    judge: str
    wall: float
    cpu: float
    peak_mib: float
    exit_code: int
    report: dict[str, Any]


def _target(text: str) -> str:
    if re.fullmatch(r"v?\d+\.\d+\.\d+\S*", text):
        from kvcontract.tools.audit.wheels import fetch_release

        return f"vllm:{fetch_release(text.lstrip('v'))}"
    return text


def _audit(target: str, judge: str, extra: list[str]) -> Timed:
    with tempfile.TemporaryDirectory(prefix="audit-time-") as folder:
        out = Path(folder) / "report.json"
        command = [sys.executable, "-m", "kvcontract", "audit", "--target", target,
                   "--judge", judge, "--quiet", "--json", str(out), *extra]
        started = time.perf_counter()
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL)
        _, status, usage = os.wait4(process.pid, 0)
        wall = time.perf_counter() - started
        report = json.loads(out.read_text()) if out.exists() else {}
    return Timed(judge, wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024,
                 os.waitstatus_to_exitcode(status), report)


def _line(timed: Timed) -> str:
    engine = timed.report.get("engine") or {}
    who = engine.get("release") if engine.get("ran") else \
        f"stand-ins ({engine.get('why', 'no engine')})"
    defects = timed.report.get("defects") or []
    failing = [d for d in defects if not d.get("latent") and not d.get("unconfirmed")]
    return (f"{timed.judge:9}: wall {timed.wall:6.1f}s, CPU {timed.cpu:6.1f}s, peak RSS "
            f"{timed.peak_mib:5.0f} MiB, exit {timed.exit_code}, {len(defects)} defects "
            f"({len(failing)} failing); judged by {who}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("target", nargs="?", default="vllm:installed")
    parser.add_argument("--jobs", type=int, default=None)
    parser.add_argument("--model", action="append", default=None,
                        help="a preset name or 'all' (repeatable; default: the catalogues)")
    parser.add_argument("--no-costs", action="store_true",
                        help="skip the defects' preset costs (--catalogue-only)")
    parser.add_argument("--only", choices=("engine", "stand-ins"), default=None,
                        help="time one of the two audits only")
    args = parser.parse_args()
    target = _target(args.target)
    extra: list[str] = []
    if args.jobs is not None:
        extra += ["--jobs", str(args.jobs)]
    for model in args.model or ():
        extra += ["--model", model]
    if args.no_costs:
        extra.append("--catalogue-only")
    load = os.getloadavg()
    judges = [args.only] if args.only else ["stand-ins", "engine"]
    runs = {judge: _audit(target, judge, extra) for judge in judges}
    print(f"kvcontract audit --target {target} {' '.join(extra)} "
          f"({args.jobs or os.cpu_count()} workers; load average {load[0]:.2f} before, "
          f"{os.getloadavg()[0]:.2f} after)")
    for timed in runs.values():
        print(_line(timed))
    if len(runs) == 2:
        engine, stand_ins = runs["engine"], runs["stand-ins"]
        ratio = engine.wall / stand_ins.wall if stand_ins.wall else float("inf")
        cpu_ratio = engine.cpu / stand_ins.cpu if stand_ins.cpu else float("inf")
        print(f"engine / stand-ins: wall x{ratio:.2f}, CPU x{cpu_ratio:.2f}, peak RSS "
              f"x{engine.peak_mib / max(stand_ins.peak_mib, 1):.2f}")
        verdict = ratio <= TARGET_RATIO and engine.wall < TARGET_SECONDS
        print(f"target: engine <= {TARGET_RATIO:g}x the stand-ins and < "
              f"{TARGET_SECONDS:.0f}s wall: {'OK' if verdict else 'MISS'}")


if __name__ == "__main__":
    main()
