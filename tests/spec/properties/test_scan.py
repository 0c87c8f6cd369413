"""kvcontract.spec.properties.scan: ScanCase, the scan space and its three judges on
upstream's historic table (docs/CONTRACT.md 10: W = 2, I = 3, keys 1..5, key 3 varied)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from kvcontract.impl.variants import REFERENCE, get_implementation
from kvcontract.spec.lookup import HIT, HIT_PENDING, MISS, RETRY, LookupResult
from kvcontract.spec.properties import WitnessError, get_property
from kvcontract.spec.properties.scan import (
    SCAN_SPACE,
    ScanCase,
    accepts_only_hit,
    defers_only_in_scope,
    is_maximal,
    run_scan,
    scan_answer,
    scan_cases,
    scan_domain,
    scan_properties,
)

TABLE = [(MISS, 2), (RETRY, None), (HIT_PENDING, None), (HIT, 5)]


def _historic(key3: LookupResult) -> ScanCase:
    return ScanCase((HIT, HIT, key3, HIT, HIT), initial_window=3, window=2)


def test_json_round_trip() -> None:
    case = _historic(HIT_PENDING)
    data = case.to_json()
    assert data == {"states": ["HIT", "HIT", "HIT_PENDING", "HIT", "HIT"],
                    "initial_window": 3, "window": 2}
    assert ScanCase.from_json(data) == case
    assert SCAN_SPACE.decode(data) == case


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"window": 0}, "window must be a positive integer, not 0"),
        ({"initial_window": -1}, "initial_window must be a positive integer, not -1"),
        ({"window": True}, "window must be a positive integer, not True"),
        ({"window": "2"}, "window must be a positive integer, not '2'"),
        ({"states": ["HIT", "MAYBE"]}, "KeyError: 'MAYBE'"),
    ],
)
def test_decode_rejects_malformed_cases(change: dict[str, Any], problem: str) -> None:
    data = {**_historic(HIT).to_json(), **change}
    with pytest.raises(WitnessError, match="a scan witness cannot be read") as info:
        SCAN_SPACE.decode(data)
    assert problem in str(info.value)


def test_decode_rejects_a_missing_field() -> None:
    with pytest.raises(WitnessError, match="KeyError: 'window'"):
        SCAN_SPACE.decode({"states": ["HIT"], "initial_window": 1})


@pytest.mark.parametrize(("key3", "expected"), TABLE)
def test_reference_on_the_historic_table(key3: LookupResult, expected: int | None) -> None:
    case = _historic(key3)
    assert run_scan(case, REFERENCE) == expected
    for prop in scan_properties():
        assert prop.check(case, REFERENCE) is None, prop.name


@pytest.mark.parametrize(("key3", "expected"), TABLE)
def test_spec_answer_on_the_historic_table(key3: LookupResult, expected: int | None) -> None:
    answer = scan_answer(_historic(key3))
    assert answer.concrete() == expected
    # Key 2 absent (MISS, RETRY): the rightmost complete window is [0, 2) (W = 2); the
    # RETRY right of it defers. Present (HIT, HIT_PENDING): the initial window [2, 5).
    absent = key3 in (MISS, RETRY)
    assert (answer.window_start, answer.end) == ((0, 2) if absent else (2, 5))


def test_before_0_30_every_row_answered_five() -> None:
    # Without the initial window the scan accepted 5 on every row of the table.
    assert accepts_only_hit(_historic(MISS), 5) == (
        "the scan accepted keys [2, 5) but key 2 is MISS, not HIT")
    assert accepts_only_hit(_historic(RETRY), 5) == (
        "the scan accepted keys [2, 5) but key 2 is RETRY, not HIT")
    assert accepts_only_hit(_historic(HIT_PENDING), 5) == (
        "the scan accepted keys [2, 5) but key 2 is HIT_PENDING, not HIT")
    assert accepts_only_hit(_historic(HIT), 5) is None
    assert is_maximal(_historic(MISS), 5) == (
        "the scan answered 5, the rightmost complete window ends at 2")


def test_accepts_only_hit_uses_the_window_of_the_answer() -> None:
    # An answer short of the right end needs W = 2 keys, not I = 3: [0, 2) is all HIT.
    assert accepts_only_hit(_historic(MISS), 2) is None
    case = ScanCase((HIT_PENDING, HIT, MISS, HIT, HIT), 3, 2)
    assert accepts_only_hit(case, 2) == (
        "the scan accepted keys [0, 2) but key 0 is HIT_PENDING, not HIT")
    assert accepts_only_hit(case, None) is None  # a deferral accepts nothing


def test_defers_only_in_scope() -> None:
    assert defers_only_in_scope(_historic(RETRY), None) is None
    assert defers_only_in_scope(_historic(HIT_PENDING), None) is None
    assert defers_only_in_scope(_historic(MISS), None) == (
        "the scan deferred, but no RETRY was scanned and no pending key lies in the "
        "window [0, 2) it would use")
    # docs/CONTRACT.md 8.1: W 2, [HIT, HIT, MISS, HIT_PENDING]: the pending key is out of scope.
    stale = ScanCase((HIT, HIT, MISS, HIT_PENDING), 2, 2)
    assert defers_only_in_scope(stale, None) is not None
    assert defers_only_in_scope(stale, 2) is None


def test_is_maximal() -> None:
    assert is_maximal(_historic(HIT), 5) is None
    assert is_maximal(_historic(HIT), 3) == (
        "the scan answered 3, the rightmost complete window ends at 5")
    assert is_maximal(_historic(HIT), None) is None  # a deferral is C3's business
    assert is_maximal(_historic(RETRY), 2) is None  # the spec defers: no answer to match


def test_stale_pending_variant_is_caught_on_scope_only() -> None:
    stale = ScanCase((HIT, HIT, MISS, HIT_PENDING), 2, 2)
    impl = get_implementation("stale-pending")
    assert run_scan(stale, impl) is None
    assert run_scan(stale, REFERENCE) == 2
    by_name = {p.name: p for p in scan_properties()}
    assert by_name["scan-defers-only-in-scope"].check(stale, impl) is not None
    assert by_name["scan-accepts-only-hit"].check(stale, impl) is None
    assert by_name["scan-is-maximal"].check(stale, impl) is None


def test_run_scan_passes_the_windows_in_order() -> None:
    seen: list[tuple[int, int, int, int]] = []

    def lookup(fn: Any, start: int, end: int, initial: int, window: int) -> int:
        seen.append((start, end, initial, window))
        return fn(end - 1).value

    impl = dataclasses.replace(REFERENCE, sliding_window_lookup=lookup)
    assert run_scan(ScanCase((MISS, RETRY), 3, 1), impl) == RETRY.value
    assert seen == [(0, 2, 3, 1)]


def test_cases_and_domain() -> None:
    cases = list(scan_cases())
    assert len(cases) == sum(4 ** n for n in range(1, 7)) * 3 * 2
    assert len(set(cases)) == len(cases)
    assert cases[0] == ScanCase((MISS,), 1, 1)
    assert [len(c.states) for c in cases] == sorted(len(c.states) for c in cases)
    assert {(c.window, c.initial_window) for c in cases} == {
        (w, w + x) for w in (1, 2, 3) for x in (0, 1)}
    assert scan_domain() == ("all 4^n lookup-state sequences, n <= 6, W in {1, 2, 3}, "
                             "initial in {W, W+1} (the bounded cross-check of "
                             "C3/scan-refines-spec, which covers every length)")


def test_properties_and_pictures() -> None:
    # None may vanish or move; a new clause's property follows (nothing here to edit).
    assert [p.theorem_id for p in scan_properties()][:3] == [
        "C2/scan-accepts-only-hit", "C3/scan-defers-only-in-scope", "C4/scan-is-maximal"]
    assert all(p.uses == ("sliding_window_lookup",) for p in scan_properties())
    stale = ScanCase((HIT, HIT, MISS, HIT_PENDING), 2, 2)
    prop = get_property("C3/scan-defers-only-in-scope")
    picture = prop.draw(stale.to_json(), get_implementation("stale-pending"))
    assert picture.offending == {0: {3}}  # the pending key outside the window [0, 2)
    assert picture.windows == {0: (0, 2)}
    assert picture.states == {0: [HIT, HIT, MISS, HIT_PENDING]}
    assert picture.notes == ["implementation answer: defer; spec answer: 2 (window [0, 2))"]
    wrong = dataclasses.replace(REFERENCE, sliding_window_lookup=lambda *a: 5)
    accepted = get_property("C2/scan-accepts-only-hit").draw(_historic(MISS).to_json(), wrong)
    assert accepted.offending == {0: {2}}
    maximal = get_property("C4/scan-is-maximal").draw(_historic(HIT).to_json(),
                                                      dataclasses.replace(
                                                          REFERENCE,
                                                          sliding_window_lookup=lambda *a: 2))
    assert maximal.offending == {0: {2, 3, 4}}
