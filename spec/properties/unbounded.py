"""Unbounded scanner theorems: induction over the keys instead of a bounded length.

Both scanners are folds over a small state (:mod:`kvcontract.spec.lookup`, "scanners as
folds"). Two kinds of theorem cover every sequence length and every window:

* **the spec's induction** (``spec-*-fold-is-declarative``, no implementation call): an
  invariant ties the fold's state after any number of keys to the declarative answer of
  the keys scanned so far (quantified over a symbolic sequence, an uninterpreted
  function of the key index). Base case, one step of any lookup result, and the answer
  read from the state when the fold stops are proved in one query; so the fold's answer
  is the declarative answer for every sequence.
* **the implementation's refinement** (``*-refines-spec``): the implementation's own
  step function (:func:`kvcontract.impl.reference.sliding_window_step`,
  :func:`~kvcontract.impl.reference.prefix_step`), lifted by
  :mod:`kvcontract.spec.symbolic` with a symbolic state and a symbolic lookup result,
  keeps the abstraction relation to the spec's state for one step from every reachable
  spec state, and reads the same answer when it stops. By induction over the keys the
  implementation's scan answers the spec's fold on every sequence.

The refinement needs the scanner to be the reference's fold driver (the same code) over
a step function it calls by name; a scanner written as one loop (a historic variant,
upstream's code under ``audit``) cannot be split into steps, so the prover checks it on
a grid of states instead (:attr:`InductiveProperty.grid`; verdict PROVED-FOR-DOMAIN with
that reason). On plain ints (a counterexample's replay, a reproducer) a refinement
statement realizes the spec state as a key sequence, prepends the step's lookup result
and every extension of at most two keys, and compares the implementation's scanner with
the declarative answer: a symbolic step counterexample is reported only when it shows in
what the scanner answers.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvcontract.impl.bundle import Implementation
from kvcontract.spec.arith import (
    Bool,
    Num,
    all_in,
    and_,
    any_in,
    implies,
    in_range,
    not_,
    or_,
    symbolic_sequence,
)
from kvcontract.spec.geometry import Geometry, fa, swa
from kvcontract.spec.lookup import (
    HIT,
    HIT_PENDING,
    MISS,
    PREFIX_SCAN_START,
    RETRY,
    WINDOW_SCAN_START,
    KeyAt,
    LookupResult,
    PrefixScanState,
    ScanAnswer,
    WindowScanState,
    is_prefix_answer,
    is_present,
    is_sliding_window_answer,
    prefix_answer,
    prefix_spec_step,
    sliding_window_answer,
    sliding_window_spec_step,
    window_complete,
    window_fold_answer,
    window_required,
)
from kvcontract.spec.properties import domains
from kvcontract.spec.properties.base import (
    HYPOTHESES_ONLY,
    Config,
    Env,
    FormulaProperty,
    Picture,
)


class NotAFold(Exception):
    """The implementation's scanner is not the reference's fold over a step function."""


@dataclass(frozen=True)
class InductiveProperty(FormulaProperty):
    """A formula property whose one query is the step of an induction over the keys.

    The prover (:func:`kvcontract.proofs.theorem.prove_formula`) names :attr:`induction`
    in a PROVED verdict's domain. When the implementation's scanner has no step function
    to lift, the statement raises :class:`NotAFold` (a ``LiftError`` to the prover) and
    the prover evaluates the statement on every point of :attr:`grid` on plain ints.
    """

    induction: str = ""
    """What the induction is over and what it assumes, for the domain text."""
    grid: Callable[[], list[dict[str, int]]] = field(default=lambda: [])
    """Every state of a bounded grid: the fallback for a scanner without a step."""
    grid_domain: str = ""
    observed: Callable[[Mapping[str, int], Implementation], str] | None = None
    """The keys a violation shows on and what each side answers (added to messages)."""

    def violation(self, values: Mapping[str, int], impl: Implementation) -> str | None:
        found: str | None = super().violation(values, impl)
        if found is not None and self.observed is not None:
            found += f" ({self.observed(values, impl)})"
        return found

    def replay(self, witness: Mapping[str, Any], impl: Implementation) -> str | None:
        found: str | None = super().replay(witness, impl)
        if found is not None and self.observed is not None:
            found += f" ({self.observed(self.decode(witness), impl)})"
        return found


# -- where the implementation's step function is -----------------------------------------
# The induction takes one thing on trust: the loop that folds the step. These are that
# loop, written as the reference writes it (``impl/reference.py``; a test checks they
# compile to the same code). They are never called: a scanner is recognized as a fold
# when its code is this code, so a scanner whose loop was changed (a mutant of the
# driver, a historic variant, upstream's scanner) is not taken for one. They live here,
# not in the implementation, so that a mutated copy of the implementation's module
# cannot change what counts as the fold.
def _sliding_window_driver(  # pragma: no cover - compared, never run
    lookup: Any, start: int, end: int, initial_window: int, window: int
) -> int | None:
    """The loop of ``sliding_window_lookup`` (a docstring, so the constants line up)."""
    consecutive = 0
    required = initial_window
    defer = False
    pending_in_run = False
    for idx in range(end - 1, start - 1, -1):
        consecutive, required, defer, pending_in_run, complete = sliding_window_step(  # type: ignore[name-defined]  # noqa: F821
            consecutive, required, defer, pending_in_run, lookup(idx), window
        )
        if complete:
            if defer or pending_in_run:
                return None
            found: int = idx + consecutive
            return found
    if defer or pending_in_run:
        return None
    return start + consecutive


def _prefix_driver(lookup: Any, start: int, end: int) -> int | None:  # pragma: no cover
    """The loop of ``prefix_lookup`` (a docstring, so the constants line up)."""
    defer = False
    count = 0
    for idx in range(start, end):
        count, defer, stop = prefix_step(count, defer, lookup(idx))  # type: ignore[name-defined]  # noqa: F821
        if stop:
            break
    if defer:
        return None
    return start + count


def _code_shape(function: Any) -> tuple[Any, ...] | None:
    code = getattr(function, "__code__", None)
    if code is None:
        return None
    # Line numbers, file names and the docstring are left out: only what runs counts.
    constants = tuple(c for c in code.co_consts if not isinstance(c, str))
    return (code.co_code, constants, code.co_names, code.co_varnames, code.co_freevars)


def is_fold_driver(scanner: Any, driver: Callable[..., Any]) -> bool:
    """Whether ``scanner`` runs exactly the loop of ``driver``."""
    shape = _code_shape(scanner)
    return shape is not None and shape == _code_shape(driver)


SLIDING_WINDOW_DRIVER = _sliding_window_driver
PREFIX_DRIVER = _prefix_driver


def fold_step(scanner: Any, driver: Callable[..., Any], step_name: str) -> Callable[..., Any]:
    """The step function ``scanner`` folds over: ``scanner`` must run the trusted loop
    ``driver`` (:data:`SLIDING_WINDOW_DRIVER`, :data:`PREFIX_DRIVER`), which calls
    ``step_name`` from the scanner's own module's globals (a mutated or copied module
    brings its own step along)."""
    if not is_fold_driver(scanner, driver):
        raise NotAFold(
            f"{getattr(scanner, '__qualname__', scanner)!s} is not the reference's fold "
            f"driver over {step_name}: the induction over the keys does not apply"
        )
    step = getattr(scanner, "__globals__", {}).get(step_name)
    if not callable(step):
        raise NotAFold(f"the scanner's module defines no {step_name}")
    return step  # type: ignore[no-any-return]


# -- shared pieces ---------------------------------------------------------------------------
def _flag(env: Env, name: str) -> tuple[Bool, Bool]:
    """A truth value carried as a 0/1 integer variable: (its domain, the value)."""
    value = env[name]
    return in_range(value, 0, 2), value == 1


def _result_domain(value: Num) -> Bool:
    return in_range(value, 0, 4)


def _window_sizes(env: Env) -> list[Bool]:
    # lw(N) <= W + 1 for every boundary (padding < tpc), so the initial window is W or
    # W + 1: the induction's one assumption beyond W >= 1 (a run that touches the end
    # and falls short of I <= W + 1 holds no window of W keys).
    window, initial = env["W"], env["I"]
    return [window >= 1, initial >= window, initial <= window + 1]


def _total(keys: Mapping[int, int]) -> KeyAt:
    """A concrete sequence read at any index (MISS outside the realized keys)."""

    def at(index: Num) -> Num:
        return keys.get(int(index), int(MISS))

    return at


EXTENSIONS: tuple[tuple[int, ...], ...] = tuple(
    ext for length in range(3) for ext in itertools.product(range(4), repeat=length)
)
"""Keys put before (sliding window) or after (prefix) a realized state: a step that
diverges from the spec shows in the scanner's answer within two more keys."""


