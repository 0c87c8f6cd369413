"""Scanner properties (C2, C3, C4): the implementation's sliding-window scan on every
lookup-state sequence of a bounded length, judged against the declarative scanner
(:func:`kvcontract.spec.lookup.sliding_window_answer`, the rightmost complete window).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from kvcontract.impl.bundle import Implementation
from kvcontract.spec.geometry import Geometry, swa
from kvcontract.spec.lookup import (
    HIT,
    HIT_PENDING,
    RETRY,
    LookupResult,
    ScanAnswer,
    sliding_window_answer,
)
from kvcontract.spec.properties.base import (
    CaseProperty,
    CaseSpace,
    Family,
    LastCase,
    Picture,
    is_count,
)

SCAN_MAX_LENGTH = 6
SCAN_WINDOWS = (1, 2, 3)
ALL_STATES = tuple(LookupResult)


@dataclass(frozen=True)
class ScanCase:
    states: tuple[LookupResult, ...]
    initial_window: int
    window: int

    def to_json(self) -> dict[str, Any]:
        return {
            "states": [s.name for s in self.states],
            "initial_window": self.initial_window,
            "window": self.window,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ScanCase:
        return cls(tuple(LookupResult[str(name)] for name in data["states"]),
                   _positive(data, "initial_window"), _positive(data, "window"))


def _positive(data: Mapping[str, Any], key: str) -> int:
    value = data[key]
    if not is_count(value, 1):
        raise ValueError(f"{key} must be a positive integer, not {value!r}")
    return value


def scan_cases() -> Iterator[ScanCase]:
    for length in range(1, SCAN_MAX_LENGTH + 1):
        for window in SCAN_WINDOWS:
            for initial in (window, window + 1):
                for states in itertools.product(ALL_STATES, repeat=length):
                    yield ScanCase(states, initial, window)


def scan_domain() -> str:
    return (
        f"all {len(ALL_STATES)}^n lookup-state sequences, n <= {SCAN_MAX_LENGTH}, "
        f"W in {set(SCAN_WINDOWS)}, initial in {{W, W+1}} (the bounded cross-check of "
        "C3/scan-refines-spec, which covers every length)"
    )


def _run_scan(case: ScanCase, impl: Implementation) -> int | None:
    """The implementation's answer: the end of the accepted window, or None (defer)."""
    states = case.states
    found: int | None = impl.sliding_window_lookup(
        lambda k: states[k], 0, len(states), case.initial_window, case.window
    )
    return found


run_scan: LastCase[ScanCase, int | None] = LastCase(_run_scan)


def _scan_answer(case: ScanCase, _impl: Any = None) -> ScanAnswer:
    return sliding_window_answer(list(case.states), case.initial_window, case.window)


scan_answer: LastCase[ScanCase, ScanAnswer] = LastCase(_scan_answer)


SCAN_SPACE: CaseSpace[ScanCase, int | None] = CaseSpace(
    family=Family.SCAN, cases=scan_cases, describe=scan_domain, to_json=ScanCase.to_json,
    from_json=ScanCase.from_json, observe=run_scan,
)


def _required(case: ScanCase, end: int) -> int:
    return case.initial_window if end == len(case.states) else case.window


def _accepted_keys(case: ScanCase, found: int) -> range:
    return range(max(0, found - _required(case, found)), found)


def accepts_only_hit(case: ScanCase, found: int | None) -> str | None:
    if found is None:
        return None
    keys = _accepted_keys(case, found)
    bad = [k for k in keys if case.states[k] != HIT]
    if bad:
        return (
            f"the scan accepted keys [{keys.start}, {found}) but key {bad[0]} is "
            f"{case.states[bad[0]].name}, not HIT"
        )
    return None


def defers_only_in_scope(case: ScanCase, found: int | None) -> str | None:
    spec = scan_answer(case)
    if found is None and not spec.deferred:
        return (
            f"the scan deferred, but no RETRY was scanned and no pending key lies in the "
            f"window [{spec.window_start}, {spec.end}) it would use"
        )
    return None


def is_maximal(case: ScanCase, found: int | None) -> str | None:
    spec = scan_answer(case)
    if found is not None and not spec.deferred and found != spec.end:
        return f"the scan answered {found}, the rightmost complete window ends at {spec.end}"
    return None


def _picture(offending: Any) -> Any:
    def picture(case: ScanCase, impl: Implementation) -> Picture:
        found = run_scan(case, impl)
        spec = scan_answer(case)
        window = case.window
        return Picture(
            Geometry((swa(1, max(2, window + 1)),)), len(case.states), None, 0,
            states={0: list(case.states)}, stored={0: set()},
            windows={0: (int(spec.window_start), int(spec.end))},
            offending={0: offending(case, found, spec)},
            notes=[f"implementation answer: {'defer' if found is None else found}; spec "
                   f"answer: {'defer' if spec.deferred else spec.end} "
                   f"(window [{spec.window_start}, {spec.end}))"],
        )

    return picture


def _non_hit_accepted(case: ScanCase, found: int | None, spec: ScanAnswer) -> set[int]:
    if found is None:
        return set()
    return {k for k in _accepted_keys(case, found) if case.states[k] != HIT}


def _deferring_outside(case: ScanCase, found: int | None, spec: ScanAnswer) -> set[int]:
    return {k for k, s in enumerate(case.states)
            if s in (HIT_PENDING, RETRY) and not spec.window_start <= k < spec.end}


def _between_answers(case: ScanCase, found: int | None, spec: ScanAnswer) -> set[int]:
    if found is None:
        return set()
    lo, hi = sorted((found, int(spec.end)))
    return set(range(lo, hi))


USES = ("sliding_window_lookup",)


def scan_properties() -> list[CaseProperty]:
    return [
        CaseProperty("C2", "scan-accepts-only-hit",
                     "a non-deferred sliding-window scan accepts only HIT keys",
                     SCAN_SPACE, accepts_only_hit, USES, _picture(_non_hit_accepted)),
        CaseProperty("C3", "scan-defers-only-in-scope",
                     "the scan defers only for a RETRY or a pending key in the window it "
                     "would use",
                     SCAN_SPACE, defers_only_in_scope, USES, _picture(_deferring_outside)),
        CaseProperty("C4", "scan-is-maximal",
                     "a non-deferred scan answers the rightmost complete window",
                     SCAN_SPACE, is_maximal, USES, _picture(_between_answers)),
    ]
