"""Partial tails on vLLM's own scheduler (live/partial_tail.py): vLLM turns them
on where docs/CONTRACT.md 9.2 says, the producer stores a partial block at ``b(P)`` in
every group, and the consumer's hit meets the partial-tail promise (C12) with every key
it loads answered HIT and stored (C2). The resend is the quick slice; the other
scenarios run under ``-m slow``."""

from __future__ import annotations

import pytest

from kvcontract.live.partial_tail import PARTIAL_TAIL_GEOMETRY, PartialTailRun, run_partial_tail
from kvcontract.live.scenarios import PARTIAL_TAILS, run_scenario
from tests.live.conftest import has, needs_vllm

pytestmark = [needs_vllm, pytest.mark.live]


def _release_has_partial_tails() -> None:
    if not has("partial-tails"):
        pytest.skip("the installed vLLM has no partial-tail path "
                    "(SchedulerOffloadConfig.supports_partial_tail; 0.33.0 added it)")


def test_resend_is_served_at_the_partial_tail() -> None:
    """P = 230 on FA + Mamba (bs 64, hash 16): complete chunks end at 192, b(P) = 224;
    vLLM ends a prefill step there, stores both groups' blocks keyed at 224, and the
    resend loads them back: its hit is 224, not the complete chunks' 192."""
    _release_has_partial_tails()
    run = run_partial_tail(PARTIAL_TAIL_GEOMETRY, 230, "resend")
    assert isinstance(run, PartialTailRun)
    failed = [check for check in run.checks() if not check[3]]
    assert failed == []
    assert run.supports_partial_tail is True and run.partial_hash_hits is True
    assert (run.boundary, run.promise, run.hit) == (224, 224, 224)
    assert run.partial("store", "producer") == {0: {224}, 1: {224}}
    assert run.partial("load", "consumer") == {0: {224}, 1: {224}}
    # The complete chunks alone would give 192: the partial tail is what serves 224.
    assert run.hit > (230 - 1) // 64 * 64


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in PARTIAL_TAILS
                                  if n not in ("partial-tail-resend",
                                               "partial-tail-being-loaded")])
def test_partial_tail_scenarios_hold(name: str) -> None:
    _release_has_partial_tails()
    result = run_scenario(name)
    assert result.outcome == "clean", result.outcome
    assert [c for c in result.checks if not c.ok] == []


@pytest.mark.slow
def test_a_consumer_short_of_the_key_gets_the_complete_chunks() -> None:
    _release_has_partial_tails()
    result = run_scenario("partial-tail-short-sibling")
    assert (result.numbers["promise"], result.numbers["hit"]) == (0, 192)
    assert result.numbers["partial_loads"] == {}


@pytest.mark.slow
def test_partial_tails_off_when_the_hash_block_is_the_block() -> None:
    _release_has_partial_tails()
    result = run_scenario("partial-tail-off")
    assert result.numbers["supports_partial_tail"] is False
    assert (result.numbers["boundary"], result.numbers["hit"]) == (None, 192)


def test_a_partial_tail_being_loaded_is_not_loaded_again() -> None:
    """The partial tail at b(P) = 224 is being loaded for one resend when a second looks
    it up (docs/CONTRACT.md 9.2, load safety). vLLM 0.34.0 (``partial-tail-anchor``)
    defers the second until the load lands; 0.33.0 loads both groups' keys at 224 a
    second time, the one clause its run fails."""
    _release_has_partial_tails()
    result = run_scenario("partial-tail-being-loaded")
    assert result.outcome == "clean", result.outcome
    failed = [c.what for c in result.checks if not c.ok]
    reached = [c for c in result.checks if "the case is reached" in c.what]
    assert reached and reached[0].ok
    if has("partial-tail-anchor"):
        assert failed == []
        assert result.numbers["partial_loads"]["second"] == {}
    else:
        assert len(failed) == 1 and "being-loaded deferral" in failed[0]
        assert result.numbers["partial_loads"]["second"] == {"0": [224], "1": [224]}
    assert result.numbers["partial_loads"]["first"] == {"0": [224], "1": [224]}


def test_a_partial_tail_campaign_is_clean_and_catches_a_lookup_that_drops_the_tail(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Drawn producer/consumer cases on vLLM's engine (the quick slice of the campaign
    ``kvcontract fuzz --live`` runs): clean as vLLM is; with its partial-tail lookup
    answering no tail, the consumers it served at a sub-chunk boundary lose that hit
    (C12's promise)."""
    _release_has_partial_tails()
    from kvcontract.live.partial_tail import draw_partial_tail_cases, run_partial_tail_campaign

    assert draw_partial_tail_cases(3, 12) == draw_partial_tail_cases(3, 12)
    clean = run_partial_tail_campaign(3, 12)
    assert clean.runs == 12 and clean.violations == [] and clean.served_at_tail > 0
    from kvcontract.tools.runtime_monitor import _scheduler_class

    cls = _scheduler_class()
    assert cls is not None
    monkeypatch.setattr(cls, "_lookup_partial_tail", lambda self, *args: (False, False))
    broken = run_partial_tail_campaign(3, 12)
    assert broken.served_at_tail == 0
    failed = {check["check"] for v in broken.violations for check in v["failed"]}
    assert "C12: the consumer's hit is at least the partial-tail promise" in failed
    assert len(broken.violations) == clean.served_at_tail
