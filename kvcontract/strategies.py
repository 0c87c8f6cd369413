"""Hypothesis strategies for users' own property tests of an offloading implementation.

The pieces kvcontract's own catalogues are made of, as strategies: geometries vLLM can
build (:func:`geometries`), the lookup answers of every chunk of a request
(:func:`lookup_states`, :func:`lookup_cases`), chunked-prefill store schedules
(:func:`store_schedules`) and witnesses of a theorem that :func:`kvcontract.replay`
runs on any implementation (:func:`witnesses`)::

    from hypothesis import given, settings

    import kvcontract
    from kvcontract.strategies import witnesses

    @settings(max_examples=20, deadline=None)
    @given(witnesses("C2/lookup-loads-only-hit"))
    def test_my_lookup_loads_only_hits(witness):
        assert kvcontract.replay(witness["theorem"], witness, "module:my_patch.py") is None

Every geometry is validated by :class:`kvcontract.spec.geometry.Geometry` and, unless
``buildable=False``, is one vLLM 0.33.0's KV-cache planning can produce
(:func:`kvcontract.spec.build.buildable`). Everything shrinks towards small, simple
values (one sliding-window group, block size 1, short prompts, HIT everywhere).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any

import hypothesis.strategies as st
from hypothesis import assume

from kvcontract.errors import GeometryError, UnknownPropertyError
from kvcontract.spec.geometry import Geometry, GroupSpec, fa, mamba, swa
from kvcontract.spec.lookup import LookupResult
from kvcontract.spec.properties.base import Family
from kvcontract.spec.properties.lookup import LOOKUP_STATES, LookupCase
from kvcontract.spec.properties.store import StoreCase

__all__ = [
    "geometries",
    "lookup_cases",
    "lookup_states",
    "store_schedules",
    "witnesses",
]

BLOCK_SIZES = (1, 2, 4, 8, 16)
"""The smallest block sizes :func:`geometries` draws (larger groups are these times
1, 2 or 4): small numbers, so cases stay fast to replay and easy to read."""


@st.composite
def geometries(draw: st.DrawFn, *, buildable: bool = True, max_groups: int = 3,
               block_sizes: Sequence[int] = BLOCK_SIZES, max_window: int = 40,
               blocks_per_chunk: Sequence[int] = (1, 2, 4), max_extra: int = 3,
               eagle: bool = True, full_attention: bool = True, mamba_groups: bool = True,
               retention: bool = True) -> Geometry:
    """A :class:`Geometry` with one to ``max_groups`` KV-cache groups, at least one of
    them sliding-window (windows 2 to ``max_window`` tokens, MTP ``e`` up to
    ``max_extra``, EAGLE groups when ``eagle``), optional full-attention and Mamba groups,
    ``blocks_per_chunk`` and a retention interval (None, 0 or a multiple of every size
    vLLM requires) when ``retention``.

    With ``buildable`` (the default), only geometries vLLM builds: every block size a
    multiple of the smallest, a Mamba group at the smallest block size, one ``e`` for
    every sliding-window group (checked by :func:`kvcontract.spec.build.buildable`).

    >>> from hypothesis import given, settings
    >>> @settings(max_examples=5, deadline=None)
    ... @given(geometries(max_groups=2))
    ... def test(geometry):
    ...     assert geometry.has_swa
    >>> test()
    """
    from kvcontract.spec.build import buildable as vllm_builds

    if max_groups < 1:
        raise ValueError(f"max_groups must be at least 1, not {max_groups}")
    if max_window < 2:
        raise ValueError(f"max_window must be at least 2 (a window of 1 attends no history), "
                         f"not {max_window}")
    count = draw(st.integers(1, max_groups))
    base = draw(st.sampled_from(tuple(block_sizes)))
    shared_extra = draw(st.integers(0, max_extra))
    kinds = ["swa"]
    for _ in range(count - 1):
        kinds.append(draw(st.sampled_from(
            ["swa"] + (["fa"] if full_attention else [])
            + (["mamba"] if mamba_groups and "mamba" not in kinds else []))))  # one Mamba
    groups: list[GroupSpec] = []
    for kind in kinds:
        if buildable:
            size = base * draw(st.sampled_from((1, 2, 4)))
        else:
            size = draw(st.sampled_from(tuple(block_sizes)))
        if kind == "swa":
            extra = shared_extra if buildable else draw(st.integers(0, max_extra))
            groups.append(swa(size, draw(st.integers(2, max_window)), extra,
                              eagle=eagle and draw(st.booleans())))
        elif kind == "fa":
            groups.append(fa(size, eagle=eagle and draw(st.booleans())))
        else:
            groups.append(mamba(base if buildable else size))
    bpc = draw(st.sampled_from(tuple(blocks_per_chunk)))
    interval: int | None = None
    if retention:
        choice = draw(st.sampled_from(("none", "zero", "interval")))
        if choice == "zero":
            interval = 0
        elif choice == "interval":
            interval = _retention_unit(groups, bpc) * draw(st.integers(1, 3))
    try:
        geometry = Geometry(tuple(groups), blocks_per_chunk=bpc, retention_interval=interval)
    except GeometryError:
        assume(False)
        raise AssertionError("unreachable") from None
    if buildable:
        assume(vllm_builds(geometry)[0])
    return geometry


def _retention_unit(groups: Sequence[GroupSpec], bpc: int) -> int:
    """The smallest positive retention interval every rule accepts: a multiple of every
    block, of every sliding-window and Mamba group's ``tpc`` and of the alignment ``A``."""
    sizes = [g.block_size for g in groups]
    sizes += [g.block_size * bpc for g in groups]
    return math.lcm(*sizes)


