"""The vocabulary module: verdicts, exit codes, statuses, kinds, impacts (issue #10, 3)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from kvcontract import vocabulary as v
from kvcontract.vocabulary import (
    DEFAULT_FAIL_ON,
    EXIT_COUNTEREXAMPLE,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_UNKNOWN,
    EXIT_USAGE,
    GroupKind,
    Impact,
    LookupResult,
    Outcome,
    RequestStatus,
    Verdict,
    exit_code_for,
    worst_exit_code,
)

PASSING = {Verdict.PROVED, Verdict.PROVED_FOR_DOMAIN, Verdict.TESTED, Verdict.PASSED}


def test_exit_code_constants() -> None:
    assert (EXIT_OK, EXIT_COUNTEREXAMPLE, EXIT_USAGE, EXIT_UNKNOWN) == (0, 1, 2, 3)
    assert (EXIT_INTERNAL, EXIT_INTERRUPTED) == (4, 130)
    assert v.EXIT_FINDING == EXIT_COUNTEREXAMPLE


@pytest.mark.parametrize(
    ("verdict", "passed", "code", "outcome"),
    [
        (Verdict.PROVED, True, 0, Outcome.PASS),
        (Verdict.PROVED_FOR_DOMAIN, True, 0, Outcome.PASS),
        (Verdict.TESTED, True, 0, Outcome.PASS),
        (Verdict.PASSED, True, 0, Outcome.PASS),
        (Verdict.COUNTEREXAMPLE, False, 1, Outcome.FAIL),
        (Verdict.UNKNOWN, False, 3, Outcome.ERROR),
        (Verdict.VACUOUS, False, 3, Outcome.ERROR),
    ],
)
def test_each_verdict(verdict: Verdict, passed: bool, code: int, outcome: Outcome) -> None:
    assert verdict.passed is passed
    assert verdict.exit_code == code
    assert verdict.outcome is outcome
    assert exit_code_for([verdict]) == code


def test_every_verdict_is_covered() -> None:
    assert {x for x in Verdict if x.passed} == PASSING
    assert len(Verdict) == 7


@pytest.mark.parametrize(
    ("verdicts", "code"),
    [
        ([Verdict.PROVED, Verdict.PROVED_FOR_DOMAIN, Verdict.TESTED, Verdict.PASSED], 0),
        ([Verdict.PROVED, Verdict.UNKNOWN], 3),
        ([Verdict.VACUOUS, Verdict.PROVED], 3),
        ([Verdict.UNKNOWN, Verdict.COUNTEREXAMPLE], 1),  # a counterexample beats unknown
        ([Verdict.COUNTEREXAMPLE, Verdict.VACUOUS, Verdict.PROVED], 1),
        (["PROVED", "COUNTEREXAMPLE"], 1),  # the strings of a JSON report
        (["TESTED", "UNKNOWN"], 3),
    ],
)
def test_policy_on_mixed_lists(verdicts: list[Verdict | str], code: int) -> None:
    assert exit_code_for(verdicts) == code
    assert Verdict.exit_code_for(verdicts) == code
    assert exit_code_for(iter(verdicts)) == code  # any iterable, consumed once


def test_empty_list() -> None:
    # Today's behaviour: a run with no result exits 0 (prove's selection, fuzz, reports);
    # the audit, where checking nothing decides nothing, asks for 3.
    assert exit_code_for([]) == EXIT_OK
    assert exit_code_for([], empty=EXIT_UNKNOWN) == EXIT_UNKNOWN
    assert exit_code_for([Verdict.PROVED], empty=EXIT_UNKNOWN) == EXIT_OK


def test_unknown_verdict_string_is_rejected() -> None:
    with pytest.raises(ValueError):
        exit_code_for(["MAYBE"])


def test_worst_exit_code() -> None:
    assert worst_exit_code([]) == EXIT_OK
    assert worst_exit_code([], empty=EXIT_UNKNOWN) == EXIT_UNKNOWN
    assert worst_exit_code([0, 3, 0]) == 3
    assert worst_exit_code([3, 1]) == 1
    assert worst_exit_code([1, 3]) == 1
    assert worst_exit_code([1, 2]) == 2
    assert worst_exit_code([2, 4]) == 4
    assert worst_exit_code([4, 130, 1]) == 130
    with pytest.raises(ValueError):
        worst_exit_code([5])


def test_labels() -> None:
    assert [x.display for x in Verdict] == [x.value for x in Verdict]
    assert Verdict.PROVED_FOR_DOMAIN.display == "PROVED-FOR-DOMAIN"
    shorts = {x: x.short for x in Verdict}
    assert shorts[Verdict.PROVED_FOR_DOMAIN] == "DOMAIN"
    assert shorts[Verdict.COUNTEREXAMPLE] == "CEX"
    assert len(set(shorts.values())) == len(Verdict)
    assert len({x.display for x in Verdict}) == len(Verdict)
    assert all(len(s) <= 7 for s in shorts.values())


def test_verdicts_round_trip_as_strings() -> None:
    for x in Verdict:
        assert Verdict(x.value) is x
        assert x == x.value
        assert json.loads(json.dumps({"verdict": x.value})) == {"verdict": x}


def test_request_status_equals_legacy_strings() -> None:
    legacy = ["prefilling", "decoding", "finished", "aborted"]
    assert [s.value for s in RequestStatus] == legacy
    for status, word in zip(RequestStatus, legacy, strict=True):
        assert status == word
        assert word == status
        assert hash(status) == hash(word)
        assert RequestStatus(word) is status
    assert "finished" in v.ENDED_STATUSES and "aborted" in v.ENDED_STATUSES
    assert "decoding" not in v.ENDED_STATUSES
    assert [s.ended for s in RequestStatus] == [False, False, True, True]


def test_lookup_results_and_group_kinds() -> None:
    assert [(r.name, int(r)) for r in LookupResult] == [
        ("MISS", 0), ("HIT", 1), ("HIT_PENDING", 2), ("RETRY", 3)
    ]
    assert [k.value for k in GroupKind] == ["full", "sliding_window", "mamba"]


def test_impact_values() -> None:
    assert {i.name: i.value for i in Impact} == {
        "CRASH": "crash",
        "CORRUPTION": "corruption",
        "LOST_HIT": "lost-hit",
        "STALL": "stall",
        "DELAY": "delay",
        "WASTE": "waste",
        "LATENT": "latent",
    }
    # Most severe first: an unbounded deferral (C13) ranks between a lost hit and a
    # bounded delay, and fails a run by default.
    order = [i.value for i in Impact]
    assert order.index("lost-hit") < order.index("stall") < order.index("delay")
    assert Impact.STALL in DEFAULT_FAIL_ON


def test_old_locations_reexport_the_same_objects() -> None:
    from kvcontract import spec
    from kvcontract.proofs import verdicts
    from kvcontract.spec import geometry, lookup, reachability

    assert lookup.LookupResult is LookupResult
    assert (lookup.HIT, lookup.MISS, lookup.HIT_PENDING, lookup.RETRY) == (
        LookupResult.HIT, LookupResult.MISS, LookupResult.HIT_PENDING, LookupResult.RETRY
    )
    assert reachability.RequestStatus is RequestStatus
    assert geometry.GroupKind is GroupKind
    assert spec.LookupResult is LookupResult and spec.RequestStatus is RequestStatus
    assert verdicts.Verdict is Verdict
    assert (verdicts.EXIT_OK, verdicts.EXIT_COUNTEREXAMPLE, verdicts.EXIT_USAGE,
            verdicts.EXIT_UNKNOWN) == (0, 1, 2, 3)
    # The definitions live only in the vocabulary.
    for cls in (LookupResult, RequestStatus, GroupKind, Verdict, Impact):
        assert cls.__module__ == "kvcontract.vocabulary"


def test_theorem_results_use_the_policy() -> None:
    from kvcontract.proofs.verdicts import TheoremResult
    from kvcontract.proofs.verdicts import exit_code_for as results_exit_code

    def result(verdict: Verdict) -> TheoremResult:
        return TheoremResult("C1", "t", verdict, "", 0.0)

    assert results_exit_code([]) == 0
    assert results_exit_code([result(Verdict.PROVED), result(Verdict.UNKNOWN)]) == 3
    assert results_exit_code([result(Verdict.VACUOUS), result(Verdict.COUNTEREXAMPLE)]) == 1


def test_imports_without_z3_or_torch() -> None:
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('z3', 'torch'):\n"
        "            raise ImportError('blocked: ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import kvcontract.vocabulary as v\n"
        "assert v.Verdict.PROVED.passed\n"
        "assert 'z3' not in sys.modules and 'torch' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
