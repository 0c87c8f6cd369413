"""Time `kvcontract prove` on an implementation and list the slowest theorems.

Usage: python benchmarks/prove_time.py [--impl reference] [--jobs N] [--top 10]
Target (issue 2): the whole reference proof in under 30 s on a 2-core machine.
"""

from __future__ import annotations

import argparse
import time

from kvcontract.proofs.runner import prove


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--impl", default="reference")
    parser.add_argument("--jobs", type=int, default=None)
    parser.add_argument("--top", type=int, default=10)
    args = parser.parse_args()
    started = time.perf_counter()
    report = prove(args.impl, None, jobs=args.jobs)
    wall = time.perf_counter() - started
    cpu = sum(r.seconds for r in report.results)
    print(f"{args.impl}: {len(report.results)} theorems, wall {wall:.1f}s, "
          f"theorem time summed {cpu:.1f}s, exit code {report.exit_code}")
    print(f"target: wall < 30 s on 2 cores -> {'met' if wall < 30 else 'NOT met'}")
    for r in sorted(report.results, key=lambda r: -r.seconds)[: args.top]:
        print(f"  {r.seconds:7.2f}s  {r.clause}/{r.theorem}  {r.verdict.value}  "
              f"queries={r.queries} rlimit={r.rlimit_used:,}")


if __name__ == "__main__":
    main()