# -- the sliding-window scan -------------------------------------------------------------------
def _window_state(env: Env) -> tuple[list[Bool], WindowScanState]:
    touches_dom, touches = _flag(env, "touches")
    retry_dom, retry = _flag(env, "retry")
    pending_dom, pending = _flag(env, "pending")
    return [touches_dom, retry_dom, pending_dom], WindowScanState(
        env["run"], touches, retry, pending)


def _window_invariant(
    at: KeyAt, length: Num, initial: Num, window: Num, position: Num, state: WindowScanState
) -> Bool:
    """What the fold's state says about keys ``[position, length)`` before it stops:
    a present run from ``position``, ended by the end or a key that is not present,
    the RETRY and HIT_PENDING flags, the run still short of its window, and no complete
    window right of the run (so the first one the fold completes is the rightmost)."""
    run_end = position + state.run
    return and_(
        state.run >= 0,
        run_end <= length,
        all_in(position, run_end, lambda k: is_present(at(k))),
        state.touches_end == (run_end == length),
        or_(run_end == length, not_(is_present(at(run_end)))),
        state.retry_seen == any_in(position, length, lambda k: at(k) == RETRY),
        state.pending_in_run == any_in(position, run_end, lambda k: at(k) == HIT_PENDING),
        state.run < window_required(state, initial, window),
        all_in(run_end + 1, length + 1,
               lambda j: not_(window_complete(at, j, length, initial, window))),
    )


