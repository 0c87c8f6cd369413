"""The scanner specification proved for every lookup-state sequence up to length 12.

The sequence is a vector of Z3 integer variables in ``[0, 3]`` (the four lookup
results); the declarative scanner of :mod:`kvcontract.spec.lookup` is built over it and
the property is proved for every length, window and initial window in the domain.
These properties are about the spec, so they hold for every implementation (they use
none of its functions); the implementation is tied to the spec by the scanner
properties of :mod:`kvcontract.spec.properties.scan`.
"""

from __future__ import annotations

from collections.abc import Mapping

from kvcontract.impl.bundle import Implementation
from kvcontract.spec.arith import Bool, and_, any_of, implies
from kvcontract.spec.geometry import Geometry, swa
from kvcontract.spec.lookup import (
    HIT_PENDING,
    RETRY,
    LookupResult,
    answer_is_all_hit,
    is_present,
    sliding_window_answer,
)
from kvcontract.spec.properties.base import Config, Env, FormulaProperty, Picture, Statement

SEQUENCE_MAX_LENGTH = 12
SEQUENCE_WINDOWS = (1, 2, 3, 4)


def _configs() -> list[Config]:
    return [
        Config(f"n={n}, W={w}, initial={w + extra}", {"n": n, "W": w, "initial": w + extra})
        for n in range(1, SEQUENCE_MAX_LENGTH + 1)
        for w in SEQUENCE_WINDOWS
        for extra in (0, 1)
    ]


def _states(env: Env) -> tuple[list[object], list[Bool]]:
    # The property has variables s0..s11; only the first n are the sequence.
    states = [env[f"s{k}"] for k in range(env["n"])]
    return states, [and_(s >= 0, s <= 3) for s in states]


def accepts_only_hit(env: Env, impl: Implementation) -> tuple[list[Bool], Bool]:
    states, hyps = _states(env)
    answer = sliding_window_answer(states, env["initial"], env["W"])
    return hyps, answer_is_all_hit(states, answer)


def pending_scope(env: Env, impl: Implementation) -> tuple[list[Bool], Bool]:
    """Without RETRY, the answer defers iff a pending key lies inside its window."""
    states, hyps = _states(env)
    hyps.append(and_(*[s != RETRY for s in states]))
    answer = sliding_window_answer(states, env["initial"], env["W"])
    inside = any_of(
        [
            and_(answer.window_start <= k, k < answer.end, s == HIT_PENDING)
            for k, s in enumerate(states)
        ]
    )
    return hyps, answer.deferred == inside


def rightmost(env: Env, impl: Implementation) -> tuple[list[Bool], Bool]:
    """No complete window of present keys ends right of the answer."""
    states, hyps = _states(env)
    n, window, initial = env["n"], env["W"], env["initial"]
    answer = sliding_window_answer(states, initial, window)
    checks: list[Bool] = []
    for j in range(1, n + 1):
        required = initial if j == n else window
        if j - required < 0:
            continue
        complete = and_(*[is_present(states[k]) for k in range(j - required, j)])
        checks.append(implies(complete, answer.end >= j))
    return hyps, and_(*checks) if checks else True


def _picture(values: Mapping[str, int], impl: Implementation) -> Picture:
    """The witness sequence as the keys of a unit-size window (keys are the axis)."""
    del impl
    states = [LookupResult(values[f"s{k}"] % 4) for k in range(values["n"])]
    window = values["W"]
    answer = sliding_window_answer(list(states), values["initial"], window)
    geometry = Geometry((swa(1, max(2, window + 1)),))
    return Picture(geometry, len(states), None, 0, states={0: states}, stored={0: set()},
                   windows={0: (int(answer.window_start), int(answer.end))},
                   notes=[f"spec answer: {'defer' if answer.deferred else answer.end}"])


def _hit_run_theorem(
    name: str, description: str, statement: Statement, clause: str
) -> FormulaProperty:
    return FormulaProperty(
        clause,
        name,
        description,
        tuple(f"s{k}" for k in range(SEQUENCE_MAX_LENGTH)),
        statement,
        _configs,
        f"every sequence of length n <= {SEQUENCE_MAX_LENGTH}, W in {set(SEQUENCE_WINDOWS)}, "
        "initial in {W, W+1} (the bounded cross-check of C4/spec-scan-fold-is-declarative, "
        "which covers every length)",
        uses=(),
        picture=_picture,
    )


def sequence_properties() -> list[FormulaProperty]:
    return [
        _hit_run_theorem(
            "spec-scan-hit-only", "the specified scan accepts only HIT keys", accepts_only_hit, "C2"
        ),
        _hit_run_theorem(
            "spec-scan-pending-scope",
            "without RETRY the specified scan defers iff a pending key is in its window",
            pending_scope,
            "C3",
        ),
        _hit_run_theorem(
            "spec-scan-rightmost",
            "the specified scan answers the rightmost complete window",
            rightmost,
            "C4",
        ),
    ]
