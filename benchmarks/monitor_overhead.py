"""The runtime monitor's overhead (kvcontract.monitor, tools/runtime_monitor.py).

Usage: python benchmarks/monitor_overhead.py [--tests DIR] [-k EXPR] [--steps N]

Two figures, each a ratio against a baseline run in the same invocation:

* ``--tests DIR`` (a release's tests fetched by ``kvcontract vllm-tests``, the folder
  holding ``tests/``): vLLM's own ``test_scheduler.py`` (or the ``-k`` selection) run
  twice in child pytests, without and then with ``-p kvcontract.monitor``; prints each
  run's wall and CPU time, its outcome counts (they must be equal) and the ratios;
* the serving hook's per-step cost: vLLM's scheduler and connector (kvcontract's live
  session) driving the same producer/consumer traffic ``--steps`` times without and with
  the monitor installed in this process; prints the time per engine step and the ratio.

Needs vLLM (``.ci/install-live``); nothing here asserts on timing. The issue's target is
a ratio of at most 1.5 on the test file.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _live import live_backend_missing

TEST_FILE = "tests/v1/kv_connector/unit/offloading_connector/test_scheduler.py"


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _outcomes(output: str) -> dict[str, int]:
    tail = output.strip().splitlines()[-1] if output.strip() else ""
    return {word: int(count) for count, word in re.findall(r"(\d+) (\w+)", tail)}


def run_tests(folder: Path, select: str | None, monitored: bool) -> tuple[float, float, str]:
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "HF_HOME": str(folder.parent / "hf-home"),
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    command = [sys.executable, "-m", "pytest", TEST_FILE, "-q", "-p", "no:cacheprovider"]
    if (folder / "kvcontract_vllm_cpu.py").exists():
        command += ["-p", "kvcontract_vllm_cpu"]
    if select:
        command += ["-k", select]
    if monitored:
        command += ["-p", "kvcontract.monitor"]
    cpu = _children_cpu()
    start = time.perf_counter()
    done = subprocess.run(command, cwd=folder, env={**env, "PYTHONPATH": str(folder)},
                          capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    lines = [line for line in done.stdout.splitlines() if re.search(r"\d+ (passed|failed)", line)]
    return wall, _children_cpu() - cpu, lines[-1] if lines else done.stdout[-300:]


MONITOR_SECONDS = [0.0]
"""Seconds spent in the monitor's own hooks (its ``_guarded`` sections), this process."""


def _time_the_hooks() -> None:
    from kvcontract.tools.runtime_monitor import RuntimeMonitor

    original = RuntimeMonitor._guarded

    def timed(self: RuntimeMonitor, *args: Any) -> Any:
        start = time.perf_counter()
        try:
            return original(self, *args)
        finally:
            MONITOR_SECONDS[0] += time.perf_counter() - start

    RuntimeMonitor._guarded = timed  # type: ignore[method-assign]


def serving_steps(steps: int, monitored: bool) -> float:
    """Seconds per engine step of producer/consumer traffic on vLLM's engine."""
    from kvcontract.live.session import LiveSession
    from kvcontract.live.trace import prompt_tokens
    from kvcontract.spec.geometry import Geometry, fa, swa
    from kvcontract.tools.runtime_monitor import RuntimeMonitor

    monitor = RuntimeMonitor() if monitored else None
    if monitor is not None:
        monitor.install()
    try:
        session = LiveSession.open(Geometry((fa(4), swa(4, 8))))
        elapsed, count = 0.0, 0
        for round_ in range(steps):
            tokens = prompt_tokens(41, offset=1 + 1000 * (round_ % 7))
            session.add_request(f"r{round_}", tokens, 2)
            start = time.perf_counter()
            for _ in range(4):
                session.step(16)
                count += 1
            elapsed += time.perf_counter() - start
        session.close()
    finally:
        if monitor is not None:
            monitor.uninstall()
            report = monitor.report
            if report.violations or report.errors:
                print(f"  monitor: {len(report.violations)} violations, "
                      f"{len(report.errors)} errors", file=sys.stderr)
    return elapsed / max(1, count)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tests", type=Path, help="a folder from `kvcontract vllm-tests`")
    parser.add_argument("-k", dest="select", help="pytest -k selection of the test file")
    parser.add_argument("--steps", type=int, default=40, help="serving rounds (default 40)")
    args = parser.parse_args(argv)
    if live_backend_missing(import_modules=False):
        return 3
    if args.tests is not None:
        if not (args.tests / TEST_FILE).exists():
            print(f"monitor_overhead: {args.tests} has no {TEST_FILE} "
                  "(fetch it with `kvcontract vllm-tests`)", file=sys.stderr)
            return 2
        base = run_tests(args.tests, args.select, monitored=False)
        watched = run_tests(args.tests, args.select, monitored=True)
        print(f"vLLM's {TEST_FILE} ({args.tests})")
        print(f"  without the monitor: {base[0]:7.1f} s wall, {base[1]:7.1f} s CPU: {base[2]}")
        print(f"  with the monitor:    {watched[0]:7.1f} s wall, {watched[1]:7.1f} s CPU: "
              f"{watched[2]}")
        print(f"  ratio: {watched[0] / base[0]:.2f}x wall, {watched[1] / base[1]:.2f}x CPU; "
              f"outcomes {'equal' if _outcomes(base[2]) == _outcomes(watched[2]) else 'DIFFER'}")
    _time_the_hooks()
    serving_steps(4, monitored=False)  # warm up: the first engine pays vLLM's imports
    plain_runs, watched_runs = [], []
    for _ in range(3):  # alternated, medians: the two sides see the same machine load
        plain_runs.append(serving_steps(args.steps, monitored=False))
        watched_runs.append(serving_steps(args.steps, monitored=True))
    plain, watched_step = statistics.median(plain_runs), statistics.median(watched_runs)
    own = MONITOR_SECONDS[0] / (3 * 4 * args.steps)
    print(f"serving hook, {args.steps} requests on vLLM's engine (FA4 + SWA4(sw 8), no model "
          "forward pass), median of 3 alternated runs:")
    print(f"  {plain * 1e3:.3f} ms per step without, {watched_step * 1e3:.3f} ms with: "
          f"{watched_step / plain:.2f}x; the monitor's own hooks: {own * 1e3:.3f} ms per "
          f"step ({(plain + own) / plain:.2f}x of the step without)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
