"""The catalogue scoped to given geometries (``--model`` / ``--geometry``): "does this
implementation satisfy the contract on *my* model's geometry?".

:func:`scoped_properties` returns the catalogue's properties with the same judges and
statements over other domains, so the prover, the audit, the reports and the
reproducers treat them like any other (a witness carries its whole geometry and replays
by id with :func:`kvcontract.spec.properties.replay`):

* **case families** run on the given geometries instead of their built-in catalogues
  (:meth:`CaseSpace.cases` replaced; the judges, the codec and the observation are the
  family's own, so the audit's swap of the lookup space's ``observe`` keeps working):

  - store (C8-C10): every geometry at the prompt lengths of :func:`prompt_lengths`,
    one shot and a few chunked-prefill schedules (:func:`store_schedules`), finished
    after 3 decode steps or aborted after up to 14 spread steps (:func:`abort_cuts`),
    ``offload_prompt_only`` both ways, the geometry's retention interval;
  - end to end (C12): those producers (``offload_prompt_only``) with a resend, a
    continuation and siblings sharing the prefixes of :func:`sibling_prefixes`;
  - lookup (C2-C6): every assignment is out of reach at real sizes (``W`` up to 257
    chunks), so structured ones (:func:`lookup_cases`): every chunk HIT, then a single
    MISS, HIT_PENDING or RETRY at each chunk that matters (:func:`chunks_that_matter`:
    the edges of every group's load set and window at the candidate boundaries, the
    EAGLE peek chunk, the first chunk), with local hits 0 and one chunk;
  - the scanner family (``scan``: state sequences, ``W`` in ``{1, 2, 3}``) has no
    geometry and runs as in the full catalogue.

* **formula properties** whose statements take an SWA group's sizes (C1, C2, C4: ``bs``,
  ``bpc``; the C7/C8 store masks: ``A``, ``B``, ``bpc``, EAGLE, retention) are
  restricted to the SWA groups of the given geometries: their case split becomes one
  configuration per distinct group (its ``sw`` and ``e`` fixed too), with no attempt at
  symbolic sizes, so a counterexample is one on the given geometry (C1/C2/C4 are proved
  for every size by the full catalogue). A mask property whose EAGLE flag and retention
  kind no given group has does not apply and is left out, as are all of them for
  geometries without an SWA group (:func:`scope_notes` names them); the replay
  boundaries the store path passes (``C7/replay-boundaries-exact``) are checked at the
  given geometries' alignment, retention interval and EAGLE flag, the prompt symbolic
  (:func:`_replay_configs`; left out where no SWA group has a mask);
* the scanner specification (``spec-scan-*``, no implementation and no geometry) is
  left out: the full catalogue proves it.

Case sets stay bounded and deterministic: they count cases, never seconds.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from kvcontract.spec import multigroup
from kvcontract.spec.geometry import Geometry, GroupKind, GroupSpec
from kvcontract.spec.lookup import HIT, HIT_PENDING, MISS, RETRY, LookupResult
from kvcontract.spec.properties.base import (
    CaseProperty,
    CaseSpace,
    Config,
    Family,
    FormulaProperty,
    Property,
)
from kvcontract.spec.properties.catalog import properties
from kvcontract.spec.properties.end_to_end import (
    SIBLING_DIVERGENCE,
    Consumer,
    EndToEndCase,
    producer_tokens,
)
from kvcontract.spec.properties.lookup import LookupCase
from kvcontract.spec.properties.store import StoreCase

Scope = tuple[tuple[str, Geometry], ...]
"""``(label, geometry)`` of every given geometry, in the order given."""

LONG_PROMPTS = (4096, 8192, 12288)
"""Prompts of 4k to 12k tokens, added where a geometry's chunks are large."""
LARGE_CHUNK_TOKENS = 256
"""A geometry whose largest chunk has at least this many tokens also gets
:data:`LONG_PROMPTS` (and the chunk multiples between them)."""
MAX_PROMPT = 16_384
"""No prompt of a scoped family is longer (a 12k prompt at one token per block is 768
chunks per group: milliseconds per case)."""
DECODE_STEPS = 3
FAULTS = (MISS, HIT_PENDING, RETRY)
"""The single faults of the structured lookup cases."""


# -- sizes --------------------------------------------------------------------------------
def _unit(geometry: Geometry) -> int:
    """``A``, or the largest chunk without an alignment (FA groups that disagree)."""
    align = geometry.alignment_tokens
    return int(align if align is not None
               else max(geometry.chunk_tokens(g) for g in geometry.groups))


