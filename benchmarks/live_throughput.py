"""Live backend throughput: scenarios per second on vLLM's own scheduler, and memory.

Usage: python benchmarks/live_throughput.py [--cases N] [--lifecycle] [--preset NAME]

Three measurements (each after one warm-up run, so the one-off cost of importing vLLM
and inspecting the tiny model config is reported apart):

* small end-to-end cases (the end-to-end catalogue's quick slice: a producer, a GPU
  prefix-cache reset, a consumer), ``--cases`` of them;
* the named lifecycle scenarios (``--lifecycle``);
* large resends on a preset (``--preset``, Command R7B by default: a 4500-token prompt).

Peak memory is the process's maximum resident set (``ru_maxrss``) and the Python heap's
peak over five of the cases (``tracemalloc``, run apart from the timing). Needs vLLM
(``.ci/install-live``); nothing here asserts on timing.
"""

from __future__ import annotations

import argparse
import itertools
import time
import tracemalloc

from _live import live_backend_missing, rss_mib


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=60)
    parser.add_argument("--lifecycle", action="store_true")
    parser.add_argument("--preset", default="command-r7b")
    args = parser.parse_args(argv)

    start = time.perf_counter()
    if live_backend_missing():
        return 3
    from kvcontract.live.confirm import confirm, confirm_case
    from kvcontract.spec.models import get_preset
    from kvcontract.spec.properties.end_to_end import (
        EndToEndCase,
        consumers,
        end_to_end_catalog,
        producers,
    )

    cases = []
    for name, geometry, prompts in itertools.cycle(end_to_end_catalog()):
        if len(cases) >= args.cases:
            break
        if any(g.extra_retained_tokens for g in geometry.groups):
            continue
        producer = next(iter(producers(name, geometry, prompts[:1])))
        # Junction consumers need a third request (docs/CONTRACT.md 9.3): not this trace.
        cases += [EndToEndCase(producer, c) for c in consumers(producer)
                  if c.kind != "junction"][:4]
    cases = cases[: args.cases]
    confirm_case(cases[0], keep_observation=False)
    warm = time.perf_counter() - start
    print(f"warm-up (imports, model config, first engine): {warm:.1f} s, "
          f"max RSS {rss_mib():.0f} MiB")

    start = time.perf_counter()
    verdicts: dict[str, int] = {}
    for case in cases:
        verdict = confirm_case(case, keep_observation=False).verdict
        verdicts[verdict] = verdicts.get(verdict, 0) + 1
    seconds = time.perf_counter() - start
    tracemalloc.start()  # apart: tracing slows the cases down several times
    for case in cases[:5]:
        confirm_case(case, keep_observation=False)
    _, heap = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    print(f"small end-to-end cases: {len(cases)} in {seconds:.2f} s = "
          f"{len(cases) / seconds:.1f} scenarios/s ({verdicts}); Python heap peak "
          f"{heap / 2**20:.1f} MiB; max RSS {rss_mib():.0f} MiB")

    if args.lifecycle:
        from kvcontract.live.scenarios import LIFECYCLE, run_scenario

        start = time.perf_counter()
        ok = sum(run_scenario(name).ok for name in LIFECYCLE)
        seconds = time.perf_counter() - start
        print(f"lifecycle scenarios: {len(LIFECYCLE)} in {seconds:.2f} s = "
              f"{len(LIFECYCLE) / seconds:.1f} scenarios/s ({ok} with every check "
              f"holding); max RSS {rss_mib():.0f} MiB")

    geometry = get_preset(args.preset).geometry(1)
    start = time.perf_counter()
    runs = 3
    results = [confirm(geometry, 4500 + 100 * i, "resend") for i in range(runs)]
    seconds = time.perf_counter() - start
    print(f"{args.preset} resends of 4500-4700 tokens: {runs} in {seconds:.2f} s = "
          f"{runs / seconds:.2f} scenarios/s (verdicts "
          f"{sorted({r.verdict for r in results})}); max RSS {rss_mib():.0f} MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