def _chunk_lcm(geometry: Geometry) -> int:
    return math.lcm(*(geometry.chunk_tokens(g) for g in geometry.groups))


def lookup_states(geometry: Geometry, num_tokens: int, *,
                  retry: bool = False) -> st.SearchStrategy[tuple[tuple[LookupResult, ...],
                                                                   ...]]:
    """The offload lookup's answer for every complete chunk of a ``num_tokens`` request,
    per group of ``geometry`` (``num_tokens // tpc`` answers for a group whose chunks hold
    ``tpc`` tokens): MISS, HIT or HIT_PENDING, and RETRY too with ``retry``. Shrinks
    towards HIT everywhere.

    >>> from kvcontract.spec.geometry import Geometry, fa, swa
    >>> geometry = Geometry((fa(4), swa(4, 8)))
    >>> states = lookup_states(geometry, 17).example()
    >>> [len(row) for row in states]
    [4, 4]
    """
    if isinstance(num_tokens, bool) or not isinstance(num_tokens, int) or num_tokens < 0:
        raise ValueError(f"num_tokens must be an integer >= 0, not {num_tokens!r}")
    alphabet = (LookupResult.HIT, *[s for s in (LOOKUP_STATES if not retry
                                                else tuple(LookupResult))
                                    if s is not LookupResult.HIT])
    rows = [st.lists(st.sampled_from(alphabet), min_size=n, max_size=n).map(tuple)
            for n in (num_tokens // geometry.chunk_tokens(g) for g in geometry.groups)]
    return st.tuples(*rows)


@st.composite
def lookup_cases(draw: st.DrawFn, geometry: Geometry | st.SearchStrategy[Geometry] | None = None,
                 *, max_chunks: int = 8, retry: bool = False,
                 local_hit: bool = True) -> LookupCase:
    """A multi-group lookup case (the lookup family's witness, C2-C6): a geometry (drawn
    from :func:`geometries` unless one, or a strategy, is given), a request of up to
    ``max_chunks`` chunks of the largest group plus a partial one, a local (GPU prefix)
    hit of whole chunks when ``local_hit``, and :func:`lookup_states` for every chunk.

    >>> case = lookup_cases().example()
    >>> case.local_hit <= case.num_tokens
    True
    """
    if geometry is None:
        geometry = geometries(max_groups=2, max_window=24)
    chosen = draw(geometry) if isinstance(geometry, st.SearchStrategy) else geometry
    largest = max(chosen.chunk_tokens(g) for g in chosen.groups)
    num_tokens = draw(st.integers(1, max_chunks * largest + largest - 1))
    unit = _chunk_lcm(chosen)
    local = 0
    if local_hit and num_tokens > unit:
        local = unit * draw(st.integers(0, (num_tokens - 1) // unit))
    states = draw(lookup_states(chosen, num_tokens, retry=retry))
    return LookupCase(chosen.describe(), chosen, num_tokens, local, states)


@st.composite
def store_schedules(draw: st.DrawFn,
                    geometry: Geometry | st.SearchStrategy[Geometry] | None = None, *,
                    max_prompt: int = 96, max_steps: int = 6, max_decode: int = 3,
                    start_hit: bool = True, aborted: bool = True) -> StoreCase:
    """A producer's chunked-prefill schedule (the store family's witness, C8-C10, and
    the producer of C12): a prompt of up to ``max_prompt`` tokens, an optional cached
    prefix of whole chunks (``start_hit``), prefill steps of any sizes (at most
    ``max_steps``), then either ``finished`` after up to ``max_decode`` decode steps or,
    with ``aborted``, ``aborted`` after some of the steps; ``offload_prompt_only`` either
    way. The geometry is drawn from :func:`geometries` unless given.

    >>> case = store_schedules().example()
    >>> case.start_hit + sum(case.steps) <= case.prompt_len
    True
    """
    if geometry is None:
        geometry = geometries(max_groups=2, max_window=24)
    chosen = draw(geometry) if isinstance(geometry, st.SearchStrategy) else geometry
    prompt = draw(st.integers(1, max_prompt))
    unit = _chunk_lcm(chosen)
    hit = unit * draw(st.integers(0, (prompt - 1) // unit)) if start_hit else 0
    remaining = prompt - hit
    cuts = draw(st.lists(st.integers(1, max(1, remaining - 1)), max_size=max_steps - 1,
                         unique=True)) if remaining > 1 else []
    bounds = [0, *sorted(c for c in cuts if c < remaining), remaining]
    steps = tuple(b - a for a, b in itertools.pairwise(bounds) if b > a)
    ending = draw(st.sampled_from(("finished", "aborted") if aborted else ("finished",)))
    decode = 0
    if ending == "aborted":
        steps = steps[:draw(st.integers(1, len(steps)))]
    else:
        decode = draw(st.integers(0, max_decode))
    return StoreCase(chosen.describe(), chosen, prompt, steps, ending, decode,
                     prompt_only=draw(st.booleans()), start_hit=hit)


def witnesses(theorem_id: str, geometry: Geometry | st.SearchStrategy[Geometry] | None = None,
              ) -> st.SearchStrategy[dict[str, Any]]:
    """Witnesses of theorem ``theorem_id`` (``kvcontract list`` names them) in the JSON
    form of reports, for :func:`kvcontract.replay` (or
    :func:`kvcontract.spec.properties.replay`) on any implementation:

    * the scanner theorems (``C2/scan-accepts-only-hit``, ...): lookup-state sequences of
      up to 8 keys with a window of 1 to 4 chunks;
    * the lookup theorems (C2-C6): :func:`lookup_cases`;
    * the store theorems (C8-C10): :func:`store_schedules`;
    * ``C12/no-lost-hits``: a producer (:func:`store_schedules` without a cached
      prefix) and a resend, a continuation or a sibling sharing part of it;
    * the lifecycle theorems (C13-C15): a program of up to 4 actions, one before each
      step, on one of the family's geometries (``geometry`` is not used: a program's
      geometries are the family's small hybrid ones);
    * the arithmetic theorems: a size configuration of the theorem's case split and
      values of its variables that satisfy its hypotheses (found by Z3 near values
      Hypothesis draws, so it shrinks towards small numbers).

    ``geometry`` (a geometry or a strategy) replaces :func:`geometries` for the case
    theorems. Raises :class:`kvcontract.errors.UnknownPropertyError` for an unknown id.

    >>> from kvcontract.spec.properties import replay
    >>> from kvcontract.impl.variants import REFERENCE
    >>> witness = witnesses("C3/scan-defers-only-in-scope").example()
    >>> replay(witness["theorem"], witness, REFERENCE) is None
    True
    """
    from kvcontract.spec.properties import CaseProperty, get_property

    prop = get_property(theorem_id)
    if not isinstance(prop, CaseProperty):
        return _formula_witnesses(prop)
    return FAMILY_CASES[Family(prop.family)](geometry).map(prop.witness)


def _lifecycle_cases() -> st.SearchStrategy[Any]:
    from kvcontract.spec.properties.lifecycle import (
        ACTIONS,
        LifecycleCase,
        lifecycle_geometries,
    )

    return st.builds(
        lambda named, actions: LifecycleCase(named[0], named[1], tuple(actions)),
        st.sampled_from(lifecycle_geometries()),
        st.lists(st.sampled_from(ACTIONS), max_size=4))


def _scan_cases() -> st.SearchStrategy[Any]:
    from kvcontract.spec.properties.scan import ScanCase

    alphabet = (LookupResult.HIT, *[s for s in LookupResult if s is not LookupResult.HIT])

    @st.composite
    def scan(draw: st.DrawFn) -> ScanCase:
        window = draw(st.integers(1, 4))
        states = tuple(draw(st.lists(st.sampled_from(alphabet), min_size=1, max_size=8)))
        return ScanCase(states, draw(st.sampled_from((window, window + 1))), window)

    return scan()


def _end_to_end_cases(geometry: Geometry | st.SearchStrategy[Geometry] | None,
                      ) -> st.SearchStrategy[Any]:
    from kvcontract.spec.properties.end_to_end import (
        Consumer,
        EndToEndCase,
        producer_tokens,
    )

    @st.composite
    def case(draw: st.DrawFn) -> EndToEndCase:
        producer = draw(store_schedules(geometry, start_hit=False, max_prompt=64))
        kind = draw(st.sampled_from(("resend", "continuation", "sibling")))
        extra = draw(st.integers(1, 4))
        if kind == "resend" or producer.prompt_len < 2:
            consumer = Consumer("resend", producer.prompt_len, producer.prompt_len)
        elif kind == "continuation":
            shared = producer_tokens(producer)
            consumer = Consumer("continuation", shared + extra, shared)
        else:
            shared = draw(st.integers(1, producer.prompt_len - 1))
            consumer = Consumer("sibling", shared + extra, shared)
        return EndToEndCase(producer, consumer)

    return case()


def _formula_witnesses(prop: Any) -> st.SearchStrategy[dict[str, Any]]:
    """Values of an arithmetic theorem's variables inside its domain: Z3 finds the
    admissible values nearest (in the sum of distances) to values Hypothesis draws."""
    configs = prop.configs()
    if not configs:
        raise UnknownPropertyError(f"{prop.theorem_id}: the theorem has no configuration")

    @st.composite
    def witness(draw: st.DrawFn) -> dict[str, Any]:
        config = draw(st.sampled_from(configs))
        targets = {v: draw(st.integers(0, 8) | st.integers(0, 64)) for v in prop.variables}
        values = _nearest_admissible(prop, dict(config.values), targets)
        assume(values is not None)
        assert values is not None
        return dict(prop.witness(values))

    return witness()


def _nearest_admissible(prop: Any, fixed: dict[str, int],
                        targets: dict[str, int]) -> dict[str, int] | None:
    import z3

    from kvcontract.proofs.theorem import SymbolicEnv
    from kvcontract.spec.properties.base import HYPOTHESES_ONLY

    variables = {v: z3.Int(v) for v in prop.variables}
    env = SymbolicEnv({**fixed, **variables})
    hypotheses, _goal = prop.statement(env, HYPOTHESES_ONLY)
    if any(h is False for h in hypotheses):
        return None
    optimizer = z3.Optimize()
    optimizer.set("rlimit", 20_000_000)
    optimizer.add(*[h for h in hypotheses if not isinstance(h, bool)])
    distance = z3.Sum([z3.If(x >= targets[v], x - targets[v], targets[v] - x)
                       for v, x in variables.items()]) if variables else z3.IntVal(0)
    optimizer.minimize(distance)
    if optimizer.check() != z3.sat:
        return None
    model = optimizer.model()
    values = dict(fixed)
    for v, x in variables.items():
        values[v] = model.eval(x, model_completion=True).as_long()
    return values if prop.admissible(values) else None


FAMILY_CASES: dict[Family, Callable[[Any], st.SearchStrategy[Any]]] = {
    Family.SCAN: lambda geometry: _scan_cases(),
    Family.LOOKUP: lookup_cases,
    Family.STORE: store_schedules,
    Family.END_TO_END: _end_to_end_cases,
    Family.LIFECYCLE: lambda geometry: _lifecycle_cases(),
}
"""Each family's case strategy, given the geometry (a Geometry, a strategy of them or
None; the scan and lifecycle families have their own): what :func:`witnesses` maps a
property's witness over. Every :class:`Family` has one (tests/kvcontract/
test_strategies.py)."""