def _realized_window_keys(values: Mapping[str, int]) -> dict[int, int]:
    """Keys ``[i - 1, n)`` for which the invariant at ``i`` holds with the state's flags:
    the step's result, the run (a HIT_PENDING first if flagged), then a RETRY or a MISS."""
    position, run = values["i"], values["run"]
    keys = {position - 1: values["r"]}
    for k in range(run):
        keys[position + k] = int(HIT)
    if values["pending"] == 1 and run > 0:
        keys[position] = int(HIT_PENDING)
    if values["touches"] != 1:
        keys[position + run] = int(RETRY if values["retry"] == 1 else MISS)
    return keys


def window_fold_is_declarative(env: Env, impl: Implementation) -> tuple[list[Bool], Bool]:
    """Base, step and stop of the induction that the spec's fold answers
    :func:`~kvcontract.spec.lookup.sliding_window_answer` on every sequence."""
    del impl
    window, initial, length, position, result = env["W"], env["I"], env["n"], env["i"], env["r"]
    flag_doms, state = _window_state(env)
    hyps: list[Bool] = [*_window_sizes(env), *flag_doms, length >= 0,
                        in_range(position, 0, length + 1), _result_domain(result)]
    if env.symbolic:
        at = symbolic_sequence("keys")
        hyps.append(all_in(0, length, lambda k: _result_domain(at(k))))
    else:
        at = _total(_realized_window_keys(env.values))
    hyps.append(implies(position >= 1, at(position - 1) == result))
    invariant = _window_invariant(at, length, initial, window, position, state)
    after, complete = sliding_window_spec_step(state, result, initial, window)
    base = _window_invariant(at, length, initial, window, length, WINDOW_SCAN_START)
    step = implies(and_(position >= 1, invariant, not_(complete)),
                   _window_invariant(at, length, initial, window, position - 1, after))
    stop = implies(and_(position >= 1, invariant, complete),
                   is_sliding_window_answer(at, length, initial, window,
                                            window_fold_answer(after, position - 1)))
    exhausted = implies(and_(position == 0, invariant),
                        is_sliding_window_answer(at, length, initial, window,
                                                 window_fold_answer(state, 0)))
    return hyps, and_(base, step, stop, exhausted)


def _realized_window_suffix(run: int, touches: bool, retry: bool, pending: bool) -> list[int]:
    keys = [int(HIT)] * run
    if pending and run > 0:
        keys[0] = int(HIT_PENDING)
    if not touches:
        keys.append(int(RETRY if retry else MISS))
    return keys


