"""Measure the mutation score of an implementation (the reference by default).

Usage: python benchmarks/mutation_score.py [--impl reference] [--sample N --seed S]
       [--jobs N] [--no-fuzz] [--json FILE] [--shard I/N]

Prints the score over every mutant (or the seeded sample), the time per mutant, the
counts per operator and per status, and every surviving mutant with the clauses that
should have caught it. Figures only: nothing is asserted (timings depend on the
machine; the statuses do not, see docs/MUTANTS.md).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

from kvcontract.proofs.shards import parse_shard
from kvcontract.tools.mutate.campaign import STATUSES, MutantResult, run_campaign


def _progress(result: MutantResult, done: int, total: int) -> None:
    print(f"  [{done:>3}/{total}] {result.status:<10} {result.seconds:6.1f}s  "
          f"{result.point.location}  {result.point.operator}  {result.point.function}",
          flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--impl", default="reference")
    parser.add_argument("--sample", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=None)
    parser.add_argument("--no-fuzz", action="store_true")
    parser.add_argument("--json", default=None, help="also write the campaign's report")
    parser.add_argument("--quiet", action="store_true", help="no line per mutant")
    parser.add_argument("--shard", default=None, metavar="I/N",
                        help="only shard I of N (join the --json reports with kvcontract "
                             "merge)")
    args = parser.parse_args()
    started = time.perf_counter()
    report = run_campaign(args.impl, sample=args.sample, seed=args.seed, jobs=args.jobs,
                          fuzz=not args.no_fuzz,
                          on_result=None if args.quiet else _progress,
                          shard=parse_shard(args.shard))
    wall = time.perf_counter() - started
    mutants = report.mutants
    child = [m.seconds for m in mutants]
    score = report.score
    print()
    print(f"{report.target}: {len(mutants)} of {report.total_points} mutants "
          f"(sample {args.sample}, seed {args.seed}"
          + (f", shard {args.shard}" if args.shard else "") + f"), {report.jobs} jobs, "
          f"{os.cpu_count()} cores, fuzz {'on' if report.fuzz else 'off'}")
    print(f"mutation score: {'n/a' if score is None else f'{100 * score:.1f}%'} "
          f"(killed {report.killed} / (killed {report.killed} + survived {report.survived}))")
    print(f"wall {wall:.1f}s (baseline {report.baseline.seconds:.1f}s); "
          f"{wall / max(1, len(mutants)):.2f}s wall per mutant; child process per mutant: "
          f"mean {statistics.mean(child) if child else 0:.2f}s, "
          f"median {statistics.median(child) if child else 0:.2f}s, "
          f"max {max(child, default=0):.2f}s")
    print("per status: " + ", ".join(f"{s} {n}" for s, n in report.by_status().items()))
    print(f"{'operator':<14}" + "".join(f"{s:>11}" for s in STATUSES) + f"{'mean s':>9}")
    for op, counts in report.by_operator().items():
        own = [m.seconds for m in mutants if m.point.operator == op]
        print(f"{op:<14}" + "".join(f"{counts[s]:>11}" for s in STATUSES)
              + f"{statistics.mean(own):>9.2f}")
    killers: dict[str, int] = {}
    for m in mutants:
        if m.status == "killed":
            by = m.killed_by or {}
            key = str(by.get("theorem") or (f"fuzz {by.get('clause', '')}"
                                            if m.reason == "fuzz" else m.reason))
            killers[key] = killers.get(key, 0) + 1
    print("killed by: " + ", ".join(f"{k} {n}" for k, n in sorted(killers.items(),
                                                                    key=lambda kv: -kv[1])))
    for status in ("survived", "equivalent", "timeout"):
        own = [m for m in mutants if m.status == status]
        if not own:
            continue
        print(f"\n{status}:")
        for m in own:
            p = m.point
            print(f"  {p.location}  {p.function}  [{p.operator}]")
            print(f"      {p.before}")
            print(f"   -> {p.after}")
            eq = m.equivalence or {}
            if status == "survived":
                print(f"      should be caught by: {', '.join(m.judges.clauses)}"
                      + ("" if m.judges.mapped else " (unsure: no property reaches it)"))
                if eq.get("distinguishing_input"):
                    print(f"      differs from the original at {eq['distinguishing_input']}")
                elif eq.get("detail"):
                    print(f"      equivalence: {eq['detail']}")
            elif status == "equivalent":
                print(f"      {eq.get('method')}: {eq.get('detail')}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(report.to_json(), f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    main()
