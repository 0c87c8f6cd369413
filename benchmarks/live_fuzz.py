"""The fuzzer's live backend: kvcontract's model of vLLM against vLLM, on the matrix.

Usage: python benchmarks/live_fuzz.py [--impl NAME] [--quick] [--seeds] [--limit N]

Runs the seed scenarios (``--seeds``) or the fuzz matrix (the quick slice with
``--quick``, else the full matrix) on kvcontract's executable system (``--impl``,
``upstream-current`` by default: kvcontract's model of vLLM 0.33.0) and on vLLM's own
scheduler in lockstep (``kvcontract.tools.fuzz.run_live_scenario``), and prints the
agreement rate (agreed over compared programs), the programs refused and not
replayable (with their reasons, counted), the model gaps per class, the unexplained
ones in full, throughput (scenarios per second, after a warm-up scenario so the one-off
import of vLLM is reported apart) and peak memory (the process's maximum resident set).
Needs vLLM (``.ci/install-live``); nothing here asserts on timing.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from collections import Counter


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--impl", default="upstream-current")
    parser.add_argument("--quick", action="store_true", help="the matrix's quick slice")
    parser.add_argument("--seeds", action="store_true", help="the seed scenarios")
    parser.add_argument("--limit", type=int, default=None,
                        help="at most this many scenarios (a partial run)")
    args = parser.parse_args(argv)

    from kvcontract.live.env import check

    start = time.perf_counter()
    found = check()
    if not found.ok:
        print("\n".join(found.lines()), file=sys.stderr)
        return 3
    from kvcontract.impl.variants import get_implementation
    from kvcontract.live.differential import LiveComparisonReport
    from kvcontract.live.run import vllm_version
    from kvcontract.tools.fuzz import matrix_scenarios, run_live_scenario, seed_scenarios

    impl = get_implementation(args.impl)
    scenarios = seed_scenarios() if args.seeds else list(matrix_scenarios(quick=args.quick))
    if args.limit is not None:
        scenarios = scenarios[: args.limit]
    what = "seed scenarios" if args.seeds else (
        "quick matrix" if args.quick else "full matrix")
    warm = run_live_scenario(impl, scenarios[0])
    warm_up = time.perf_counter() - start
    report = LiveComparisonReport(impl.name, vllm_version(), [warm])
    timed = time.perf_counter()
    for scenario in scenarios[1:]:
        report.programs.append(run_live_scenario(impl, scenario))
    elapsed = time.perf_counter() - timed

    print(f"{what}: {len(scenarios)} scenarios, {args.impl} against vLLM {vllm_version()}")
    print(report.summary())
    rate = report.agreement
    print(f"agreement rate: {'n/a' if rate is None else f'{rate:.1%}'} "
          f"({report.count('agreed')} agreed / {report.compared} compared)")
    # A not-replayable reason names its operation first ("perturb_left_chunk(...): ");
    # counted by the cause.
    reasons = Counter(str(p.reason).split("): ", 1)[-1] for p in report.programs
                      if p.outcome in ("refused", "not-replayable"))
    for reason, count in reasons.most_common():
        print(f"  not compared ({count}): {reason}")
    for name, count in report.classes().items():
        print(f"  model gaps [{name}]: {count}")
    for gap in report.gaps:
        if gap.gap_class == "unexplained":
            print(f"  {gap.line()}")
    rest = len(scenarios) - 1
    print(f"warm-up (first scenario, imports vLLM): {warm_up:.1f} s")
    if rest:
        print(f"throughput: {rest / elapsed:.2f} scenarios/s ({rest} scenarios in "
              f"{elapsed:.1f} s; refused ones cost a build attempt only)")
    print(f"peak RSS: {_rss_mib():.0f} MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