def _window_reachable(env: Env, state: WindowScanState) -> list[Bool]:
    """The spec states the fold reaches before it stops (the realization's domain)."""
    return [
        state.run >= 0,
        state.run < window_required(state, env["I"], env["W"]),
        implies(state.pending_in_run, state.run >= 1),
        implies(state.touches_end, not_(state.retry_seen)),
    ]


def _step_refines(
    env: Env, impl: Implementation, hyps: list[Bool],
    observed: Callable[[Mapping[str, int], Implementation], bool],
    scanner: Callable[..., Any], driver: Callable[..., Any], step_name: str,
    goal: Callable[[Callable[..., Any]], Bool],
) -> tuple[list[Bool], Bool]:
    """A statement that one step of the implementation's scan refines the spec's: on
    ints, what ``observed`` sees of whole scans; symbolically, under ``hyps``, the
    ``goal`` of the step function ``scanner`` folds (it must run the trusted loop
    ``driver``: :func:`fold_step`)."""
    if not env.symbolic:
        return hyps, observed(env.values, impl)
    if impl is HYPOTHESES_ONLY:
        return hyps, True
    env.assume(hyps)
    return hyps, goal(fold_step(scanner, driver, step_name))


def window_scan_refines(env: Env, impl: Implementation) -> tuple[list[Bool], Bool]:
    """One step of the implementation's scan keeps it the abstraction of the spec's."""
    window, initial, result = env["W"], env["I"], env["r"]
    flag_doms, state = _window_state(env)
    hyps: list[Bool] = [*_window_sizes(env), *flag_doms, _result_domain(result),
                        *_window_reachable(env, state)]

    def goal(step: Callable[..., Any]) -> Bool:
        required = window_required(state, initial, window)
        consecutive, next_required, defer, pending, complete = env.call(
            step, state.run, required, state.retry_seen, state.pending_in_run, result, window)
        after, spec_complete = sliding_window_spec_step(state, result, initial, window)
        spec_deferred = or_(after.retry_seen, after.pending_in_run)
        # The driver returns None on defer or pending, else position + consecutive: the
        # spec's window_fold_answer of the same position.
        answers_agree = and_(or_(defer, pending) == spec_deferred,
                             or_(spec_deferred, consecutive == after.run))
        still_abstraction = and_(consecutive == after.run,
                                 next_required == window_required(after, initial, window),
                                 defer == after.retry_seen, pending == after.pending_in_run)
        return and_(complete == spec_complete,
                    implies(spec_complete, answers_agree),
                    implies(not_(spec_complete), still_abstraction))

    return _step_refines(env, impl, hyps, _window_scan_observed, impl.sliding_window_lookup,
                         SLIDING_WINDOW_DRIVER, "sliding_window_step", goal)


def _window_scan_difference(
    values: Mapping[str, int], impl: Implementation
) -> tuple[list[LookupResult], int | None, int | None] | None:
    """The first realized key sequence (with an extension of at most two keys to the
    left) where the scanner and the declarative answer differ: keys, scanner, spec."""
    suffix = _realized_window_suffix(values["run"], values["touches"] == 1,
                                     values["retry"] == 1, values["pending"] == 1)
    for extension in EXTENSIONS:
        # Lookup results as the serving code gets them (enum members: a scanner may
        # compare them by identity, as upstream's does).
        keys = [LookupResult(k) for k in (*extension, values["r"], *suffix)]
        got = impl.sliding_window_lookup(keys.__getitem__, 0, len(keys), values["I"],
                                         values["W"])
        want = sliding_window_answer(keys, values["I"], values["W"]).concrete()
        if got != want:
            return keys, got, want
    return None


def _window_scan_observed(values: Mapping[str, int], impl: Implementation) -> bool:
    """On ints: the scanner answers the declarative answer on the realized keys with
    every extension of at most two keys to the left."""
    return _window_scan_difference(values, impl) is None


def _names(keys: Sequence[int]) -> str:
    return " ".join(LookupResult(k).name for k in keys)


def _shown(answer: int | None) -> str:
    return "defer" if answer is None else str(answer)


