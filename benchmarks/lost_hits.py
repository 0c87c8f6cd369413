"""Lost hits per model preset (C12): how often a resend consumer gets less than promised.

Usage: python benchmarks/lost_hits.py [--impl reference --impl upstream-current
       --impl vllm:~/.cache/kvcontract/vllm/0.33.0]
       [--preset NAME ...] [--retention 0 ...] [--lengths N] [--first 4096]
       [--last 12000]

For every preset geometry (``spec/models.py``: ``preset_geometries``, bpc 1, 4, 16), every
retention interval (0, vLLM's default; None; 32 x the scheduler block size, the LCM of
the block sizes) and every implementation, a producer prefills each prompt length in one
shot, decodes 3 tokens and finishes; the consumer resends the prompt. Columns:

* ``lost``: share of the prompt lengths whose accepted hit is below the C12 promise
  (``spec/properties/end_to_end.promised_hit``: vLLM's GPU replay rule, ``P - 1`` plus,
  with an EAGLE group, the EAGLE replay boundaries; in whole scheduler blocks,
  ``gpu_hit_unit``: what vLLM's GPU prefix cache itself would serve);
* ``accepted`` / ``promised``: mean accepted hit and mean promised hit, in tokens;
* ``p-1`` / ``lost(p-1)``: the mean promise and the share of lengths losing hits when the
  producer is owed the replay boundary ``P - 1`` alone (``replay_rule="p-1"``, upstream's
  store path): what the EAGLE boundaries add, not a C12 verdict.

A geometry vLLM cannot build with a retention interval, or one an implementation fails
on, is skipped with its reason printed. Nothing here asserts on timing.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import time

from kvcontract.errors import KvContractError
from kvcontract.impl.bundle import Implementation
from kvcontract.impl.variants import get_implementation
from kvcontract.spec.build import buildable
from kvcontract.spec.geometry import Geometry
from kvcontract.spec.models import list_presets, preset_geometries
from kvcontract.spec.properties.end_to_end import (
    prompt_lengths,
    resend_case,
    resend_point,
    resend_promises,
)

RETENTIONS: tuple[str, ...] = ("0", "None", "32xbs")


def retention_value(geometry: Geometry, label: str) -> int | None:
    if label == "None":
        return None
    if label == "0":
        return 0
    scheduler_block = math.lcm(*(geometry.block_tokens(g) for g in geometry.groups))
    return 32 * scheduler_block


def implementation(name: str) -> Implementation:
    """A registered implementation, or a vLLM release as an audit target
    (``vllm:PATH``: an unpacked wheel or a checkout, its functions bound by
    ``kvcontract audit``'s binder; the store path and the lookup loop are kvcontract's,
    over the release's primitives and its ``P - 1`` replay boundary)."""
    if ":" not in name:
        return get_implementation(name)
    from kvcontract.tools.audit.binding import bind
    from kvcontract.tools.audit.targets import resolve_target

    bound = bind(resolve_target(name)).implementation
    if bound is None:
        raise SystemExit(f"{name}: the release's functions could not be bound")
    return dataclasses.replace(bound, name=name.rsplit("/", 1)[-1] or name)


def measure(label: str, geometry: Geometry, impl: Implementation,
            lengths: list[int]) -> dict[str, float] | str:
    """One row: the numbers, or why the row was skipped."""
    lost = lost_p1 = 0
    accepted_sum = promised_sum = p1_sum = 0
    for prompt in lengths:
        case = resend_case(label, geometry, prompt)
        try:
            point = resend_point(case, impl)
        except Exception as exc:  # an implementation failure is a reason to print
            return f"{impl.name} fails at P={prompt}: {type(exc).__name__}: {exc}"
        if point.error is not None or point.hit is None:
            return (f"{impl.name} gives no hit at P={prompt}: "
                    f"{point.error or 'deferred'}")
        hit = point.hit
        # C12's measure: what vLLM's GPU prefix cache would serve (whole scheduler
        # blocks); the offload may accept more (an unaligned boundary), never less.
        promised, p1 = resend_promises(case)
        lost += hit < promised
        lost_p1 += hit < p1
        accepted_sum += hit
        promised_sum += promised
        p1_sum += p1
    n = len(lengths)
    return {"lost": lost / n, "accepted": accepted_sum / n, "promised": promised_sum / n,
            "p1": p1_sum / n, "lost_p1": lost_p1 / n}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--impl", action="append", default=None,
                        help="implementation (repeatable; default reference, upstream-current), "
                             "or a release as vllm:PATH (an unpacked wheel or a checkout)")
    parser.add_argument("--preset", action="append", default=None,
                        help="model preset (repeatable; default every preset)")
    parser.add_argument("--retention", action="append", default=None, choices=RETENTIONS,
                        help="retention interval (repeatable; default every one)")
    parser.add_argument("--lengths", type=int, default=83)
    parser.add_argument("--first", type=int, default=4096)
    parser.add_argument("--last", type=int, default=12000)
    args = parser.parse_args()
    impls = [implementation(n) for n in (args.impl or ["reference", "upstream-current"])]
    lengths = prompt_lengths(args.first, args.last, args.lengths)
    print(f"resend consumers of {len(lengths)} prompt lengths in [{lengths[0]}, {lengths[-1]}] "
          "(one-shot prefill, 3 decode steps, finished)")
    header = (f"{'geometry':28} {'retention':>9} {'implementation':17} {'lost':>6} "
              f"{'accepted':>9} {'promised':>9} {'p-1':>9} {'lost(p-1)':>9}")
    print(header)
    print("-" * len(header))
    started = time.perf_counter()
    for preset in args.preset or list_presets():
        for label, base in preset_geometries(preset):
            for retention in args.retention or RETENTIONS:
                try:
                    geometry = dataclasses.replace(
                        base, retention_interval=retention_value(base, retention))
                    ok, reason = buildable(geometry)
                except KvContractError as exc:
                    ok, reason = False, str(exc)
                if not ok:
                    print(f"{label:28} {retention:>9} skipped: {reason}")
                    continue
                for impl in impls:
                    row = measure(label, geometry, impl, lengths)
                    if isinstance(row, str):
                        print(f"{label:28} {retention:>9} {impl.name:17} skipped: {row}")
                        continue
                    print(f"{label:28} {retention:>9} {impl.name:17} {row['lost']:6.1%} "
                          f"{row['accepted']:9.0f} {row['promised']:9.0f} {row['p1']:9.0f} "
                          f"{row['lost_p1']:9.1%}")
    print(f"({time.perf_counter() - started:.1f} s)")


if __name__ == "__main__":
    main()
