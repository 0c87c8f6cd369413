"""``audit --live`` (tools/audit/live_stage): a defect's lost hit replayed on vLLM's own
scheduler is confirmed, a case vLLM serves is "not reproduced", and what cannot run is
"not replayable" with the reason."""

from __future__ import annotations

from typing import Any

from tests.live.conftest import _FOUND, needs_eagle_planning, needs_vllm

from kvcontract.spec.geometry import Geometry, GroupSpec
from kvcontract.spec.properties.end_to_end import resend_case
from kvcontract.tools.audit.live_stage import confirm_defects
from kvcontract.vocabulary import GroupKind


def _geometry(eagle: bool) -> Geometry:
    return Geometry(groups=(GroupSpec(GroupKind.FULL, 16),
                            GroupSpec(GroupKind.SLIDING_WINDOW, 4, sliding_window=8,
                                      eagle=eagle)),
                    blocks_per_chunk=1, retention_interval=0)


def _defect(identity: str, eagle: bool, impact: str = "lost-hit") -> dict[str, Any]:
    case = resend_case("FA16+SWA4(sw8)", _geometry(eagle), 33).to_json()
    return {"id": identity, "latent": False, "impact": impact,
            "witness": {"theorem": "C12/upstream-no-lost-hits", "witness": case}}


def _report(*defects: dict[str, Any], release: str | None = None) -> dict[str, Any]:
    return {"vllm_version": release or _FOUND.vllm_version, "defects": list(defects)}


@needs_vllm
@needs_eagle_planning
def test_a_lost_hit_vllm_loses_is_confirmed_and_one_it_serves_is_not_reproduced() -> None:
    # The EAGLE replay boundary at retention 0: vLLM 0.33.0 stores for P - 1 alone, so the
    # resend of 33 tokens gets nothing where the spec promises 16. Without EAGLE, vLLM
    # serves the promise: a report claiming a loss there would be a stand-in's error.
    report = _report(_defect("Deagle0000000", eagle=True),
                     _defect("Dplain0000000", eagle=False),
                     _defect("Dwaste0000000", eagle=False, impact="waste"))
    confirm_defects(report, None)
    eagle, plain, waste = report["defects"]
    assert eagle["live"]["status"] == "confirmed", eagle["live"]
    replay = eagle["live"]["replays"][0]
    assert replay["observed_hit"] == 0 and replay["gpu_promise"] == 16
    assert plain["live"]["status"] == "not reproduced", plain["live"]
    assert plain["live"]["replays"][0]["observed_hit"] >= 16
    assert waste["live"]["status"] == "not replayable"
    assert report["live"]["vllm"] == _FOUND.vllm_version


@needs_vllm
def test_another_release_than_the_installed_one_is_not_replayable() -> None:
    report = _report(_defect("Deagle0000000", eagle=True), release="0.28.0")
    confirm_defects(report, None)
    live = report["defects"][0]["live"]
    assert live["status"] == "not replayable"
    assert "0.28.0" in live["why"] and str(_FOUND.vllm_version) in live["why"]