def _window_observed(values: Mapping[str, int], impl: Implementation) -> str:
    difference = _window_scan_difference(values, impl)
    if difference is None:
        return "no sequence realizing this state shows it"
    keys, got, want = difference
    return (f"keys {_names(keys)}, W={values['W']}, I={values['I']}: the scanner answers "
            f"{_shown(got)}, the spec {_shown(want)}")


def _window_picture(values: Mapping[str, int], impl: Implementation) -> Picture:
    """The realized keys on a unit-size window (keys are the axis)."""
    difference = _window_scan_difference(values, impl)
    suffix = _realized_window_suffix(values["run"], values["touches"] == 1,
                                     values["retry"] == 1, values["pending"] == 1)
    keys = difference[0] if difference else [values["r"], *suffix]
    answer = sliding_window_answer(keys, values["I"], values["W"])
    return Picture(
        Geometry((swa(1, max(2, values["W"] + 1)),)), max(len(keys), 1), None, 0,
        states={0: [LookupResult(k) for k in keys]}, stored={0: set()},
        windows={0: (int(answer.window_start), int(answer.end))},
        notes=[_window_observed(values, impl)])


def _window_grid() -> list[dict[str, int]]:
    return [
        {"W": window, "I": initial, "run": run, "touches": touches, "retry": retry,
         "pending": pending, "r": result}
        for window in (1, 2, 3, 4)
        for initial in (window, window + 1)
        for run in range(initial)
        for touches in (0, 1)
        for retry in (0, 1)
        for pending in (0, 1)
        for result in range(4)
    ]


# -- the prefix scan --------------------------------------------------------------------------
def _prefix_state(env: Env) -> tuple[list[Bool], PrefixScanState]:
    stopped_dom, stopped = _flag(env, "stopped")
    deferred_dom, deferred = _flag(env, "deferred")
    return [stopped_dom, deferred_dom], PrefixScanState(env["end"], stopped, deferred)


def _prefix_invariant(at: KeyAt, position: Num, state: PrefixScanState) -> Bool:
    """What the prefix fold's state says about keys ``[0, position)``."""
    end = state.end
    deferral = any_in(0, end, lambda k: or_(at(k) == RETRY, at(k) == HIT_PENDING))
    stopped = and_(in_range(end, 0, position), at(end) == MISS)
    return and_(
        or_(and_(state.stopped, stopped), and_(not_(state.stopped), end == position)),
        all_in(0, end, lambda k: at(k) != MISS),
        state.deferred == deferral,
    )


def _realized_prefix_keys(values: Mapping[str, int]) -> dict[int, int]:
    end, position = values["end"], values["i"]
    keys = {k: int(HIT) for k in range(position)}
    if values["deferred"] == 1 and end > 0:
        keys[0] = int(HIT_PENDING)
    if values["stopped"] == 1:
        keys[end] = int(MISS)
    keys[position] = values["r"]
    return keys


def prefix_fold_is_declarative(env: Env, impl: Implementation) -> tuple[list[Bool], Bool]:
    """Base, step and end of the induction that the spec's prefix fold answers
    :func:`~kvcontract.spec.lookup.prefix_answer` on every sequence."""
    del impl
    length, position, result = env["n"], env["i"], env["r"]
    flag_doms, state = _prefix_state(env)
    hyps: list[Bool] = [*flag_doms, length >= 0, in_range(position, 0, length + 1),
                        _result_domain(result)]
    if env.symbolic:
        at = symbolic_sequence("keys")
        hyps.append(all_in(0, length, lambda k: _result_domain(at(k))))
    else:
        at = _total(_realized_prefix_keys(env.values))
    hyps.append(implies(position < length, at(position) == result))
    invariant = _prefix_invariant(at, position, state)
    base = _prefix_invariant(at, 0, PREFIX_SCAN_START)
    step = implies(and_(position < length, invariant),
                   _prefix_invariant(at, position + 1, prefix_spec_step(state, result)))
    done = implies(and_(position == length, invariant),
                   is_prefix_answer(at, length, ScanAnswer(state.deferred, state.end, 0)))
    return hyps, and_(base, step, done)


