"""What a defect costs on the model presets, in the user's units (issue 19).

A defect is what ``bound`` (the audited code adapted to an
:class:`~kvcontract.impl.bundle.Implementation`) does worse than ``patched`` (the same
code with the defect's root-cause functions replaced by the reference's): measured
against ``patched``, never against the reference, so the other defects of the same
release are not counted in this one.

Every number comes from the same scenarios, on every geometry of the model presets
(:func:`~kvcontract.spec.models.preset_geometries`: ``bpc`` 1, 4 and 16) at one
retention interval (vLLM's default 0 unless told), the geometries vLLM cannot build
left out with the reason (:func:`~kvcontract.spec.build.buildable`):

* ``lost-hit``: a producer prefills each prompt length in one shot, decodes 3 tokens
  and finishes; a consumer resends the prompt (the resend of ``benchmarks/lost_hits.py``:
  :func:`~kvcontract.spec.properties.end_to_end.resend_case`). Per geometry: the share of
  prompts whose accepted hit is below the patched one, the tokens lost, the hits and the
  spec's promise;
* ``waste``: the same producers, and the same prompts prefilled in steps of
  :data:`PREFILL_STEP` tokens (a chunked prefill: the intermediate frontiers are where
  a store path can write tails nobody reads); per request the chunks the bound store
  path offers that the patched one does not, in chunks, blocks and (where the preset
  gives page sizes) bytes;
* ``delay``: a resend that arrives while the chunked producer's last store is still in
  flight (its last offered chunks ``HIT_PENDING``, the earlier ones ``HIT``): the share
  of requests the bound lookup defers and the patched one serves. A C3 witness is read
  by :func:`delay_of`: which pending store the request waits on;
* ``crash``: the resend, and how often the bound lookup's hit reads a chunk that is not
  stored (or the lookup does not converge) where the patched one does not; a finding's
  message is read by :func:`crash_of_row`.

Budgets count cases (geometries, prompt lengths), never seconds: the result depends
only on the arguments and the code. With the defaults (all 36 preset geometries, 24
lengths) a lost-hit cost takes 3-6 s of CPU for kvcontract's variants and 9-16 s for
vLLM 0.33.0's bound functions (which are memoized once for both sides; the producer's
run is shared when the store path is the same).
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kvcontract.errors import KvContractError, UsageError
from kvcontract.impl.bundle import Implementation
from kvcontract.impl.scheduler import ConvergenceError, lookup_complete_chunks
from kvcontract.spec.build import buildable
from kvcontract.spec.geometry import Geometry, GroupKind
from kvcontract.spec.lookup import HIT, HIT_PENDING, MISS, LookupResult
from kvcontract.spec.models import get_preset, list_presets, preset_geometries
from kvcontract.spec.properties.end_to_end import (
    EndToEndCase,
    ResendPoint,
    consumer_keys,
    prompt_lengths,
    resend_case,
    resend_point,
    resend_promises,
)
from kvcontract.spec.properties.lookup import (
    LookupCase,
    contract_answer,
    crash_of,
    run_lookup,
)
from kvcontract.spec.properties.store import (
    StoreCase,
    StoreRun,
    offered_chunks,
    simulate_store_case,
)
from kvcontract.vocabulary import Impact

DEFAULT_LENGTHS = 24
"""Prompt lengths per geometry by default: enough residues modulo every chunk and
alignment of the presets to see a defect that needs one (the window formula's
``sw = 1 (mod tpc)``, an EAGLE boundary inside a chunk), few enough for the default
audit (about 1,700 end-to-end runs over every preset)."""

FIRST_PROMPT, LAST_PROMPT = 4096, 12000
"""The prompt lengths spread over ``[FIRST_PROMPT, LAST_PROMPT]``, as in
``benchmarks/lost_hits.py`` (past the longest preset window, 4097 tokens)."""

PREFILL_STEP = 2048
"""Tokens per step of the chunked-prefill producers (waste, delay): vLLM's
``max_num_batched_tokens`` for a small GPU budget, so a 4k-12k prompt has 2-6
intermediate frontiers."""

SUMMARY_WIDTH = 70
"""The summary line is the shortest form that fits this many characters."""


@dataclass(frozen=True)
class CostBudget:
    """Caps, in cases: the geometries measured (in preset order, ``bpc`` 1, 4, 16) and
    the prompt lengths per geometry. None: no cap."""

    max_geometries: int | None = None
    max_lengths: int | None = None

    def __post_init__(self) -> None:
        for name in ("max_geometries", "max_lengths"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or value < 1):
                raise UsageError(f"CostBudget.{name} must be None or an integer >= 1, "
                                 f"not {value!r}")


@dataclass(frozen=True)
class _Target:
    preset: str
    label: str
    geometry: Geometry
    hash_mode: str = "default"
    """``default`` (the preset's only mode on the release measured), ``lookahead``
    (vLLM's default where the preset records lookahead block hashes and the release has
    them) or ``legacy`` (that preset as stated: legacy hashes, docs/CONTRACT.md 2.1)."""


def _retention_label(retention: int | None) -> str:
    return "None" if retention is None else str(retention)


def _default_mode_first(name: str, lookahead_hashes: bool,
                        ) -> list[tuple[str, Geometry, str]]:
    """A preset's geometries in vLLM's default block-hash mode first (docs/CONTRACT.md
    2.1: lookahead hashes where the preset records them and the release measured has
    them, ``lookahead_hashes``), then as the preset states them (legacy hashes), so a
    finding's cost reads in the configuration users run first; with the mode of each."""
    preset = get_preset(name)
    stated = preset_geometries(name)
    if not (preset.lookahead_block_hashes and lookahead_hashes):
        return [(label, geometry, "default") for label, geometry in stated]
    default = []
    for label, base in stated:
        geometry = preset.geometry(blocks_per_chunk=base.blocks_per_chunk,
                                   lookahead_block_hashes=True)
        default.append((f"{label} lookahead hashes (vLLM's default)", geometry, "lookahead"))
    return default + [(label, geometry, "legacy") for label, geometry in stated]


def _targets(presets: Sequence[str] | None, retention: int | None,
             budget: CostBudget, lookahead_hashes: bool = True,
             ) -> tuple[list[_Target], list[str], list[str]]:
    """The geometries to measure, the reasons of those left out, the presets named."""
    names = list(presets) if presets is not None else list_presets()
    for name in names:
        get_preset(name)  # an unknown name is a UsageError listing the known ones
    targets: list[_Target] = []
    skipped: list[str] = []
    for name in names:
        for label, base, mode in _default_mode_first(name, lookahead_hashes):
            try:
                geometry = dataclasses.replace(base, retention_interval=retention)
                ok, reason = buildable(geometry)
            except KvContractError as exc:
                ok, reason = False, str(exc)
            if not ok:
                skipped.append(f"{label} retention={_retention_label(retention)}: {reason}")
                continue
            targets.append(_Target(name, label, geometry, mode))
    cap = budget.max_geometries
    if cap is not None and len(targets) > cap:
        left = targets[cap:]
        skipped.append(f"budget: {len(left)} geometries not measured (max_geometries={cap}): "
                       + ", ".join(t.label for t in left))
        targets = targets[:cap]
    return targets, skipped, names


def _row_head(target: _Target, retention: int | None, count: int) -> dict[str, Any]:
    return {"preset": target.preset, "geometry": target.label,
            "bpc": target.geometry.blocks_per_chunk, "retention": retention,
            "prompts": count, "hash_mode": target.hash_mode}


STORE_PATH_FIELDS = (
    "get_num_offloadable_tokens", "store_step_bounds", "store_final_segment_end",
    "store_chunk_offered", "store_replay_boundaries", "is_block_reachable",
    "retained_block_range",
)
"""The bundle functions the producer's store path calls (``impl.scheduler.StoreTracker``
and the first live block of ``group_first_live_block``): when bound and patched share
them all, the producer's run is the same and is computed once."""


StoreRunner = Callable[[StoreCase], StoreRun]
"""A producer's store path run as a whole (upstream's executed ``_build_store_jobs``:
``tools/audit/store.make_store_runner``) instead of kvcontract's over the bundle."""

ResendRunner = Callable[[EndToEndCase], ResendPoint | str]
"""A resend case run as a whole elsewhere (vLLM's engine: the producer's stores and the
consumer's lookup), its point or why it gave none."""


@dataclass(frozen=True)
class _Side:
    """One side of a measurement: its bundle and, when given, the store path its
    producer runs as a whole (:data:`StoreRunner`) instead of kvcontract's over the
    bundle; the consumer's lookup is the bundle's either way. With ``resend``
    (:data:`ResendRunner`), a resend runs there whole (producer and consumer)."""

    impl: Implementation
    store: StoreRunner | None = None
    resend: ResendRunner | None = None


def _same_store_path(bound: _Side, patched: _Side) -> bool:
    if bound.resend is not None or patched.resend is not None:
        return False
    if bound.store is not patched.store:
        return False
    return all(getattr(bound.impl, name) is getattr(patched.impl, name)
               for name in STORE_PATH_FIELDS)


def _points(case: EndToEndCase, bound: _Side, patched: _Side,
            shared: bool) -> tuple[ResendPoint | str, ResendPoint | str]:
    """The resend on ``patched`` and on ``bound`` (a failure as its reason); with
    ``shared`` (:func:`_same_store_path`) one run of the producer serves both."""
    run = None
    if shared:
        found = _store(case.producer, patched)
        if isinstance(found, str):
            return found, found
        run = found
    return _point(case, patched, run), _point(case, bound, run)


EXCLUDED_SHOWN = 3
"""Reasons kept per row for the cases left out of its numbers (all are counted)."""


def _excluded(reasons: list[str]) -> dict[str, Any]:
    """A row's cases left out of its numbers (a side that failed or gave no hit)."""
    return {"excluded": len(reasons), "excluded_reasons": reasons[:EXCLUDED_SHOWN]}


def _none_measured(target: _Target, what: str, excluded: list[str]) -> str:
    """Why a preset has no row: no ``what`` (request, prompt) could be measured."""
    return f"{target.label}: no {what} measured ({excluded[0] if excluded else 'none'})"


def _cost_row(target: _Target, retention: int | None, prompts: int, excluded: list[str],
              numbers: dict[str, Any]) -> dict[str, Any]:
    """A preset's row: its head (:func:`_row_head`), the cost's ``numbers``, then the
    cases left out of them (:func:`_excluded`)."""
    return {**_row_head(target, retention, prompts), **numbers, **_excluded(excluded)}


def _point(case: EndToEndCase, side: _Side,
           run: StoreRun | None = None) -> ResendPoint | str:
    if side.resend is not None:
        return side.resend(case)
    if run is None and side.store is not None:
        found = _store(case.producer, side)
        if isinstance(found, str):
            return found
        run = found
    try:
        return resend_point(case, side.impl, run)
    except Exception as exc:  # an implementation's failure is a reason, not a crash here
        return f"{side.impl.name} raises {type(exc).__name__}: {exc}"


# -- one memo for both sides -------------------------------------------------------------
_PLAIN = frozenset({int, bool, str, type(None)})
MEMO_ENTRIES = 1 << 17
"""Entries per remembered function (cleared when full: a cleared entry is recomputed)."""


def _remember(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` with its plain results (ints, bools, strs, None, tuples of them) remembered
    by its positional arguments and their types (``True == 1``): the functions of a
    bundle are pure (upstream bodies over fresh stand-ins, or the reference) and are
    called here on ints only, never on Z3 terms. Unhashable arguments, keyword
    arguments and a call that raises go to ``fn`` every time."""
    cache: dict[tuple[Any, ...], Any] = {}

    def call(*args: Any, **kwargs: Any) -> Any:
        if kwargs:
            return fn(*args, **kwargs)
        key = (args, *map(type, args))
        try:
            return cache[key]
        except KeyError:
            pass
        except TypeError:  # an unhashable argument
            return fn(*args)
        value = fn(*args)
        kind = type(value)
        if kind in _PLAIN or (kind is tuple and all(type(v) in _PLAIN for v in value)):
            if len(cache) >= MEMO_ENTRIES:
                cache.clear()
            cache[key] = value
        return value

    return call


_OWN_MODULES = ("kvcontract.impl.",)


def _remembered_pair(bound: Implementation,
                     patched: Implementation) -> tuple[Implementation, Implementation]:
    """Both bundles with their bound functions remembered, one memo per function object:
    a function the patch did not replace is computed once for both sides (the store path
    of a lookup defect, the lookup of a store defect). kvcontract's own functions (the
    reference and the variants, ``kvcontract.impl``) cost less than a memo lookup and are
    left as they are; a bound upstream function (behind the binding's per-call guard)
    costs more."""
    memos: dict[int, tuple[Callable[..., Any], Callable[..., Any]]] = {}

    def wrap(impl: Implementation) -> Implementation:
        fields: dict[str, Any] = {}
        for spec in dataclasses.fields(impl):
            fn = getattr(impl, spec.name)
            module = str(getattr(fn, "__module__", ""))
            if not callable(fn) or module.startswith(_OWN_MODULES):
                continue
            if id(fn) not in memos:
                memos[id(fn)] = (fn, _remember(fn))  # the original keeps its id alive
            fields[spec.name] = memos[id(fn)][1]
        return dataclasses.replace(impl, **fields)

    return wrap(bound), wrap(patched)


# -- lost hits ----------------------------------------------------------------------------
def _lost_hit_row(target: _Target, bound: _Side, patched: _Side,
                  lengths: Sequence[int], retention: int | None) -> dict[str, Any] | str:
    lost = 0
    tokens_lost = hit_bound = hit_patched = promised = prompt_sum = 0
    excluded: list[str] = []
    measured = 0
    first_lost: dict[str, int] | None = None
    shared = _same_store_path(bound, patched)
    for prompt in lengths:
        case = resend_case(target.label, target.geometry, prompt)
        good, bad = _points(case, bound, patched, shared)
        if isinstance(good, str) or good.hit is None or good.error is not None:
            excluded.append(f"P={prompt}: patched gives no hit "
                            f"({good if isinstance(good, str) else good.error or 'deferred'})")
            continue
        if isinstance(bad, str) or bad.hit is None or bad.error is not None:
            # Not a lost hit: a crash or a deferral, costed under its own impact.
            excluded.append(f"P={prompt}: bound gives no hit "
                            f"({bad if isinstance(bad, str) else bad.error or 'deferred'})")
            continue
        measured += 1
        lost += bad.hit < good.hit
        if bad.hit < good.hit and first_lost is None:
            first_lost = {"prompt": prompt, "hit_bound": bad.hit, "hit_patched": good.hit}
        tokens_lost += max(0, good.hit - bad.hit)
        hit_bound += bad.hit
        hit_patched += good.hit
        promised += resend_promises(case)[0]
        prompt_sum += prompt
    if not measured:
        return _none_measured(target, "prompt", excluded)
    return _cost_row(target, retention, measured, excluded, {
        "lost_rate": lost / measured,
        "mean_tokens_lost": tokens_lost / measured,
        "mean_hit_patched": hit_patched / measured,
        "mean_hit_bound": hit_bound / measured,
        "mean_promised": promised / measured,
        "share_of_hit_lost": tokens_lost / hit_patched if hit_patched else 0.0,
        "mean_prompt": prompt_sum / measured,
        # The first resend that loses, with its geometry: what `audit --live` replays
        # on vLLM itself.
        "example": ({**first_lost, "geometry": target.geometry.to_dict()}
                    if first_lost else None),
    })


def _lost_hit_phrases(row: Mapping[str, Any]) -> list[str]:
    share = f"{row['share_of_hit_lost']:.0%}"
    tokens = f"{row['mean_tokens_lost']:,.0f}"
    prompt = f"{round(row['mean_prompt'] / 1000):.0f}k"
    preset, bpc = row["preset"], row["bpc"]
    return [
        f"loses {share} of offloaded hits on {preset} "
        f"(bpc {bpc}: {tokens} tokens per {prompt} prompt)",
        f"loses {share} of offloaded hits on {preset} (bpc {bpc}: {tokens} tok/{prompt})",
        f"loses {share} of offloaded hits on {preset} (bpc {bpc})",
        f"loses {share} of hits on {preset} bpc {bpc}",
    ]


# -- waste --------------------------------------------------------------------------------
def block_bytes(preset: str, geometry: Geometry) -> list[int] | None:
    """Bytes of one offloaded block of each (folded) group of a preset's geometry, or
    None when the preset does not give the page sizes (``bytes_per_token`` of every
    attention kind, the layer counts) or the geometry is not the preset's own build.

    vLLM unifies every page to the largest one (``unify_page_sizes``: a Mamba state is
    padded to it) and a group holds ``group size`` layers
    (``split_into_groups``: the smallest bucket, or the largest when under 1.5 times
    it); a block of a group is one page of each of its layers. Tensor parallelism 1.
    """
    model = get_preset(preset).model
    layers = model.layers
    if any(k.count is None or k.block_size is not None for k in layers):
        return None
    attention = [k for k in layers if k.kind is not GroupKind.MAMBA]
    if not attention or any(k.bytes_per_token is None for k in attention):
        return None
    base = geometry.extra.get("base_block_size")
    if not isinstance(base, int):
        return None
    pages = [base * (k.bytes_per_token or 0) for k in attention]
    pages += [k.state_bytes or 0 for k in layers if k.kind is GroupKind.MAMBA]
    page = max(pages)
    drafter = get_preset(preset).drafter
    joins = drafter.joins if drafter is not None else {}
    sizes = [(k.count or 0) + joins.get(k.name, 0) for k in layers]
    smallest, largest = min(sizes), max(sizes)
    group_size = largest if largest < smallest * 1.5 else smallest
    return [group_size * page for _ in geometry.groups]


def _producers(target: _Target, prompt: int) -> list[StoreCase]:
    """The one-shot producer and, for a prompt longer than one step, the chunked one."""
    found = [StoreCase(target.label, target.geometry, prompt, (prompt,), "finished", decode=3)]
    if prompt > PREFILL_STEP:
        steps = (PREFILL_STEP,) * (prompt // PREFILL_STEP)
        steps += (prompt % PREFILL_STEP,) if prompt % PREFILL_STEP else ()
        found.append(StoreCase(target.label, target.geometry, prompt, steps, "finished",
                               decode=3))
    return found


def _store(case: StoreCase, side: _Side) -> StoreRun | str:
    try:
        return (side.store(case) if side.store is not None
                else simulate_store_case(case, side.impl))
    except Exception as exc:  # an implementation's failure is a reason, not waste
        return f"{side.impl.name} raises {type(exc).__name__}: {exc}"


def _waste_row(target: _Target, bound: _Side, patched: _Side,
               lengths: Sequence[int], retention: int | None) -> dict[str, Any] | str:
    geometry = target.geometry
    counts = list(geometry.extra.get("group_counts") or [1] * len(geometry.groups))
    per_block = block_bytes(target.preset, geometry)
    bpc = geometry.blocks_per_chunk
    requests = affected = chunks = wasted_bytes = 0
    excluded: list[str] = []
    same = _same_store_path(bound, patched)  # then every request offers the same chunks
    for prompt in () if same else lengths:
        for producer in _producers(target, prompt):
            good, bad = _store(producer, patched), _store(producer, bound)
            if isinstance(good, str) or isinstance(bad, str):
                excluded.append(f"P={prompt} steps={len(producer.steps)}: "
                                f"{good if isinstance(good, str) else bad}")
                continue
            requests += 1
            extra = [len(offered_chunks(b) - offered_chunks(g))
                     for b, g in zip(bad.trackers, good.trackers, strict=True)]
            here = sum(n * c for n, c in zip(extra, counts, strict=True))
            affected += here > 0
            chunks += here
            if per_block is not None:
                wasted_bytes += sum(n * c * bpc * size for n, c, size
                                    in zip(extra, counts, per_block, strict=True))
    if same:
        requests = sum(len(_producers(target, prompt)) for prompt in lengths)
    if not requests:
        return _none_measured(target, "request", excluded)
    return _cost_row(target, retention, len(lengths), excluded, {
        "requests": requests,
        "share_affected": affected / requests,
        "mean_wasted_chunks": chunks / requests,
        "mean_wasted_blocks": chunks * bpc / requests,
        "mean_wasted_bytes": wasted_bytes / requests if per_block is not None else None,
    })


def _waste_phrases(row: Mapping[str, Any]) -> list[str]:
    blocks = f"{row['mean_wasted_blocks']:,.1f}"
    share = f"{row['share_affected']:.0%}"
    preset, bpc = row["preset"], row["bpc"]
    found = []
    if row.get("mean_wasted_bytes") is not None:
        mib = row["mean_wasted_bytes"] / 2**20
        found.append(f"stores {blocks} unread blocks ({mib:,.1f} MiB) per request on "
                     f"{preset} (bpc {bpc})")
    found += [
        f"stores {blocks} unread blocks per request on {preset} (bpc {bpc}, {share} of "
        "requests)",
        f"stores {blocks} unread blocks per request on {preset} (bpc {bpc})",
        f"stores {blocks} unread blocks/request on {preset}",
    ]
    return found


# -- delay --------------------------------------------------------------------------------
def _pending_lookup(case: StoreCase, side: _Side) -> int | str | None:
    """The resend's hit while ``impl``'s last store of the producer is in flight (its
    last non-empty offer per group HIT_PENDING, earlier offers HIT); None: deferred."""
    run = _store(case, side)
    if isinstance(run, str):
        return run
    impl = side.impl
    states: list[dict[int, LookupResult]] = []
    for tracker in run.trackers:
        group: dict[int, LookupResult] = {k: HIT for k in offered_chunks(tracker)}
        last = next((offer for offer in reversed(tracker.offers) if offer), [])
        group.update({k: HIT_PENDING for k in last})
        states.append(group)
    keys = consumer_keys(case.geometry, case.prompt_len, case.prompt_len)
    try:
        outcome = lookup_complete_chunks(impl, case.geometry, case.prompt_len, 0,
                                         lambda g, k: states[g].get(k, MISS), num_keys=keys)
    except ConvergenceError as exc:
        return f"{impl.name} does not converge: {exc}"
    except Exception as exc:  # an implementation's failure is a reason, not a delay
        return f"{impl.name} raises {type(exc).__name__}: {exc}"
    hit: int | None = outcome.hit_tokens
    return hit


def _delay_row(target: _Target, bound: _Side, patched: _Side,
               lengths: Sequence[int], retention: int | None) -> dict[str, Any] | str:
    requests = deferred = 0
    served = 0
    excluded: list[str] = []
    for prompt in lengths:
        producer = _producers(target, prompt)[-1]
        good, bad = _pending_lookup(producer, patched), _pending_lookup(producer, bound)
        if isinstance(good, str) or isinstance(bad, str):
            excluded.append(f"P={prompt}: {good if isinstance(good, str) else bad}")
            continue
        requests += 1
        if bad is None and good is not None:
            deferred += 1
            served += good
    if not requests:
        return _none_measured(target, "request", excluded)
    return _cost_row(target, retention, len(lengths), excluded, {
        "requests": requests,
        "deferred_rate": deferred / requests,
        "mean_hit_deferred": served / deferred if deferred else 0.0,
        "waits_on": "the producer's last store (in flight when the resend arrives)",
        "bounded_by": "store completion",
        "unbounded_if": "the store stalls",
    })


def _delay_phrases(row: Mapping[str, Any]) -> list[str]:
    share, preset, bpc = f"{row['deferred_rate']:.0%}", row["preset"], row["bpc"]
    return [
        f"defers {share} of resends behind an unread store on {preset} (bpc {bpc})",
        f"defers {share} of resends on {preset} (bpc {bpc}) until a store ends",
        f"defers {share} of resends on {preset} bpc {bpc}",
    ]


def _witness(row: Mapping[str, Any]) -> dict[str, Any]:
    witness = row.get("witness", row)
    if isinstance(witness, str):
        witness = json.loads(witness)
    if not isinstance(witness, Mapping):
        raise ValueError("the row has no witness object")
    return dict(witness)


def delay_of(witness_row: Mapping[str, Any],
             impl: Implementation | None = None) -> dict[str, Any]:
    """What a deferral found by C3 waits on, read from an audit report row (its
    ``witness``: a lookup case, or a scanner's ``states``) or from the witness itself.

    The request is deferred while a chunk the lookup reads is ``HIT_PENDING`` (a store
    in flight): it waits until that store completes, and forever if the store stalls. A
    ``RETRY`` chunk waits on an asynchronous lookup instead. ``waits_on`` lists the
    witness's pending chunks (a C3 witness reads none of them for the contract's best
    boundary, ``could_serve``: the implementation waits on them needlessly), narrowed,
    when ``impl`` is given, to the chunks its lookup looked at. ``steps``: the request
    is looked up again every scheduler step, so it waits at least one step and at most
    until the store (or the lookup) completes; no bound in steps exists without one on
    the store.
    """
    witness = _witness(witness_row)
    states = witness.get("states")
    waits: list[dict[str, Any]] = []
    could_serve: int | None = None
    if isinstance(states, Mapping) and "geometry" in witness:
        case = LookupCase.from_json(witness)
        answer = contract_answer(case)
        could_serve = answer.best_present
        looked: set[tuple[int, int]] | None = None
        if impl is not None:
            looked = set(run_lookup(case, impl).lookups)
        for g, row in enumerate(case.states):
            tpc = case.geometry.chunk_tokens(case.geometry.groups[g])
            for k, state in enumerate(row):
                if state not in (HIT_PENDING, LookupResult.RETRY):
                    continue
                if looked is not None and (g, k) not in looked:
                    continue
                waits.append({"group": g, "kind": case.geometry.groups[g].kind.value,
                              "chunk": k, "tokens": [k * tpc, (k + 1) * tpc],
                              "state": state.name})
    elif isinstance(states, Sequence):
        for k, name in enumerate(states):
            if str(name) in ("HIT_PENDING", "RETRY"):
                waits.append({"group": 0, "chunk": k, "tokens": None, "state": str(name)})
    else:
        raise ValueError("the witness has no lookup states (not a C3 lookup or scan case)")
    stores = [w for w in waits if w["state"] == "HIT_PENDING"]
    retries = [w for w in waits if w["state"] == "RETRY"]
    if stores:
        named = ", ".join(_chunk_words(w) for w in stores)
        text = f"waits on the store of {named}: bounded by it, forever if it stalls"
        bounded_by, unbounded_if = "store completion", "the store stalls"
    elif retries:
        named = ", ".join(_chunk_words(w) for w in retries)
        text = (f"waits on the lookup of {named}: bounded by it, forever if it never "
                "completes")
        bounded_by, unbounded_if = "lookup completion", "the lookup never completes"
    else:
        text = "deferred with no pending chunk: forever, nothing it waits on completes"
        bounded_by, unbounded_if = "nothing", "always"
    if could_serve:
        text += f"; the contract serves {could_serve} tokens now"
    elif isinstance(states, Mapping):
        text += "; the contract decides now"
    return {
        "waits_on": waits,
        "bounded_by": bounded_by,
        "unbounded_if": unbounded_if,
        "steps": {"at_least": 1, "at_most": None,
                  "per": "one lookup per scheduler step until it completes"},
        "could_serve": could_serve,
        "text": text,
    }


def _chunk_words(wait: Mapping[str, Any]) -> str:
    kind = {"full": " (full attention)", "sliding_window": " (sliding window)",
            "mamba": " (Mamba)"}.get(str(wait.get("kind")), "")
    words = f"group {wait['group']}{kind} chunk {wait['chunk']}"
    if wait.get("tokens"):
        lo, hi = wait["tokens"]
        words += f" (tokens {lo}-{hi})"
    return words


# -- crash --------------------------------------------------------------------------------
_READ = re.compile(r"(?:reads group (?P<g1>\d+) chunk (?P<k1>\d+)|group (?P<g2>\d+) must "
                   r"load chunk (?P<k2>\d+)), which is (?P<state>[A-Za-z_ ()]+?): upstream "
                   r"would crash with '(?P<error>[^']*)'")
_NOT_PRESENT = re.compile(r"not servable by group (?P<g>\d+): chunk (?P<k>\d+) is not present")


def crash_of_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """The crash condition of a finding: what is loaded that is absent or pending, read
    from the row's ``message`` (the judges' wording), with the chunk's tokens when the
    witness has the geometry."""
    message = str(row.get("message", ""))
    found = _READ.search(message)
    group = chunk = None
    state = error = None
    if found:
        group = int(found["g1"] or found["g2"])
        chunk = int(found["k1"] or found["k2"])
        state, error = found["state"], found["error"]
    else:
        other = _NOT_PRESENT.search(message)
        if other:
            group, chunk, state = int(other["g"]), int(other["k"]), "MISS"
            error = crash_of(MISS)
    tokens = None
    witness = row.get("witness")
    if group is not None and chunk is not None and isinstance(witness, Mapping):
        try:
            geometry = Geometry.from_dict(dict(witness.get("geometry")
                                               or witness["producer"]["geometry"]))
            tpc = geometry.chunk_tokens(geometry.groups[group])
            tokens = [chunk * tpc, (chunk + 1) * tpc]
        except (KeyError, TypeError, IndexError, KvContractError):
            tokens = None
    if group is None:
        condition = ("the lookup does not converge" if "ConvergenceError" in message
                     or "did not converge" in message else message or "unknown")
    else:
        where = f" (tokens {tokens[0]}-{tokens[1]})" if tokens else ""
        condition = (f"loads group {group} chunk {chunk}{where} while it is {state}: "
                     f"'{error}'")
    return {"condition": condition, "group": group, "chunk": chunk, "state": state,
            "error": error, "tokens": tokens}


def _crash_row(target: _Target, bound: _Side, patched: _Side,
               lengths: Sequence[int], retention: int | None) -> dict[str, Any] | str:
    crashes = 0
    measured = 0
    condition = None
    excluded: list[str] = []
    shared = _same_store_path(bound, patched)
    for prompt in lengths:
        case = resend_case(target.label, target.geometry, prompt)
        good, bad = _points(case, bound, patched, shared)
        if isinstance(good, str):
            excluded.append(f"P={prompt}: {good}")
            continue
        measured += 1
        good_crash = good.error is not None or good.unread is not None
        if isinstance(bad, str):
            bad_crash, why = True, bad
        else:
            bad_crash = bad.error is not None or bad.unread is not None
            why = (f"does not converge: {bad.error}" if bad.error is not None else
                   f"loads group {bad.unread[0]} chunk {bad.unread[1]} while it is "
                   f"{bad.unread[2]}" if bad.unread is not None else "")
        if bad_crash and not good_crash:
            crashes += 1
            condition = condition or f"P={prompt}: {why}"
    if not measured:
        return _none_measured(target, "prompt", excluded)
    return _cost_row(target, retention, measured, excluded,
                     {"crash_rate": crashes / measured, "condition": condition})


def _crash_phrases(row: Mapping[str, Any]) -> list[str]:
    share, preset, bpc = f"{row['crash_rate']:.0%}", row["preset"], row["bpc"]
    return [f"fails {share} of resend loads on {preset} (bpc {bpc})",
            f"fails {share} of resends on {preset} bpc {bpc}"]


# -- the entry point ----------------------------------------------------------------------
_Measure = Callable[[_Target, _Side, _Side, Sequence[int], int | None],
                    dict[str, Any] | str]
_MEASURES: dict[Impact, tuple[_Measure, str, Callable[[Mapping[str, Any]], list[str]]]] = {
    Impact.LOST_HIT: (_lost_hit_row, "lost_rate", _lost_hit_phrases),
    Impact.WASTE: (_waste_row, "share_affected", _waste_phrases),
    Impact.DELAY: (_delay_row, "deferred_rate", _delay_phrases),
    Impact.CRASH: (_crash_row, "crash_rate", _crash_phrases),
}
_WORST: dict[Impact, Callable[[Mapping[str, Any]], tuple[float, ...]]] = {
    Impact.LOST_HIT: lambda r: (r["share_of_hit_lost"], r["mean_tokens_lost"], r["lost_rate"]),
    Impact.WASTE: lambda r: (r["mean_wasted_blocks"], r["share_affected"]),
    Impact.DELAY: lambda r: (r["deferred_rate"],),
    Impact.CRASH: lambda r: (r["crash_rate"],),
}
_OTHER: dict[Impact, Callable[[Mapping[str, Any]], str]] = {
    Impact.LOST_HIT: lambda r: f"{r['share_of_hit_lost']:.0%}",
    Impact.WASTE: lambda r: f"{r['mean_wasted_blocks']:,.0f} blocks",
    Impact.DELAY: lambda r: f"{r['deferred_rate']:.0%}",
    Impact.CRASH: lambda r: f"{r['crash_rate']:.0%}",
}
"""A preset's cost in a few characters, for the summary's list of the other presets."""
_SCENARIO = {
    Impact.LOST_HIT: "resends of one-shot prefills",
    Impact.WASTE: "one-shot and chunked prefills",
    Impact.DELAY: "resends during the last store of a chunked prefill",
    Impact.CRASH: "resends of one-shot prefills",
}


def _summary(impact: Impact, rows: list[dict[str, Any]], checked: int,
             retention: int | None) -> str:
    at = "" if retention == 0 else f" at retention {_retention_label(retention)}"
    if not rows:
        found = f"no {impact.value} cost on {checked} preset geometries"
        candidates = [f"{found}{at} ({_SCENARIO[impact]})", f"{found}{at}", found]
        return next((c for c in candidates if len(c) <= SUMMARY_WIDTH), found)
    phrases = {
        Impact.LOST_HIT: _lost_hit_phrases, Impact.WASTE: _waste_phrases,
        Impact.DELAY: _delay_phrases, Impact.CRASH: _crash_phrases,
    }[impact](rows[0])
    if all(row.get("hash_mode") == "legacy" for row in rows):
        # Every cost is in the legacy hash mode of presets whose default is lookahead
        # hashes, measured there first and free: say so before the number.
        at = f" with legacy hashes only{at}"
    # Every other preset the defect costs, by its worst row (rows are worst first), so a
    # maintainer sees each affected model; the count alone when they do not fit.
    worst: dict[str, Mapping[str, Any]] = {}
    for row in rows[1:]:
        if row["preset"] != rows[0]["preset"]:
            worst.setdefault(row["preset"], row)
    named = "; also " + ", ".join(f"{preset} {_OTHER[impact](row)}"
                                  for preset, row in worst.items()) if worst else ""
    counted = (f"; +{len(worst)} preset{'s' if len(worst) > 1 else ''}" if worst else "")
    # Two summary lines at most (the terminal wraps it under "cost:").
    tails = ((named, 2 * SUMMARY_WIDTH), (counted, SUMMARY_WIDTH)) if worst else \
        (("", SUMMARY_WIDTH),)
    for tail, limit in tails:
        for phrase in phrases:
            if len(phrase + at + tail) <= limit:
                return phrase + at + tail
    return min((p + at + counted for p in phrases), key=len)


def defect_cost(bound: Implementation, patched: Implementation, impact: str, *,
                presets: Sequence[str] | None = None, lengths: int = DEFAULT_LENGTHS,
                retention: int | None = 0,
                budget: CostBudget | None = None,
                bound_store: StoreRunner | None = None,
                patched_store: StoreRunner | None = None,
                bound_resend: ResendRunner | None = None,
                patched_resend: ResendRunner | None = None,
                lookahead_hashes: bool = True) -> dict[str, Any]:
    """What ``bound`` does worse than ``patched`` on the model presets, for a defect of
    ``impact`` (a :class:`~kvcontract.vocabulary.Impact` value).

    ``lookahead_hashes``: the release measured has lookahead block hashes, so a preset
    that records them as vLLM's default is measured in that mode first, then as stated
    (docs/CONTRACT.md 2.1); without them, as stated alone.

    ``bound_store``/``patched_store``: the producer's store path of that side run as a
    whole (upstream's executed ``_build_store_jobs``, or vLLM's engine), instead of
    kvcontract's store path over the side's bundle; the consumer's lookup is the side's
    bundle either way. ``bound_resend``/``patched_resend``: a resend (lost hits) run
    whole elsewhere (vLLM's engine, as it is and with the root cause replaced).

    ``presets``: preset names (default every one); ``lengths``: prompt lengths per
    geometry, spread over ``[FIRST_PROMPT, LAST_PROMPT]`` by ``prompt_lengths`` (its odd
    step may leave out the last one; the result's ``lengths`` lists those measured);
    ``retention``: the retention interval every geometry is built with (0: vLLM's
    default; a geometry vLLM cannot build with it is skipped with the reason);
    ``budget``: caps in cases.

    Waste counts a chunk once per vLLM group a folded group stands for
    (``Geometry.extra["group_counts"]``: each group is stored under its own key); blocks
    are chunks times ``bpc``.

    Returns ``impact``, ``checked`` (geometries measured), ``presets_checked``,
    ``rows`` (the geometries where the defect costs something, worst first), ``unaffected``
    (geometry labels where it costs nothing), ``unaffected_presets``, ``skipped``
    (reasons), ``lengths`` (the prompt lengths), ``retention``, ``scenario``, ``notes``
    and a one-line ``summary`` in the user's units. ``corruption`` and ``latent`` are
    not measured here (no rows, the summary says so).
    """
    try:
        kind = Impact(impact)
    except ValueError:
        known = ", ".join(i.value for i in Impact)
        raise UsageError(f"unknown impact {impact!r}; known impacts: {known}") from None
    if isinstance(lengths, bool) or not isinstance(lengths, int) or lengths < 1:
        raise UsageError(f"lengths must be an integer >= 1, not {lengths!r}")
    budget = budget or CostBudget()
    count = min(lengths, budget.max_lengths or lengths)
    prompts = prompt_lengths(FIRST_PROMPT, LAST_PROMPT, count)
    result: dict[str, Any] = {
        "impact": kind.value, "checked": 0, "presets_checked": 0, "rows": [],
        "unaffected": [], "unaffected_presets": [], "skipped": [], "lengths": prompts,
        "retention": retention, "scenario": "", "notes": [], "summary": "",
    }
    if kind not in _MEASURES:
        result["summary"] = f"{kind.value}: not measured on the presets"
        result["notes"].append(f"{kind.value} has no cost scenario on presets "
                               "(corruption: C11's data oracle; latent: no geometry "
                               "vLLM builds)")
        return result
    measure, rate, _ = _MEASURES[kind]
    targets, skipped, names = _targets(presets, retention, budget, lookahead_hashes)
    result["scenario"] = _SCENARIO[kind]
    result["skipped"] = skipped
    rows: list[dict[str, Any]] = []
    unaffected: list[str] = []
    checked = 0
    same = bound == patched and bound_store is patched_store and \
        bound_resend is patched_resend
    remembered_bound, remembered_patched = _remembered_pair(bound, patched)
    bound_side = _Side(remembered_bound, bound_store, bound_resend)
    patched_side = _Side(remembered_patched, patched_store, patched_resend)
    for target in targets:
        if same:
            row: dict[str, Any] | str = {rate: 0.0}
        else:
            row = measure(target, bound_side, patched_side, prompts, retention)
        if isinstance(row, str):
            skipped.append(row)
            continue
        checked += 1
        if row[rate] > 0:
            rows.append(row)
        else:
            unaffected.append(target.label)
    rows.sort(key=lambda r: tuple(-x for x in _WORST[kind](r)))
    affected = {r["preset"] for r in rows}
    measured_presets = {t.preset for t in targets}
    result.update({
        "checked": checked,
        "presets_checked": len(measured_presets),
        "rows": rows,
        "unaffected": unaffected,
        "unaffected_presets": [n for n in names if n in measured_presets
                               and n not in affected],
    })
    if kind is Impact.WASTE and any(block_bytes(t.preset, t.geometry) is None
                                    for t in targets):
        result["notes"].append("bytes only where the preset gives page sizes "
                               "(bytes_per_token of every attention kind, layer counts); "
                               "elsewhere blocks only (mean_wasted_bytes None)")
    if kind is Impact.DELAY and not rows:
        result["notes"].append("this resend scenario shows no delay on the presets: each "
                               "deferral of bound is also patched's (the pending chunks "
                               "lie in what the best boundary reads); a needless deferral "
                               "needs a pending chunk outside it: read the C3 witness with "
                               "delay_of")
    result["summary"] = _summary(kind, rows, checked, retention)
    return result
