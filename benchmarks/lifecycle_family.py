"""The cost of the lifecycle family (C13-C15): every program of the catalogue run on the
executable system and judged by every lifecycle judge.

Usage: python benchmarks/lifecycle_family.py [--impl NAME ...] [--depth K]

Prints, per implementation, the programs run, the CPU and wall time, the time per
program and the first violation of each lifecycle theorem (none for the reference).
Nothing here asserts on timing.
"""

from __future__ import annotations

import argparse
import time

from kvcontract.impl.variants import get_implementation
from kvcontract.spec.properties.base import CaseProperty
from kvcontract.spec.properties.lifecycle import (
    LIFECYCLE_DEPTH,
    lifecycle_cases,
    lifecycle_properties,
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--impl", action="append", default=None,
                        help="implementation (repeatable; default: the reference and the "
                        "three lifecycle variants)")
    parser.add_argument("--depth", type=int, default=LIFECYCLE_DEPTH,
                        help=f"actions per program (default {LIFECYCLE_DEPTH})")
    args = parser.parse_args(argv)
    names = args.impl or ["reference", "no-deadline", "resetting-deadline",
                          "abort-unscheduled-crash"]
    judged = [p for p in lifecycle_properties() if isinstance(p, CaseProperty)]
    for name in names:
        impl = get_implementation(name)
        cpu, wall = time.process_time(), time.perf_counter()
        programs = 0
        first: dict[str, str] = {}
        for case in lifecycle_cases(args.depth):
            programs += 1
            for prop in judged:
                message = prop.check(case, impl)
                if message is not None and prop.theorem_id not in first:
                    first[prop.theorem_id] = f"{case.label or list(case.actions)}: {message}"
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        print(f"{name}: {programs} programs, {len(judged)} judges: cpu {cpu:.1f} s, "
              f"wall {wall:.1f} s, {1000 * cpu / programs:.2f} ms cpu per program")
        for theorem, text in first.items():
            print(f"  {theorem}: {text[:110]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