def _window_chunks(geometry: Geometry, group: GroupSpec) -> int:
    """Chunks of ``group``'s history a boundary needs at most: ``cdiv(sw - 1 + e, tpc)``."""
    assert group.sliding_window is not None
    tpc = geometry.chunk_tokens(group)
    return int(-(-(group.sliding_window - 1 + group.extra_retained_tokens) // tpc))


def prompt_lengths(geometry: Geometry) -> tuple[int, ...]:
    """Prompt lengths around the geometry's chunk and window boundaries, ascending.

    For every group: one and two chunks; for an SWA group, the window ``sw`` and
    ``sw + e`` in tokens and the first chunk ends past the window (where history starts
    to be skipped); the alignment ``A`` times 1, 2 and 3, and the first multiple of ``A``
    past the largest window; each point -1, +0 and +1. Where the largest chunk holds
    :data:`LARGE_CHUNK_TOKENS` or more, prompts of 4k, 8k and 12k tokens and the first
    chunk multiple past each (+-1). Lengths below 2 and above :data:`MAX_PROMPT` are
    dropped.
    """
    unit = _unit(geometry)
    points: set[int] = {unit, 2 * unit, 3 * unit}
    widest = 0
    for group in geometry.groups:
        tpc = geometry.chunk_tokens(group)
        points.update((tpc, 2 * tpc))
        if group.is_swa:
            assert group.sliding_window is not None
            sw, extra = group.sliding_window, group.extra_retained_tokens
            points.update((sw, sw + extra))
            chunks = _window_chunks(geometry, group)
            points.update(((chunks + 1) * tpc, (chunks + 2) * tpc))
            widest = max(widest, sw + extra)
    if widest:
        points.add((widest // unit + 1) * unit)
    largest = max(geometry.chunk_tokens(g) for g in geometry.groups)
    if largest >= LARGE_CHUNK_TOKENS:
        for tokens in LONG_PROMPTS:
            points.update((tokens, -(-tokens // largest) * largest))
    lengths = {p + d for p in points for d in (-1, 0, 1)}
    return tuple(sorted(n for n in lengths if 2 <= n <= MAX_PROMPT))


def _odd_step(tokens: int) -> int:
    return tokens | 1


def store_schedules(geometry: Geometry, prompt: int) -> list[tuple[int, ...]]:
    """One shot; steps of ``A + tpc + 1`` tokens (frontiers between alignment
    boundaries), or a quarter of the prompt (+1, odd) when those would be more than six
    steps; steps of a multiple of ``A`` (about a third of the prompt); steps of 2048
    tokens (vLLM's default batch) for prompts of 2 to 6 such steps. Distinct ones only."""
    unit = _unit(geometry)
    smallest = min(geometry.chunk_tokens(g) for g in geometry.groups)
    unaligned = unit + smallest + 1
    if -(-prompt // unaligned) > 6:
        unaligned = _odd_step(prompt // 4 + 1)
    steps = [unaligned, max(unit, prompt // 3 // unit * unit)]
    if 2048 < prompt <= 6 * 2048:
        steps.append(2048)
    found: dict[tuple[int, ...], None] = {(prompt,): None}
    for step in steps:
        split = (step,) * (prompt // step) + ((prompt % step,) if prompt % step else ())
        found.setdefault(split, None)
    return list(found)


# -- the store family ----------------------------------------------------------------------
ABORT_CUTS = 12
"""Aborts per schedule: after every step of a short schedule, else after the first two,
the last and evenly spaced steps between (a long prompt's hundreds of steps would make
the family quadratic in the prompt)."""


def abort_cuts(num_steps: int) -> list[int]:
    """After which steps a schedule of ``num_steps`` steps is aborted (1-based counts)."""
    if num_steps - 1 <= ABORT_CUTS:
        return list(range(1, num_steps))
    spread = {round(1 + i * (num_steps - 2) / (ABORT_CUTS - 1)) for i in range(ABORT_CUTS)}
    return sorted(spread | {1, 2, num_steps - 1})


def store_cases(scope: Scope) -> Iterator[StoreCase]:
    """Per geometry and prompt (:func:`prompt_lengths`), each schedule of
    :func:`store_schedules` finished after 3 decode steps and aborted after the steps of
    :func:`abort_cuts`, with ``offload_prompt_only`` on and off."""
    for label, geometry in scope:
        for prompt in prompt_lengths(geometry):
            for prompt_only in (True, False):
                for steps in store_schedules(geometry, prompt):
                    yield StoreCase(label, geometry, prompt, steps, "finished",
                                    decode=DECODE_STEPS, prompt_only=prompt_only)
                    if not prompt_only:
                        continue  # an abort during prefill stored no decoded token either way
                    for cut in abort_cuts(len(steps)):
                        yield StoreCase(label, geometry, prompt, steps[:cut], "aborted",
                                        prompt_only=prompt_only)


# -- the end-to-end family -------------------------------------------------------------------
def e2e_prompt_lengths(geometry: Geometry) -> tuple[int, ...]:
    """The store family's prompts (the producers of C12): at most 24, evenly spaced over
    them when there are more (the smallest and the largest kept)."""
    lengths = prompt_lengths(geometry)
    return lengths if len(lengths) <= 24 else tuple(
        lengths[round(i * (len(lengths) - 1) / 23)] for i in range(24))


def _producers(label: str, geometry: Geometry, prompt: int) -> Iterator[StoreCase]:
    schedules = store_schedules(geometry, prompt)[:2]  # one shot and the first chunked one
    for steps in schedules:
        yield StoreCase(label, geometry, prompt, steps, "finished", decode=DECODE_STEPS)
        for cut in abort_cuts(len(steps)):
            yield StoreCase(label, geometry, prompt, steps[:cut], "aborted")


def sibling_prefixes(geometry: Geometry, prompt: int) -> list[int]:
    """Prefixes ``k`` a sibling shares with a producer of ``prompt`` tokens: one token
    either side of (and at) the alignment multiples 1, 2 and the two below the replay
    boundary ``(P - 1) // A * A`` and that boundary, each SWA group's window ``sw`` and
    the first chunk end past it, and ``P - 1``."""
    unit = _unit(geometry)
    replay = (prompt - 1) // unit
    points = {unit, 2 * unit, *(m * unit for m in range(max(1, replay - 2), replay + 1))}
    for group in geometry.groups:
        if group.is_swa:
            assert group.sliding_window is not None
            tpc = geometry.chunk_tokens(group)
            points.update((group.sliding_window, (_window_chunks(geometry, group) + 1) * tpc))
    shared = {p + d for p in points for d in (-1, 0, 1)} | {prompt - 1}
    return sorted(k for k in shared if 0 < k < prompt)


def end_to_end_cases(scope: Scope) -> Iterator[EndToEndCase]:
    """Producers of :func:`e2e_prompt_lengths` (one shot and the first chunked schedule
    of :func:`store_schedules`, finished or aborted after the steps of
    :func:`abort_cuts`), each with a resend, a continuation and the siblings of
    :func:`sibling_prefixes`."""
    for label, geometry in scope:
        for prompt in e2e_prompt_lengths(geometry):
            for producer in _producers(label, geometry, prompt):
                shared = producer_tokens(producer)
                consumers = [Consumer("resend", prompt, prompt),
                             Consumer("continuation", shared + SIBLING_DIVERGENCE, shared)]
                consumers += [Consumer("sibling", k + SIBLING_DIVERGENCE, k)
                              for k in sibling_prefixes(geometry, prompt)]
                for consumer in consumers:
                    yield EndToEndCase(producer, consumer)


# -- the lookup family -----------------------------------------------------------------------
def local_hits(geometry: Geometry) -> tuple[int, ...]:
    """0 and one chunk of every group (their least common multiple)."""
    return (0, math.lcm(*(geometry.chunk_tokens(g) for g in geometry.groups)))


def candidate_boundaries(geometry: Geometry, num_tokens: int, local_hit: int) -> list[int]:
    """``maxhit``, each group's chunk end at or below it and the one before, and the two
    alignment multiples at or below it (those above the local hit)."""
    top = multigroup.initial_max_hit(geometry, num_tokens)
    unit = _unit(geometry)
    found = {top, top // unit * unit, (top // unit - 1) * unit}
    for group in geometry.groups:
        tpc = geometry.chunk_tokens(group)
        found.update((top // tpc * tpc, (top // tpc - 1) * tpc))
    return sorted((b for b in found if b > local_hit), reverse=True)


def chunks_that_matter(geometry: Geometry, num_tokens: int, local_hit: int) -> list[set[int]]:
    """Per group, the chunks whose state decides a lookup near the top: at every
    candidate boundary (:func:`candidate_boundaries`), the first and last chunk the
    group reads (load set, and an EAGLE group's peek chunk), one chunk either side
    (a window that demands one more, a pending chunk just outside), and chunk 0."""
    chunks: list[set[int]] = []
    for group in geometry.groups:
        keys = multigroup.complete_chunks(geometry, group, num_tokens)
        found = {0}
        for boundary in candidate_boundaries(geometry, num_tokens, local_hit):
            lo, hi = multigroup.read_range(geometry, group, boundary, local_hit)
            found.update((lo - 1, lo, lo + 1, hi - 2, hi - 1, hi))
        chunks.append({k for k in found if 0 <= k < keys})
    return chunks


def stale_pending_pairs(geometry: Geometry, num_tokens: int,
                        local_hit: int) -> list[tuple[int, int, int]]:
    """``(group, missing chunk, pending chunk)``: in each SWA group's read range at
    ``maxhit`` and at the alignment multiple below it, the last chunk pending and the
    first (or the middle) one missing, so the window the lookup finally uses lies below
    the miss and the pending chunk outside it (seed 000's shape: a pending flag that a
    later MISS must clear, C3)."""
    pairs: dict[tuple[int, int, int], None] = {}
    for g, group in enumerate(geometry.groups):
        if not group.is_swa:
            continue
        keys = multigroup.complete_chunks(geometry, group, num_tokens)
        for boundary in candidate_boundaries(geometry, num_tokens, local_hit)[:1] + [
                b for b in candidate_boundaries(geometry, num_tokens, local_hit)
                if b % _unit(geometry) == 0][:1]:
            lo, hi = multigroup.read_range(geometry, group, boundary, local_hit)
            pending = min(hi, keys) - 1
            for missing in (lo, (lo + pending) // 2):
                if 0 <= missing < pending:
                    pairs.setdefault((g, missing, pending), None)
    return list(pairs)


def lookup_cases(scope: Scope) -> Iterator[LookupCase]:
    """Per geometry, prompt (:func:`prompt_lengths`) and local hit (:func:`local_hits`):
    every chunk HIT, then a single MISS, HIT_PENDING or RETRY at each chunk of
    :func:`chunks_that_matter` (the other chunks HIT), then the MISS/HIT_PENDING pairs
    of :func:`stale_pending_pairs`."""
    for label, geometry in scope:
        for num_tokens in prompt_lengths(geometry):
            for local_hit in local_hits(geometry):
                if local_hit >= num_tokens:
                    continue
                keys = [multigroup.complete_chunks(geometry, g, num_tokens)
                        for g in geometry.groups]
                hit_rows = tuple((HIT,) * n for n in keys)
                yield LookupCase(label, geometry, num_tokens, local_hit, hit_rows)
                matter = chunks_that_matter(geometry, num_tokens, local_hit)
                for g, chunks in enumerate(matter):
                    for k in sorted(chunks):
                        for fault in FAULTS:
                            yield LookupCase(label, geometry, num_tokens, local_hit,
                                             _with(hit_rows, g, k, fault))
                for g, missing, pending in stale_pending_pairs(geometry, num_tokens,
                                                               local_hit):
                    rows = _with(_with(hit_rows, g, missing, MISS), g, pending, HIT_PENDING)
                    yield LookupCase(label, geometry, num_tokens, local_hit, rows)


def _with(rows: tuple[tuple[LookupResult, ...], ...], g: int, k: int,
          state: LookupResult) -> tuple[tuple[LookupResult, ...], ...]:
    row = rows[g]
    return (*rows[:g], (*row[:k], state, *row[k + 1:]), *rows[g + 1:])


# -- domains in words ------------------------------------------------------------------------
def _labels(scope: Scope) -> str:
    return "; ".join(f"{label} ({geometry.describe()})" for label, geometry in scope)


def _count(cases: Iterable[Any]) -> int:
    return sum(1 for _ in cases)


def _store_domain(scope: Scope) -> str:
    prompts = sum(len(prompt_lengths(g)) for _, g in scope)
    return (f"{_count(store_cases(scope))} store schedules on {_labels(scope)}: {prompts} "
            "prompt lengths around each group's chunk, A and window boundaries (+-1; 4k-12k "
            "tokens where chunks are large), one shot, steps of A + tpc + 1 tokens (or a "
            "quarter prompt), of a multiple of A and of 2048, finished after 3 decode "
            f"steps or aborted after up to {ABORT_CUTS + 2} of the steps, offload_prompt_only "
            "on and off")


def _end_to_end_domain(scope: Scope) -> str:
    return (f"{_count(end_to_end_cases(scope))} producer/consumer pairs on {_labels(scope)}: "
            "producers at up to 24 of the store prompts (one shot and chunked steps, "
            "finished or aborted after spread steps, offload_prompt_only, replay boundary P - "
            "1); consumers: a resend, a continuation, siblings sharing kA - 1, kA, kA + 1 "
            "tokens near A, 2A and the replay boundary, sw +- 1, the chunk end past the "
            "window, and P - 1")


def _lookup_domain(scope: Scope) -> str:
    return (f"{_count(lookup_cases(scope))} structured lookup-state assignments on "
            f"{_labels(scope)} (not every assignment: W reaches hundreds of chunks): every "
            "chunk HIT, and a single MISS, HIT_PENDING or RETRY at each chunk that "
            "matters (the first and last chunk each group reads at maxhit, at its chunk "
            "ends and at the two A multiples below it, one chunk either side, the EAGLE "
            "peek chunk, chunk 0), and in each SWA group's window at maxhit and at the A "
            "multiple below it the last chunk pending with the first or middle one "
            "missing; for the store family's prompt lengths and local hits 0 and one "
            "chunk")


def _lifecycle_cases(scope: Scope) -> Iterator[Any]:
    from kvcontract.spec.properties.lifecycle import scoped_cases

    return scoped_cases(scope)


def _lifecycle_domain(scope: Scope) -> str:
    from kvcontract.spec.properties.lifecycle import scoped_domain

    return scoped_domain(scope)


SCOPED_CASES: dict[Family, tuple[Callable[[Scope], Any], Callable[[Scope], str]] | None] = {
    Family.STORE: (store_cases, _store_domain),
    Family.END_TO_END: (end_to_end_cases, _end_to_end_domain),
    Family.LOOKUP: (lookup_cases, _lookup_domain),
    Family.LIFECYCLE: (_lifecycle_cases, _lifecycle_domain),
    Family.SCAN: None,
}
"""Every family: ``(cases(scope), domain(scope))`` of its cases on the scope's
geometries, or None for a family without a geometry (run as in the full catalogue)."""


def scoped_space(space: CaseSpace[Any, Any], scope: Scope) -> CaseSpace[Any, Any]:
    """``space`` with the cases of ``scope`` instead of its catalogue (same codec, same
    observation: the judges and the audit's observation swaps still apply)."""
    scoped = SCOPED_CASES[Family(space.family)]
    assert scoped is not None, f"the {space.family} family has no geometry to scope"
    cases, domain = scoped
    text = functools.cache(lambda: domain(scope))
    return dataclasses.replace(space, cases=lambda: cases(scope), describe=text)


# -- formula properties -----------------------------------------------------------------------
_WINDOW = ("sw", "e")
"""The window variables a scoped formula property fixes to the group's values."""


def _swa_groups(scope: Scope) -> list[tuple[str, Geometry, GroupSpec]]:
    return [(label, geometry, group) for label, geometry in scope for group in geometry.groups
            if group.kind is GroupKind.SLIDING_WINDOW]


def _size_configs(prop: FormulaProperty, scope: Scope) -> list[Config]:
    """C1/C2/C4: one configuration per distinct (``bs``, ``bpc``, ``sw``, ``e``)."""
    keys = set(prop.configs()[0].values)
    configs: dict[tuple[tuple[str, int], ...], list[str]] = {}
    for label, geometry, group in _swa_groups(scope):
        assert group.sliding_window is not None
        values = {"bs": geometry.block_tokens(group), "bpc": geometry.blocks_per_chunk,
                  "sw": group.sliding_window, "e": group.extra_retained_tokens}
        key = tuple((k, v) for k, v in values.items() if k in keys or k in _WINDOW)
        configs.setdefault(key, []).append(label)
    return [Config(", ".join(f"{k}={v}" for k, v in key) + f" ({', '.join(labels)})",
                   dict(key)) for key, labels in configs.items()]


def _mask_kind(values: dict[str, int] | Any) -> tuple[int, str]:
    retention = values["R"]
    return int(values["eagle"]), ("none" if retention < 0 else "zero" if retention == 0
                                  else "interval")


def _mask_configs(prop: FormulaProperty, scope: Scope) -> list[Config]:
    """C7/C8 masks: one configuration per distinct SWA group of the prop's EAGLE flag and
    retention kind whose store mask applies (``A`` a multiple of the SWA block), split by
    the boundary residue where the full catalogue splits it."""
    originals = prop.configs()
    kind = _mask_kind(originals[0].values)
    residues = "L" in originals[0].values
    configs: dict[tuple[tuple[str, int], ...], list[str]] = {}
    for label, geometry, group in _swa_groups(scope):
        align = geometry.alignment_tokens
        block = geometry.block_tokens(group)
        if align is None or align % block:
            continue  # store-all geometry: no mask to reason about
        retention = -1 if geometry.retention_interval is None else geometry.retention_interval
        assert group.sliding_window is not None
        values = {"A": align, "B": block, "bpc": geometry.blocks_per_chunk,
                  "eagle": int(geometry.drops_eagle_block(group)), "R": retention,
                  "sw": group.sliding_window, "e": group.extra_retained_tokens}
        if _mask_kind(values) != kind:
            continue
        configs.setdefault(tuple(values.items()), []).append(label)
    split = []
    for key, labels in configs.items():
        values = dict(key)
        label = (f"A={values['A']}, B={values['B']}, bpc={values['bpc']}, "
                 f"eagle={bool(values['eagle'])}, R={values['R']}, sw={values['sw']}, "
                 f"e={values['e']} ({', '.join(labels)})")
        if not residues:
            split.append(Config(label, values))
            continue
        step = values["A"] if "r" in prop.variables or values["R"] < 0 else values["R"]
        tpc = values["B"] * values["bpc"]
        period = tpc // math.gcd(step, tpc) if step > 0 else 1
        split += [Config(f"{label}, index = {period}q+{j}", {**values, "L": period, "j": j})
                  for j in range(period)]
    return split


def _replay_configs(prop: FormulaProperty, scope: Scope) -> list[Config]:
    """The store path's replay boundaries (``C7/replay-boundaries-exact``, configurations
    ``Ak``/``Rk``): one configuration per distinct (EAGLE, ``A``, retention) of the
    geometries with an SWA group whose mask applies (the boundaries matter to no other
    group), ``A`` and the interval fixed; the prompt and the boundary stay symbolic."""
    configs: dict[tuple[tuple[str, int], ...], list[str]] = {}
    for label, geometry in scope:
        align = geometry.alignment_tokens
        if align is None or not any(
                group.kind is GroupKind.SLIDING_WINDOW and align % geometry.block_tokens(group)
                == 0 for group in geometry.groups):
            continue
        retention = geometry.retention_interval
        values = {"eagle": int(any(geometry.drops_eagle_block(group)
                                   for group in geometry.groups)), "Ak": 1,
                  "A": align, "Rk": -1 if retention is None else min(retention, 1),
                  "R": retention or 0}
        configs.setdefault(tuple(values.items()), []).append(label)
    return [Config(f"A={dict(key)['A']}, eagle={bool(dict(key)['eagle'])}, "
                   f"R={dict(key)['R'] if dict(key)['Rk'] >= 0 else None} "
                   f"({', '.join(labels)})", dict(key)) for key, labels in configs.items()]


def scoped_formula(prop: FormulaProperty, scope: Scope) -> FormulaProperty | None:
    """``prop`` restricted to the SWA groups of ``scope`` (sizes, ``sw`` and ``e`` fixed;
    no symbolic sizes), or None when no given group has its shape; the replay boundaries
    the store path passes to the geometries' alignment, retention and EAGLE. A property
    that takes no window is returned unchanged."""
    if "Ak" in prop.configs()[0].values:
        configs = _replay_configs(prop, scope)
        if not configs:
            return None
        labels = "; ".join(c.label for c in configs)
        return dataclasses.replace(
            prop, variables=tuple(v for v in prop.variables if v not in ("A", "R")),
            configs=lambda: list(configs), symbolic_sizes=(),
            domain=f"the alignment, retention and EAGLE of the given geometries: {labels}",
        )
    if prop.group_kind is not None:
        return _kind_scoped(prop, scope, prop.group_kind)
    if not set(_WINDOW) <= set(prop.variables):
        return prop
    sample = prop.configs()[0].values
    configs = _mask_configs(prop, scope) if "A" in sample else _size_configs(prop, scope)
    if not configs:
        return None
    labels = "; ".join(c.label for c in configs)
    return dataclasses.replace(
        prop, variables=tuple(v for v in prop.variables if v not in _WINDOW),
        configs=lambda: list(configs), symbolic_sizes=(),
        domain=f"the SWA groups of the given geometries: {labels}",
    )


def _kind_scoped(prop: FormulaProperty, scope: Scope, kind: GroupKind
                 ) -> FormulaProperty | None:
    """A property of one kind of group on the given geometries' groups of that kind: one
    configuration per distinct (``bs``, ``bpc``), None when no group has that kind."""
    configs: dict[tuple[int, int], list[str]] = {}
    for label, geometry in scope:
        for group in geometry.groups:
            if group.kind is kind:
                key = (geometry.block_tokens(group), geometry.blocks_per_chunk)
                configs.setdefault(key, []).append(label)
    if not configs:
        return None
    chosen = [Config(f"bs={bs}, bpc={bpc} ({', '.join(labels)})", {"bs": bs, "bpc": bpc})
              for (bs, bpc), labels in configs.items()]
    labels = "; ".join(c.label for c in chosen)
    return dataclasses.replace(prop, configs=lambda: list(chosen), symbolic_sizes=(),
                               domain=f"the {kind.value} groups of the given geometries: "
                                      f"{labels}")


# -- the scoped catalogue ------------------------------------------------------------------------
def _scoped(scope: Scope) -> tuple[tuple[Property, ...], tuple[str, ...]]:
    kept: list[Property] = []
    spaces: dict[int, CaseSpace[Any, Any]] = {}
    dropped: list[str] = []
    spec_only: list[str] = []
    for prop in properties():
        if isinstance(prop, CaseProperty):
            if SCOPED_CASES.get(Family(prop.space.family)) is None:
                kept.append(prop)
                continue
            space = spaces.setdefault(id(prop.space), scoped_space(prop.space, scope))
            kept.append(dataclasses.replace(prop, space=space))
        elif prop.name.startswith("spec-"):
            spec_only.append(prop.theorem_id)
        else:
            scoped = scoped_formula(prop, scope)
            if scoped is None:
                dropped.append(prop.theorem_id)
            else:
                kept.append(scoped)
    notes = []
    if spec_only:
        notes.append("left out (the scanner spec, no implementation and no geometry; the "
                     f"full catalogue proves it): {', '.join(spec_only)}")
    if dropped:
        notes.append("not applicable (no SWA group of the given geometries has that shape: "
                     f"EAGLE flag, retention kind, a store mask): {', '.join(dropped)}")
    notes.append("as in the full catalogue (no geometry): the "
                 f"{', '.join(f.value for f, cases in SCOPED_CASES.items() if cases is None)} "
                 "family (state sequences up to 6 keys, W in {1, 2, 3})")
    return tuple(kept), tuple(notes)


@functools.cache
def _scoped_cached(scope: Scope) -> tuple[tuple[Property, ...], tuple[str, ...]]:
    return _scoped(scope)


def _check(scope: Sequence[tuple[str, Geometry]]) -> Scope:
    frozen = tuple((str(label), geometry) for label, geometry in scope)
    if not frozen:
        raise ValueError("a scope needs at least one geometry")
    return frozen


def scoped_properties(scope: Sequence[tuple[str, Geometry]]) -> tuple[Property, ...]:
    """The catalogue on the geometries of ``scope`` (``(label, geometry)`` pairs), in
    clause order (see the module docstring). Built once per scope and process."""
    return _scoped_cached(_check(scope))[0]


def scope_notes(scope: Sequence[tuple[str, Geometry]]) -> list[str]:
    """What a scoped run leaves out or runs as in the full catalogue, in words."""
    return list(_scoped_cached(_check(scope))[1])


def describe_scope(scope: Sequence[tuple[str, Geometry]]) -> list[dict[str, Any]]:
    """Each geometry of a scoped run, for reports: its label, the geometry
    (``Geometry.to_dict``), the model preset it came from (or None), and whether vLLM
    0.33.0's planning can build it (``spec.build.buildable``) with the reason."""
    from kvcontract.spec.build import buildable

    described = []
    for label, geometry in scope:
        ok, reason = buildable(geometry)
        described.append({"label": str(label), "geometry": geometry.to_dict(),
                          "preset": geometry.extra.get("preset"), "buildable": ok,
                          "reason": reason})
    return described
