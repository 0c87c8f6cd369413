"""The fuzzer's live backend: kvcontract's model of vLLM against vLLM, on the matrix.

Usage: python benchmarks/live_fuzz.py [--impl NAME] [--quick | --seeds | --state-machine N]
       [--seed S] [--only REGEX] [--limit N] [--json FILE]

Runs the seed scenarios (``--seeds``), the fuzz matrix (the quick slice with
``--quick``, else the full matrix) or the live state machine's programs (``--state-machine
N``: N Hypothesis programs at ``--seed S``, as ``kvcontract fuzz --live --examples N --seed
S`` draws them, from the geometries the live backend declares) on kvcontract's executable
system (``--impl``, ``upstream-current`` by default: kvcontract's model of vLLM 0.33.0)
and on vLLM's own scheduler in lockstep (``kvcontract.tools.fuzz.run_live_scenario``), and
prints:

* the outcomes (compared, agreed, disagreed, refused, not replayable) and the agreement
  rate (agreed over compared programs), overall and split by the geometry's extra
  retained tokens (``e = 0`` and ``e > 0``: MTP drafters);
* the refused programs by reason, each marked with who refused it (``vLLM``: vLLM's
  own rule or plan; ``live backend``: a geometry the backend cannot declare, which
  ``kvcontract.live.build.unsupported`` or the build names), and the not-replayable ones
  by reason (an operation's reason is counted by its cause);
* the model gaps per class (``e = 0`` / ``e > 0``) with the number of programs each is
  found in and one example scenario, and the ``unexplained`` ones in full;
* throughput (scenarios per second, after a warm-up scenario so the one-off import of
  vLLM is reported apart; the state machine's time includes drawing its programs) and
  peak memory (the process's maximum resident set).

``--json FILE`` writes the live comparison report (``LiveComparisonReport.to_json``)
with the run's label, the installed release and the split by ``e``. ``--only REGEX``
keeps the scenarios whose name matches (an investigation's slice). Needs vLLM
(``.ci/install-live``); nothing here asserts on timing.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections import Counter
from typing import Any

from _live import live_backend_missing, rss_mib


def _extra(geometry: Any) -> int:
    return max((g.extra_retained_tokens for g in geometry.groups), default=0)


def _split(report: Any, extra: dict[str, int]) -> dict[str, dict[str, Any]]:
    """Outcomes and gap classes of ``report`` per ``e = 0`` / ``e > 0``."""
    split: dict[str, dict[str, Any]] = {}
    for label, positive in (("e = 0", False), ("e > 0", True)):
        programs = [p for p in report.programs
                    if (extra.get(p.scenario, 0) > 0) == positive]
        outcomes = Counter(p.outcome for p in programs)
        compared = outcomes["agreed"] + outcomes["disagreed"]
        classes = Counter(g.gap_class for p in programs for g in p.gaps)
        split[label] = {
            "programs": len(programs), "compared": compared,
            "agreed": outcomes["agreed"], "disagreed": outcomes["disagreed"],
            "refused": outcomes["refused"], "not_replayable": outcomes["not-replayable"],
            "agreement": outcomes["agreed"] / compared if compared else None,
            "gap_classes": dict(sorted(classes.items())),
        }
    return split


def _refused_by(geometry: Any, reason: str) -> str:
    from kvcontract.live.build import unsupported

    if unsupported(geometry) is not None or reason.startswith("e > 0 without an EAGLE"):
        return "live backend"
    return "vLLM"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--impl", default="upstream-current")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--quick", action="store_true", help="the matrix's quick slice")
    which.add_argument("--seeds", action="store_true", help="the seed scenarios")
    which.add_argument("--state-machine", type=int, default=None, metavar="N",
                       help="N live state-machine programs (Hypothesis, --seed)")
    parser.add_argument("--seed", type=int, default=0,
                        help="the salt of the matrix and seeds, the state machine's seed")
    parser.add_argument("--only", default=None, metavar="REGEX",
                        help="only the scenarios whose name matches")
    parser.add_argument("--limit", type=int, default=None,
                        help="at most this many scenarios (a partial run)")
    parser.add_argument("--json", default=None, metavar="FILE",
                        help="write the live comparison report here")
    args = parser.parse_args(argv)

    start = time.perf_counter()
    if live_backend_missing():
        return 3
    import kvcontract.tools.fuzz as fuzz
    from kvcontract.impl.variants import get_implementation
    from kvcontract.live.differential import LiveComparisonReport
    from kvcontract.live.run import vllm_version

    run_live_scenario = fuzz.run_live_scenario  # the state machine's recorder wraps it
    impl = get_implementation(args.impl)
    release = vllm_version()
    extra: dict[str, int] = {}
    geometries: dict[str, Any] = {}
    if args.state_machine is not None:
        what = f"state machine ({args.state_machine} programs, seed {args.seed})"

        def recorded(impl: Any, scenario: Any) -> Any:
            # run_fuzz keeps its programs' scenarios to itself: their geometries are
            # recorded here, on their way to the live comparison.
            extra[scenario.name] = _extra(scenario.geometry)
            geometries[scenario.name] = scenario.geometry
            return run_live_scenario(impl, scenario)

        fuzz.run_live_scenario = recorded
        try:
            fuzzed = fuzz.run_fuzz(impl.name, examples=args.state_machine, seed=args.seed,
                                   scenarios=[], live=True)
        finally:
            fuzz.run_live_scenario = run_live_scenario
        report = fuzzed.live
        elapsed = time.perf_counter() - start
        warm_up = None
        programs = len(report.programs)
        if fuzzed.differences:
            print(f"(the state machine stopped on a contract finding: "
                  f"{fuzzed.differences[0].clause} {fuzzed.differences[0].kind})")
    else:
        scenarios = (fuzz.seed_scenarios(args.seed) if args.seeds
                     else list(fuzz.matrix_scenarios(args.seed, quick=args.quick)))
        if args.only is not None:
            pattern = re.compile(args.only)
            scenarios = [s for s in scenarios if pattern.search(s.name)]
        if args.limit is not None:
            scenarios = scenarios[: args.limit]
        if not scenarios:
            print("no scenario selected", file=sys.stderr)
            return 2
        what = "seed scenarios" if args.seeds else (
            "quick matrix" if args.quick else "full matrix")
        if args.only is not None:
            what += f" matching {args.only!r}"
        extra = {s.name: _extra(s.geometry) for s in scenarios}
        geometries = {s.name: s.geometry for s in scenarios}
        warm = run_live_scenario(impl, scenarios[0])
        warm_up = time.perf_counter() - start
        report = LiveComparisonReport(impl.name, release, [warm])
        timed = time.perf_counter()
        for scenario in scenarios[1:]:
            report.programs.append(run_live_scenario(impl, scenario))
        elapsed = time.perf_counter() - timed
        programs = len(scenarios)

    print(f"{what}: {programs} programs, {args.impl} against vLLM {release}")
    print(report.summary())
    rate = report.agreement
    print(f"agreement rate: {'n/a' if rate is None else f'{rate:.1%}'} "
          f"({report.count('agreed')} agreed / {report.compared} compared; "
          f"{report.count('disagreed')} disagreed)")
    split = _split(report, extra) if extra else {}
    for label, row in split.items():
        shown = "n/a" if row["agreement"] is None else f"{row['agreement']:.1%}"
        print(f"  {label}: {row['programs']} programs, {row['compared']} compared, "
              f"{row['agreed']} agreed ({shown}), {row['refused']} refused, "
              f"{row['not_replayable']} not replayable")
    refused = Counter(
        (_refused_by(geometries[p.scenario], str(p.reason)) if p.scenario in geometries
         else "?", str(p.reason))
        for p in report.programs if p.outcome == "refused")
    for (by, reason), count in refused.most_common():
        print(f"  refused ({count}, by {by}): {reason}")
    # A not-replayable reason names its operation first ("perturb_left_chunk(...): ");
    # counted by the cause.
    reasons = Counter(str(p.reason).split("): ", 1)[-1] for p in report.programs
                      if p.outcome == "not-replayable")
    for reason, count in reasons.most_common():
        print(f"  not replayable ({count}): {reason}")
    in_programs: dict[str, set[str]] = {}
    example: dict[str, str] = {}
    for p in report.programs:
        for gap in p.gaps:
            in_programs.setdefault(gap.gap_class, set()).add(p.scenario)
            example.setdefault(gap.gap_class, p.scenario)
    for name, count in report.classes().items():
        per_e = ", ".join(f"{label}: {row['gap_classes'].get(name, 0)}"
                         for label, row in split.items())
        print(f"  model gaps [{name}]: {count} in {len(in_programs[name])} programs"
              f"{f' ({per_e})' if per_e else ''}; e.g. {example[name]}")
    for gap in report.gaps:
        if gap.gap_class == "unexplained":
            print(f"  {gap.line()}")
    if warm_up is not None:
        print(f"warm-up (first scenario, imports vLLM): {warm_up:.1f} s")
    rest = programs - (0 if warm_up is None else 1)
    if rest and elapsed:
        print(f"throughput: {rest / elapsed:.2f} programs/s ({rest} in {elapsed:.1f} s; "
              "refused ones cost a build attempt only)")
    print(f"peak RSS: {rss_mib():.0f} MiB")
    if args.json is not None:
        data = {"what": what, "vllm_version": release, "impl": impl.name,
                "seed": args.seed, "by_extra_retained": split,
                "refused_by": [{"by": by, "reason": reason, "count": count}
                               for (by, reason), count in refused.most_common()],
                **report.to_json()}
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(data, handle, indent=1, default=str)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