def prefix_scan_refines(env: Env, impl: Implementation) -> tuple[list[Bool], Bool]:
    """One step of the implementation's prefix scan keeps it related to the spec's:
    the same defer, and while not deferred the same count (a RETRY is counted by the
    spec's end but not by the implementation, and always defers)."""
    result, count = env["r"], env["count"]
    flag_doms, state = _prefix_state(env)
    hyps: list[Bool] = [*flag_doms, _result_domain(result), not_(state.stopped),
                        in_range(count, 0, state.end + 1),
                        implies(state.deferred, state.end >= 1),
                        implies(not_(state.deferred), count == state.end)]

    def goal(step: Callable[..., Any]) -> Bool:
        next_count, defer, stop = env.call(step, count, state.deferred, result)
        after = prefix_spec_step(state, result)
        related = and_(defer == after.deferred, or_(after.deferred, next_count == after.end))
        return and_(stop == after.stopped, related)

    return _step_refines(env, impl, hyps, _prefix_scan_observed, impl.prefix_lookup,
                         PREFIX_DRIVER, "prefix_step", goal)


def _prefix_scan_difference(
    values: Mapping[str, int], impl: Implementation
) -> tuple[list[LookupResult], int | None, int | None] | None:
    """The first realized key sequence (the spec state, the step's result and an
    extension of at most two keys) where the prefix scanner and the spec differ."""
    end = values["end"]
    prefix = [int(HIT)] * end
    if values["deferred"] == 1 and end > 0:
        prefix[0] = int(HIT_PENDING)
    for extension in EXTENSIONS:
        keys = [LookupResult(k) for k in (*prefix, values["r"], *extension)]
        got = impl.prefix_lookup(keys.__getitem__, 0, len(keys))
        want = prefix_answer(keys).concrete()
        if got != want:
            return keys, got, want
    return None


def _prefix_scan_observed(values: Mapping[str, int], impl: Implementation) -> bool:
    """On ints: the prefix scanner answers the declarative answer on the realized keys,
    the step's result and every extension of at most two keys to the right."""
    return _prefix_scan_difference(values, impl) is None


def _prefix_observed(values: Mapping[str, int], impl: Implementation) -> str:
    difference = _prefix_scan_difference(values, impl)
    if difference is None:
        return "no sequence realizing this state shows it"
    keys, got, want = difference
    return f"keys {_names(keys)}: the scanner answers {_shown(got)}, the spec {_shown(want)}"


def _prefix_picture(values: Mapping[str, int], impl: Implementation) -> Picture:
    difference = _prefix_scan_difference(values, impl)
    keys = difference[0] if difference else [int(HIT)] * values["end"] + [values["r"]]
    answer = prefix_answer(keys)
    return Picture(
        Geometry((fa(1),)), max(len(keys), 1), None, 0,
        states={0: [LookupResult(k) for k in keys]}, stored={0: set()},
        windows={0: (0, int(answer.end))}, notes=[_prefix_observed(values, impl)])


def _prefix_grid() -> list[dict[str, int]]:
    return [
        {"end": end, "count": count, "stopped": 0, "deferred": deferred, "r": result}
        for end in range(4)
        for count in range(end + 1)
        for deferred in (0, 1)
        for result in range(4)
    ]


# -- the window induction's assumption, discharged for the implementation -----------------
def initial_window_in_range(env: Env, impl: Implementation) -> tuple[list[Bool], Bool]:
    """The scheduler scans with ``I = lw(N)`` and ``W`` from the implementation (EAGLE adds
    one to both): ``1 <= W <= I <= W + 1``, the window induction's assumption."""
    hit, bs, bpc, sw, e = env["N"], env["bs"], env["bpc"], env["sw"], env["e"]
    tpc = bs * bpc
    hyps: list[Bool] = [bs >= 1, bpc >= 1, sw >= 2, e >= 0, hit >= 1]
    env.assume(hyps)
    window = env.call(impl.get_sliding_window_size_in_chunks, sw, e, tpc)
    initial = env.call(impl.load_window_size_in_chunks, hit, sw, e, tpc)
    return hyps, and_(window >= 1, initial >= window, initial <= window + 1)


# -- the catalogue -------------------------------------------------------------------------------
def _sizes(values: Sequence[tuple[int, int]]) -> Callable[[], list[Config]]:
    def configs() -> list[Config]:
        return [Config(f"W={w}, I={i}", {"W": w, "I": i}) for w, i in values]

    return configs


