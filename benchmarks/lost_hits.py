"""Lost hits per model preset (C12): how often a resend consumer gets less than promised.

Usage: python benchmarks/lost_hits.py [--impl reference --impl upstream-current]
       [--preset NAME ...] [--lengths N] [--first 4096] [--last 12000]

For every preset geometry (``spec/models.py``: ``preset_geometries``, bpc 1, 4, 16), every
retention interval (0, vLLM's default; None; 32 x the scheduler block size, the LCM of
the block sizes) and every implementation, a producer prefills each prompt length in one
shot, decodes 3 tokens and finishes; the consumer resends the prompt. Columns:

* ``lost``: share of the prompt lengths whose accepted hit is below the C12 promise
  (``spec/properties/end_to_end.promised_hit``, the contract's ``store`` replay rule);
* ``accepted`` / ``promised``: mean accepted hit and mean promised hit, in tokens;
* ``gpu`` / ``lost(gpu)``: the mean promise and the share of lengths losing hits when the
  producer is also owed the EAGLE replay boundaries vLLM's GPU prefix cache retains
  (``replay_rule="gpu"``): what the store contract leaves out, not a C12 verdict.

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
    Consumer,
    EndToEndCase,
    promised_hit,
    run_end_to_end,
)
from kvcontract.spec.properties.store import StoreCase

RETENTIONS: tuple[str, ...] = ("0", "None", "32xbs")


def retention_value(geometry: Geometry, label: str) -> int | None:
    if label == "None":
        return None
    if label == "0":
        return 0
    scheduler_block = math.lcm(*(geometry.block_tokens(g) for g in geometry.groups))
    return 32 * scheduler_block


def prompt_lengths(first: int, last: int, count: int) -> list[int]:
    """``count`` lengths spread over ``[first, last]`` by an odd step, so that their
    residues modulo every chunk and alignment vary."""
    step = max(1, (last - first) // max(1, count - 1))
    step += 1 - step % 2
    return [first + i * step for i in range(count) if first + i * step <= last]


def measure(label: str, geometry: Geometry, impl: Implementation,
            lengths: list[int]) -> dict[str, float] | str:
    """One row: the numbers, or why the row was skipped."""
    lost = lost_gpu = 0
    accepted_sum = promised_sum = gpu_sum = 0
    for prompt in lengths:
        producer = StoreCase(label, geometry, prompt, (prompt,), "finished", decode=3)
        case = EndToEndCase(producer, Consumer("resend", prompt, prompt))
        try:
            observation = run_end_to_end(case, impl)
        except Exception as exc:  # an implementation failure is a reason to print
            return f"{impl.name} fails at P={prompt}: {type(exc).__name__}: {exc}"
        if observation.error is not None or observation.hit_tokens is None:
            return (f"{impl.name} gives no hit at P={prompt}: "
                    f"{observation.error or 'deferred'}")
        hit = observation.hit_tokens
        promised = promised_hit(geometry, producer, prompt, prompt)
        gpu = promised_hit(geometry, producer, prompt, prompt, replay_rule="gpu")
        lost += hit < promised
        lost_gpu += hit < gpu
        accepted_sum += hit
        promised_sum += promised
        gpu_sum += gpu
    n = len(lengths)
    return {"lost": lost / n, "accepted": accepted_sum / n, "promised": promised_sum / n,
            "gpu": gpu_sum / n, "lost_gpu": lost_gpu / n}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--impl", action="append", default=None,
                        help="implementation (repeatable; default reference, upstream-current)")
    parser.add_argument("--preset", action="append", default=None,
                        help="model preset (repeatable; default every preset)")
    parser.add_argument("--lengths", type=int, default=83)
    parser.add_argument("--first", type=int, default=4096)
    parser.add_argument("--last", type=int, default=12000)
    args = parser.parse_args()
    impls = [get_implementation(n) for n in (args.impl or ["reference", "upstream-current"])]
    lengths = prompt_lengths(args.first, args.last, args.lengths)
    print(f"resend consumers of {len(lengths)} prompt lengths in [{lengths[0]}, {lengths[-1]}] "
          "(one-shot prefill, 3 decode steps, finished)")
    header = (f"{'geometry':28} {'retention':>9} {'implementation':17} {'lost':>6} "
              f"{'accepted':>9} {'promised':>9} {'gpu':>9} {'lost(gpu)':>9}")
    print(header)
    print("-" * len(header))
    started = time.perf_counter()
    for preset in args.preset or list_presets():
        for label, base in preset_geometries(preset):
            for retention in RETENTIONS:
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
                          f"{row['accepted']:9.0f} {row['promised']:9.0f} {row['gpu']:9.0f} "
                          f"{row['lost_gpu']:9.1%}")
    print(f"({time.perf_counter() - started:.1f} s)")


if __name__ == "__main__":
    main()
