"""Time `kvcontract prove` cold and cached, check that merged shards equal one run.

Usage: python benchmarks/prove_time.py [--impl reference] [--jobs N] [--shards 3]
                                       [--clause ID ...] [--top 10]

Each run is the command line in a fresh process (``python -m kvcontract prove``), so
the times include the interpreter, the imports and reading the cache:

1. cold: an empty proof cache (a temporary ``KVCONTRACT_CACHE_DIR``);
2. cached: the same command again; every theorem is read back from the cache;
3. shards: ``--shard I/N --no-cache`` for I = 1..N (proved again, not read from the
   cache), then ``kvcontract merge``; the merged report must equal the cold run's,
   times aside (:func:`kvcontract.tools.reports.merge.comparable`): the verdicts and
   Z3's resource counts too;
4. serial: ``--jobs 1 --no-cache`` (with ``--serial``): the same report again, resource
   counts included (every theorem is proved from the same process state,
   :mod:`kvcontract.proofs.pool`).

Targets (issues 2 and 11): cold < 30 s and cached < 2 s on a 2-core machine. The load
average and the CPU seconds of each run (its worker processes included) are printed
with the times: on a shared machine the wall time is not the prover's alone, and CPU
seconds / 2 estimates the wall time on two idle cores.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

COLD_TARGET = 30.0
CACHED_TARGET = 2.0


CPU_SECONDS: list[float] = []
"""CPU seconds (user + system) of the last run, its worker processes included."""


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _run(args: list[str], env: dict[str, str]) -> tuple[float, int]:
    started, cpu = time.perf_counter(), _cpu()
    done = subprocess.run([sys.executable, "-m", "kvcontract", *args], env=env,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          check=False)
    seconds = time.perf_counter() - started
    # The workers are reaped by the command, so their time is in its children's usage:
    # on a loaded machine CPU seconds / cores estimates the wall time on idle cores.
    CPU_SECONDS[:] = [_cpu() - cpu]
    if done.returncode not in (0, 1, 3):
        raise SystemExit(f"kvcontract {' '.join(args)} failed ({done.returncode}):\n"
                         f"{done.stderr}")
    return seconds, done.returncode


def _load() -> str:
    try:
        one, five, _ = os.getloadavg()
    except OSError:
        return "load average unknown"
    return f"load average {one:.2f} (1 min), {five:.2f} (5 min), {os.cpu_count()} cores"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--impl", default="reference")
    parser.add_argument("--jobs", type=int, default=None)
    parser.add_argument("--shards", type=int, default=3,
                        help="shards of the merge check (0: skip it)")
    parser.add_argument("--clause", action="append", default=[])
    parser.add_argument("--top", type=int, default=10)
    parser.add_argument("--serial", action="store_true",
                        help="also prove with --jobs 1 and compare the reports")
    args = parser.parse_args()
    from kvcontract.tools.reports.merge import comparable

    common = ["prove", "--impl", args.impl, "--quiet"]
    common += [f"--clause={c}" for c in args.clause]
    if args.jobs is not None:
        common += ["--jobs", str(args.jobs)]
    with tempfile.TemporaryDirectory(prefix="kvcontract-bench-") as folder:
        work = Path(folder)
        env = {**os.environ, "KVCONTRACT_CACHE_DIR": str(work / "cache")}
        print(f"before: {_load()}")
        cold, code = _run([*common, "--json", str(work / "cold.json")], env)
        print(f"cold:   {cold:6.2f} s (exit {code}); {CPU_SECONDS[0]:.1f} CPU s; {_load()}")
        cached, cached_code = _run([*common, "--json", str(work / "cached.json")], env)
        report: dict[str, Any] = json.loads((work / "cold.json").read_text())
        again: dict[str, Any] = json.loads((work / "cached.json").read_text())
        reused = sum(1 for r in again["results"] if r.get("cached"))
        print(f"cached: {cached:6.2f} s (exit {cached_code}); {CPU_SECONDS[0]:.1f} CPU s; "
              f"{reused} of "
              f"{len(again['results'])} theorems from the cache; {_load()}")
        print(f"target: cold < {COLD_TARGET:.0f} s -> "
              f"{'met' if cold < COLD_TARGET else 'NOT met'}; cached < {CACHED_TARGET:.0f} s "
              f"-> {'met' if cached < CACHED_TARGET else 'NOT met'}")
        same_cached = comparable(report) == comparable(again)
        print(f"cached report equals the cold one (times aside): {same_cached}")
        equal = True
        if args.shards > 0:
            paths = []
            total = 0.0
            for index in range(1, args.shards + 1):
                path = work / f"shard-{index}.json"
                seconds, _ = _run([*common, "--no-cache", "--shard",
                                   f"{index}/{args.shards}", "--json", str(path)], env)
                shard = json.loads(path.read_text())
                print(f"shard {index}/{args.shards}: {seconds:6.2f} s, "
                      f"{len(shard['results'])} theorems")
                total += seconds
                paths.append(str(path))
            _, merged_code = _run(["merge", *paths, "--quiet", "--json",
                                   str(work / "merged.json")], env)
            merged = json.loads((work / "merged.json").read_text())
            equal = comparable(merged) == comparable(report) and merged_code == code
            print(f"merged {args.shards} shards ({total:.1f} s in all, exit {merged_code}) "
                  f"equal the unsharded report (times aside): {equal}")
        if args.serial:
            seconds, serial_code = _run([*common, "--no-cache", "--jobs", "1", "--json",
                                         str(work / "serial.json")], env)
            serial = json.loads((work / "serial.json").read_text())
            same_serial = comparable(serial) == comparable(report) and serial_code == code
            print(f"serial: {seconds:6.2f} s (--jobs 1, exit {serial_code}) equals the "
                  f"parallel report, Z3 resource counts included: {same_serial}")
            equal = equal and same_serial
        print("slowest theorems (cold):")
        for r in sorted(report["results"], key=lambda r: -r["seconds"])[: args.top]:
            print(f"  {r['seconds']:7.2f}s  {r['clause']}/{r['theorem']}  {r['verdict']}  "
                  f"queries={r['queries']} rlimit={r['rlimit_used']:,}")
    if not (equal and same_cached):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