_SMALL_WINDOWS = tuple((w, w + extra) for w in (1, 2, 3, 4) for extra in (0, 1))
WINDOW_INDUCTION = (
    "induction over the keys scanned right to left, for every sequence length n and "
    "every window W >= 1 with initial window I in {W, W+1} (lw(N) <= W + 1)"
)
PREFIX_INDUCTION = "induction over the keys scanned left to right, for every sequence length"


def _fixed(name: str) -> Callable[[], list[Config]]:
    """The case split of a prefix theorem (only if its symbolic query is undecided)."""

    def configs() -> list[Config]:
        return [Config(f"{name}={value}", {name: value}) for value in range(7)]

    return configs


def unbounded_properties() -> list[FormulaProperty]:
    window_grid = ("every spec state of the fold before it stops for W <= 4, I in {W, W+1}, "
                   "every lookup result, with every extension of at most two keys")
    return [
        FormulaProperty(
            "C3", "initial-window-in-range",
            "the scan's windows satisfy the window induction's assumption: "
            "1 <= W <= lw(N) <= W + 1",
            ("N", "sw", "e"), initial_window_in_range, domains.chunk_configs,
            domains.CHUNK_DOMAIN,
            uses=("load_window_size_in_chunks", "get_sliding_window_size_in_chunks"),
            symbolic_sizes=("bs", "bpc"),
        ),
        InductiveProperty(
            "C3", "scan-refines-spec",
            "one step of the implementation's sliding-window scan keeps it the "
            "abstraction of the spec's fold, and it stops with the spec's answer",
            ("run", "touches", "retry", "pending", "r"),
            window_scan_refines, _sizes(_SMALL_WINDOWS),
            "W <= 4, I in {W, W+1}", uses=("sliding_window_lookup",),
            symbolic_sizes=("W", "I"),
            induction=WINDOW_INDUCTION + "; the step is the implementation's own "
            "(sliding_window_step, lifted) under the reference's fold driver; the "
            "assumption on I is C3/initial-window-in-range",
            grid=_window_grid, grid_domain=window_grid, observed=_window_observed,
            picture=_window_picture,
        ),
        InductiveProperty(
            "C4", "spec-scan-fold-is-declarative",
            "the spec's sliding-window fold answers the rightmost complete window (else "
            "the present prefix) with the declarative defer rule",
            ("n", "i", "run", "touches", "retry", "pending", "r"),
            window_fold_is_declarative, _sizes(_SMALL_WINDOWS),
            "W <= 4, I in {W, W+1}", uses=(), symbolic_sizes=("W", "I"),
            # Measured: about 1M resources with quantifiers; room for another Z3 release.
            symbolic_rlimit=10_000_000,
            induction=WINDOW_INDUCTION + " (the sequence is an uninterpreted function)",
        ),
        InductiveProperty(
            "C4", "prefix-refines-spec",
            "one step of the implementation's prefix scan keeps it related to the spec's "
            "fold (same defer; same count unless deferred)",
            ("count", "stopped", "deferred", "r"),
            prefix_scan_refines, _fixed("end"), "end <= 6", uses=("prefix_lookup",),
            symbolic_sizes=("end",),
            induction=PREFIX_INDUCTION + "; the step is the implementation's own "
            "(prefix_step, lifted) under the reference's fold driver",
            grid=_prefix_grid, observed=_prefix_observed, picture=_prefix_picture,
            grid_domain="every related state with end <= 3, every lookup result, with every "
                        "extension of at most two keys",
        ),
        InductiveProperty(
            "C4", "spec-prefix-fold-is-declarative",
            "the spec's prefix fold answers the present keys before the first MISS, "
            "deferred by a RETRY or HIT_PENDING among them",
            ("i", "end", "stopped", "deferred", "r"),
            prefix_fold_is_declarative, _fixed("n"), "n <= 6", uses=(),
            symbolic_sizes=("n",),
            induction=PREFIX_INDUCTION + " (the sequence is an uninterpreted function)",
        ),
    ]


__all__ = [
    "EXTENSIONS",
    "PREFIX_DRIVER",
    "SLIDING_WINDOW_DRIVER",
    "InductiveProperty",
    "NotAFold",
    "fold_step",
    "is_fold_driver",
    "unbounded_properties",
]
