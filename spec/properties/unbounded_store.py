"""Unbounded store theorems: C8-C10 for every chunked-prefill schedule, by induction over
the store steps (docs/CONTRACT.md 5.1).

The store family (:mod:`kvcontract.spec.properties.store`) runs the producer over 441
schedules of a few geometries. These theorems cover every schedule: the state of one
request's group between steps is ``next_stored_chunk_idx`` and the set of chunks offered
so far (an uninterpreted predicate of the chunk index), and the invariant is

    every chunk offered so far lies below ``next_stored_chunk_idx``.

A fresh tracker (nothing offered, index 0) satisfies it, and so does
``StoreTracker.mark_computed`` (a hit's chunks ``[0, h)`` marked offered, the index raised
to at least ``h``). Each theorem is one Z3 query about one step of any status
(prefilling, decoding, finished, aborted), any token counts, chunk size and stored index,
from any state that satisfies the invariant; the step is ``StoreTracker.step``'s
composition of the implementation's own pure functions, lifted by
:mod:`kvcontract.spec.symbolic`: ``store_step_bounds`` and ``store_chunk_offered``
(every theorem), ``store_final_segment_end`` (the refinement) and
``get_num_offloadable_tokens`` (well-formedness; the others take the offloadable tokens
as any value). What ``StoreTracker.step`` adds is taken as written:
the loop over the candidate range ``[first, end)`` and the summary of the mask over a
chunk's blocks (whether one is marked, and the first marked one).

The statements speak of one symbolic chunk ``c``: every claim is about a chunk, so a
claim for a symbolic chunk is the claim for all of them. The mask is left uninterpreted
(the chunk's summary is any value): the theorems hold for every block size, window and
mask. That an offered chunk is *demanded* needs the mask arithmetic, which is not
re-derived here: the step offers only chunks with a marked block at the horizon it passes
(the spec's, ``C9/store-steps-refine-spec``), and the lemma ``C8/stored-blocks-demanded``
shows every marked block below the horizon demanded by a reachable boundary.

On plain ints (a counterexample's replay, a reproducer) the offered set is realized as
``{c}`` when ``oc`` is 1, else empty: the statements read the predicate at ``c`` only.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kvcontract.impl.bundle import Implementation
from kvcontract.spec.arith import (
    Bool,
    Num,
    and_,
    floordiv,
    implies,
    in_range,
    max_,
    min_,
    not_,
    or_,
)
from kvcontract.spec.geometry import Geometry, fa
from kvcontract.spec.properties.base import (
    HYPOTHESES_ONLY,
    Config,
    Env,
    FormulaProperty,
    Picture,
)
from kvcontract.spec.properties.unbounded import InductiveProperty
from kvcontract.spec.reachability import final_segment_end_chunk, storable_chunks
from kvcontract.vocabulary import ENDED_STATUSES, RequestStatus

STATUSES: tuple[RequestStatus, ...] = (
    RequestStatus.PREFILLING, RequestStatus.DECODING, RequestStatus.FINISHED,
    RequestStatus.ABORTED,
)
"""The request status of a step, by the value of the variable ``st``."""

Choice = tuple[str, Callable[[Env], Sequence[Any]]]
"""A variable that selects one of a few concrete arguments (a status, a flag that must be
a Python bool, an optional value): its name and the options it selects by index."""


def _statuses(env: Env) -> Sequence[Any]:
    return STATUSES


def _flags(env: Env) -> Sequence[Any]:
    return (False, True)


def _cap(env: Env) -> Sequence[Any]:
    """``max_offload_tokens``: none (``capped`` 0) or ``M`` (``capped`` 1)."""
    return (None, env["M"])


def _retention(env: Env) -> Sequence[Any]:
    """The retention interval: none, dense retention (``interval`` 0), or ``R``
    (``interval`` 1)."""
    return (None, env["R"])


def _for_each(env: Env, choices: Sequence[Choice],
              goal_of: Callable[[dict[str, Any]], Bool]) -> Bool:
    """The goal for the options the choice variables select.

    The implementation's functions branch on these arguments in Python (a status compared
    with an enum member, ``is None``), so each combination is lifted on its own and the
    goal is the conjunction of ``selected => goal``: one query still covers them all. On
    ints only the selected combination runs.
    """
    parts: list[Bool] = []
    options = [(name, tuple(values(env))) for name, values in choices]
    for picks in itertools.product(*(range(len(values)) for _, values in options)):
        selected = and_(*(env[name] == pick for (name, _), pick in zip(options, picks,
                                                                       strict=True)))
        if selected is False:
            continue
        chosen = {name: values[pick] for (name, values), pick in zip(options, picks,
                                                                     strict=True)}
        parts.append(implies(selected, goal_of(chosen)))
    return and_(*parts) if parts else True


def _choice_domains(env: Env, choices: Sequence[Choice]) -> list[Bool]:
    return [in_range(env[name], 0, len(tuple(values(env)))) for name, values in choices]


def _offered_before(env: Env, next_index: Num) -> tuple[list[Bool], Bool]:
    """The state's offered set at chunk ``c`` and the induction's hypotheses: the set
    satisfies the invariant (every offered chunk below ``next_index``), and ``oc`` is
    whether it holds ``c``.

    Symbolically the set is an uninterpreted predicate over every chunk index and the
    invariant a quantified statement about all of it (any state of any history); on ints
    it is realized as ``{c}`` or nothing.
    """
    chunk, flag = env["c"], env["oc"] == 1
    if not env.symbolic:
        return [implies(flag, chunk < next_index)], flag
    import z3  # only the prover gets here (reproducers replay on ints without Z3)

    offered = z3.Function("offered", z3.IntSort(), z3.BoolSort())
    other = z3.Int("offered_chunk")
    invariant = z3.ForAll([other], z3.Implies(offered(other), other < next_index))
    at_chunk: Bool = offered(chunk)
    return [invariant, at_chunk == flag], at_chunk


def _summary(env: Env) -> tuple[list[Bool], Bool, Num]:
    """The mask over chunk ``c``'s blocks as ``StoreTracker.step`` summarizes it: whether a
    block is marked (``hm``) and the first marked block (``fm``); any values (the mask
    is uninterpreted)."""
    return [in_range(env["hm"], 0, 2)], env["hm"] == 1, env["fm"]


def _step_inputs(env: Env) -> list[Bool]:
    return [env["T"] >= 1, env["n"] >= 0, env["tokens"] >= 0, env["P"] >= 0, env["M"] >= 0,
            env["c"] >= 0, in_range(env["capped"], 0, 2), in_range(env["oc"], 0, 2)]


# -- C8: no chunk twice, the index never moves back ------------------------------------
_OFFER_CHOICES: tuple[Choice, ...] = (("st", _statuses), ("eagle", _flags), ("capped", _cap))


def _step_from_invariant(
    env: Env, choices: tuple[Choice, ...]
) -> tuple[list[Bool], Bool, Num, Bool]:
    """The hypotheses of one store step from a state satisfying the invariant (the step's
    inputs, the mask summary, the choices' domains, the offered set below the index):
    ``(hypotheses, has_marked, first_marked, was_offered)``."""
    summary_hyps, has_marked, first_marked = _summary(env)
    invariant, was_offered = _offered_before(env, env["n"])
    hyps: list[Bool] = [*_step_inputs(env), *summary_hyps, *_choice_domains(env, choices),
                        *invariant]
    return hyps, has_marked, first_marked, was_offered


def offers_once(env: Env, impl: Implementation) -> tuple[list[Bool], Bool]:
    """One store step from a state satisfying the invariant: it offers no chunk offered
    before, keeps the invariant, never lowers the stored index, and offers only chunks
    with a marked block."""
    n, chunk = env["n"], env["c"]
    hyps, has_marked, first_marked, was_offered = _step_from_invariant(env, _OFFER_CHOICES)
    if impl is HYPOTHESES_ONLY:
        return hyps, True
    env.assume(hyps)

    def goal(chosen: dict[str, Any]) -> Bool:
        status = chosen["st"]
        first, end, next_after, _ = env.call(
            impl.store_step_bounds, status, env["tokens"], env["P"], chosen["capped"],
            env["T"], chosen["eagle"], n)
        offer, _unstorable = env.call(impl.store_chunk_offered, status, was_offered,
                                      has_marked, first_marked, env["fl"])
        offers = and_(in_range(chunk, first, end), offer)
        return and_(
            not_(and_(was_offered, offers)),  # C8: never offered twice
            next_after >= n,  # the stored index never moves back
            implies(or_(was_offered, offers), chunk < next_after),  # the invariant, after
            implies(offers, has_marked),  # only chunks the mask marks (C8 demand, lemma)
        )

    return hyps, _for_each(env, _OFFER_CHOICES, goal)


# -- C9: the spec's step, at the spec's horizon ----------------------------------------
_HORIZON_CHOICES: tuple[Choice, ...] = (*_OFFER_CHOICES, ("interval", _retention))


def refines_spec_step(env: Env, impl: Implementation) -> tuple[list[Bool], Bool]:
    """One store step from a state satisfying the invariant offers exactly what the
    spec's step offers (``spec.properties.store.spec_step_offers``: candidates from the
    stored index, from chunk 0 on finish or abort, up to the storable chunks; not offered
    before; a marked block, none freed), leaves the spec's stored index, and passes the
    mask the spec's final-segment horizon (the prompt's while running, the real one on
    finish or abort, none under a retention interval)."""
    n, chunk, tokens, tpc = env["n"], env["c"], env["tokens"], env["T"]
    hyps, has_marked, first_marked, was_offered = _step_from_invariant(env, _HORIZON_CHOICES)
    hyps.append(env["R"] >= 0)
    if impl is HYPOTHESES_ONLY:
        return hyps, True
    env.assume(hyps)

    def goal(chosen: dict[str, Any]) -> Bool:
        status, eagle, cap, retention = (chosen["st"], chosen["eagle"], chosen["capped"],
                                         chosen["interval"])
        first, end, next_after, horizon = env.call(
            impl.store_step_bounds, status, tokens, env["P"], cap, tpc, eagle, n)
        final = env.call(impl.store_final_segment_end, status, horizon, end, retention)
        offer, _unstorable = env.call(impl.store_chunk_offered, status, was_offered,
                                      has_marked, first_marked, env["fl"])
        # The spec's step (spec_step_offers and step_bounds of spec/properties/store.py).
        storable = storable_chunks(tokens, tpc, eagle, status)
        prompt_tokens = env["P"] if cap is None else min_(env["P"], cap)
        spec_final = final_segment_end_chunk(status, floordiv(prompt_tokens, tpc), storable,
                                             retention)
        spec_first = 0 if status in ENDED_STATUSES else n
        spec_offers = and_(in_range(chunk, spec_first, storable), not_(was_offered),
                           has_marked, first_marked >= env["fl"])
        if final is None or spec_final is None:
            same_horizon: Bool = final is None and spec_final is None
        else:
            same_horizon = final == spec_final
        return and_(
            and_(in_range(chunk, first, end), offer) == spec_offers,
            next_after == max_(n, storable),
            same_horizon,
        )

    return hyps, _for_each(env, _HORIZON_CHOICES, goal)


# -- C10: well-formed stores --------------------------------------------------------------
_FORMED_CHOICES: tuple[Choice, ...] = (*_OFFER_CHOICES, ("po", _flags))


def _committed(env: Env, status: RequestStatus) -> tuple[list[Bool], Num]:
    """A step's well-formedness and the tokens whose KV exists after it: what this step
    computes while running; what was computed on abort; on finish everything but the
    final sampled slot (``num_tokens = num_computed + 1``, the prompt computed), or, for
    a request finished before its prefill completed (an error finish: vLLM's
    ``FINISHED_ERROR``, no token sampled, ``num_tokens`` the prompt), what it computed."""
    computed, scheduled, num_tokens, prompt = env["nc"], env["ns"], env["nt"], env["P"]
    if status is RequestStatus.PREFILLING:
        return [computed + scheduled <= prompt], computed + scheduled
    if status is RequestStatus.DECODING:
        return [computed >= prompt, num_tokens == computed + scheduled], computed + scheduled
    if status is RequestStatus.FINISHED:
        return [or_(and_(computed >= prompt, num_tokens == computed + 1),
                    and_(computed < prompt, num_tokens == prompt))], computed
    return [], computed


def stores_well_formed(env: Env, impl: Implementation) -> tuple[list[Bool], Bool]:
    """Every chunk a step offers is complete within the offloadable tokens, which never
    exceed the committed ones (the prompt with ``offload_prompt_only``, at most
    ``max_offload_tokens``, never the final sampled slot), and every block of it the mask
    marks is at or past the first live block; the step's candidates start at a chunk
    index (0 or later)."""
    n, chunk, tpc = env["n"], env["c"], env["T"]
    summary_hyps, has_marked, first_marked = _summary(env)
    block, block_marked = env["b"], env["mb"] == 1
    hyps: list[Bool] = [
        tpc >= 1, n >= 0, chunk >= 0, env["P"] >= 0, env["M"] >= 0, env["nc"] >= 0,
        env["ns"] >= 0, env["nt"] >= 0, in_range(env["oc"], 0, 2), in_range(env["mb"], 0, 2),
        *summary_hyps, *_choice_domains(env, _FORMED_CHOICES),
        # b is any block of the chunk; the summary's first marked block is the least.
        implies(block_marked, and_(has_marked, first_marked <= block)),
    ]
    for index, status in enumerate(STATUSES):
        step_hyps, _ = _committed(env, status)
        hyps += [implies(env["st"] == index, h) for h in step_hyps]
    if impl is HYPOTHESES_ONLY:
        return hyps, True
    env.assume(hyps)
    was_offered = env["oc"] == 1

    def goal(chosen: dict[str, Any]) -> Bool:
        status, cap, prompt_only = chosen["st"], chosen["capped"], chosen["po"]
        tokens = env.call(impl.get_num_offloadable_tokens, status, env["nc"], env["ns"],
                          env["nt"], env["P"], cap, prompt_only)
        first, end, _, _ = env.call(impl.store_step_bounds, status, tokens, env["P"], cap,
                                    tpc, chosen["eagle"], n)
        offer, _unstorable = env.call(impl.store_chunk_offered, status, was_offered,
                                      has_marked, first_marked, env["fl"])
        offers = and_(in_range(chunk, first, end), offer)
        _, committed = _committed(env, status)
        # The chunk ends within the offloadable tokens ((c + 1) * T <= tokens, stated
        # as c < tokens // T for T >= 1: linear in the lifted term), and those lie within
        # the committed ones: together the chunk ends within what is committed.
        # The candidates are chunk indices (a negative one would name no chunk: its
        # key, read from the end of the request's hashes, is another chunk's).
        return and_(first >= 0, implies(offers, and_(
            chunk < floordiv(tokens, tpc),
            tokens <= committed,
            implies(prompt_only, tokens <= env["P"]),
            True if cap is None else tokens <= cap,
            implies(block_marked, block >= env["fl"]),  # C10: no freed (null) block
        )))

    return hyps, _for_each(env, _FORMED_CHOICES, goal)


# -- what a witness shows ------------------------------------------------------------------
def _replayed_step(values: Mapping[str, int], impl: Implementation) -> tuple[str, bool, int]:
    """A witness's step on ints: its description (bounds, what it does with chunk ``c``
    and, for the refinement, the final-segment end it passes against the spec's),
    whether it offers ``c``, and its offloadable tokens."""
    status = STATUSES[values["st"]]
    eagle = values["eagle"] == 1
    cap = values["M"] if values["capped"] == 1 else None
    tpc, prompt, n, chunk = values["T"], values["P"], values["n"], values["c"]
    if "tokens" in values:
        tokens = values["tokens"]
    else:
        tokens = impl.get_num_offloadable_tokens(status, values["nc"], values["ns"],
                                                 values["nt"], prompt, cap, values["po"] == 1)
    first, end, next_after, horizon = impl.store_step_bounds(status, tokens, prompt, cap,
                                                             tpc, eagle, n)
    offer, _ = impl.store_chunk_offered(status, values["oc"] == 1, values["hm"] == 1,
                                        values["fm"], values["fl"])
    offered = first <= chunk < end and bool(offer)
    before = "offered before" if values["oc"] == 1 else "not offered before"
    shown = (f"a {status.value} step of {tokens} offloadable tokens: candidates "
             f"[{first}, {end}), stored index {n} -> {next_after}; chunk {chunk} ({before}) "
             f"{'is offered' if offered else 'is not offered'}")
    if "interval" in values:
        retention = None if values["interval"] == 0 else values["R"]
        final = impl.store_final_segment_end(status, horizon, end, retention)
        storable = storable_chunks(tokens, tpc, eagle, status)
        prompt_tokens = prompt if cap is None else min(prompt, cap)
        spec_final = final_segment_end_chunk(status, prompt_tokens // tpc, storable, retention)
        shown += f"; final segment end {final}, the spec's {spec_final}"
    return shown, offered, int(tokens)


def observed_step(values: Mapping[str, int], impl: Implementation) -> str:
    """The step of a witness in words (added to a violation's message)."""
    return _replayed_step(values, impl)[0]


def step_picture(values: Mapping[str, int], impl: Implementation) -> Picture:
    """The witness's chunk ``c`` on the token axis of one group of ``T``-token chunks (one
    block per chunk: the mask is uninterpreted), offered or not, with the step in words."""
    shown, offered, tokens = _replayed_step(values, impl)
    tpc, chunk = max(1, values["T"]), max(0, values["c"])
    num_tokens = max(1, tokens, (chunk + 1) * tpc, values["P"])
    return Picture(Geometry((fa(tpc),)), num_tokens, None, 0,
                   stored={0: {chunk} if offered else set()}, offending={0: {chunk}},
                   notes=[shown])


# -- the catalogue ----------------------------------------------------------------------------
def _chunk_sizes() -> list[Config]:
    """The case split if a symbolic query is undecided: a few chunk sizes."""
    return [Config(f"T={tpc}", {"T": tpc}) for tpc in (1, 2, 4, 16)]


def _step_text(lifted: str) -> str:
    """What the query takes for the step: the implementation's own functions, lifted."""
    return (f"the step is StoreTracker.step over the implementation's own {lifted} "
            "(lifted), its loop over the candidate range and its summary of the mask over a "
            "chunk (whether a block is marked, the first marked one) taken as written; the "
            "mask is uninterpreted, so this holds for every block size, window and mask")


STEP_INDUCTION = (
    "induction over store steps (any status: prefilling, decoding, finished, aborted; any "
    "offloadable token count, chunk size and stored index) from every state where each "
    "chunk offered so far lies below next_stored_chunk_idx (the offered set an "
    "uninterpreted predicate; a fresh tracker and mark_computed establish it)"
)


def unbounded_store_properties() -> list[FormulaProperty]:
    return [
        InductiveProperty(
            "C8", "store-steps-offer-once",
            "one store step of any size keeps every offered chunk below the stored index, "
            "offers no chunk twice, never moves the index back, and offers only chunks "
            "the mask marks",
            ("st", "eagle", "capped", "n", "c", "oc", "hm", "fm", "fl", "tokens", "P", "M"),
            offers_once, _chunk_sizes, "T in {1,2,4,16}",
            uses=("store_chunk_offered", "store_step_bounds"), symbolic_sizes=("T",),
            symbolic_rlimit=2_000_000, observed=observed_step,
            picture=step_picture,
            induction=STEP_INDUCTION + "; " + _step_text(
                "store_step_bounds and store_chunk_offered") + "; that an offered chunk "
            "is demanded is the lemma "
            "C8/stored-blocks-demanded (a block the mask marks below the horizon is "
            "demanded by a reachable boundary: non-EAGLE, retention none, every size) "
            "at the horizon of C9/store-steps-refine-spec",
        ),
        InductiveProperty(
            "C9", "store-steps-refine-spec",
            "one store step offers exactly the spec's step (no final tail at an "
            "intermediate frontier; finish and abort recompute it at the real horizon) "
            "and leaves the spec's stored index",
            ("st", "eagle", "capped", "interval", "n", "c", "oc", "hm", "fm", "fl", "tokens",
             "P", "M", "R"),
            refines_spec_step, _chunk_sizes, "T in {1,2,4,16}",
            uses=("store_final_segment_end", "store_step_bounds", "store_chunk_offered"),
            symbolic_sizes=("T",), symbolic_rlimit=2_000_000, observed=observed_step,
            picture=step_picture,
            induction=STEP_INDUCTION + "; " + _step_text(
                "store_step_bounds, store_final_segment_end and store_chunk_offered")
            + "; the spec's step is spec_step_offers with the same mask summary",
        ),
        InductiveProperty(
            "C10", "store-steps-well-formed",
            "every chunk a store step offers is complete within the offloadable tokens, "
            "which never exceed the committed ones, and has no marked block below the "
            "first live block; the candidates start at chunk 0 or later",
            ("st", "eagle", "capped", "po", "n", "c", "oc", "hm", "fm", "fl", "b", "mb",
             "nc", "ns", "nt", "P", "M"),
            stores_well_formed, _chunk_sizes, "T in {1,2,4,16}",
            uses=("get_num_offloadable_tokens", "store_chunk_offered", "store_step_bounds"),
            symbolic_sizes=("T",), symbolic_rlimit=2_000_000, observed=observed_step,
            picture=step_picture,
            induction="each store step alone, from any state (it needs no invariant, so "
            "it holds at every step of every schedule): any status, token counts, chunk "
            "size and stored index; " + _step_text(
                "get_num_offloadable_tokens, store_step_bounds and store_chunk_offered")
            + "; the first live block is any value (C1/retained-blocks-exact proves the "
            "implementation's)",
        ),
    ]


__all__ = [
    "STATUSES",
    "observed_step",
    "offers_once",
    "refines_spec_step",
    "step_picture",
    "stores_well_formed",
    "unbounded_store_properties",
]
