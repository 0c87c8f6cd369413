"""``audit --live`` (tools/audit/live_stage): a defect's lost hit or store-path finding
replayed on vLLM's own scheduler is confirmed, a case vLLM serves is "not reproduced",
what cannot run is "not replayable" with the reason, and a patch runs live as the
installed wheel with the patch's functions laid over it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from audit_live_patches import base_mark, store_patch, window_patch
from conftest import _FOUND, needs_eagle_planning, needs_vllm

from kvcontract.spec.geometry import Geometry, GroupSpec
from kvcontract.spec.properties.end_to_end import resend_case
from kvcontract.spec.properties.store import StoreCase
from kvcontract.tools.audit.live_stage import confirm_defects
from kvcontract.vocabulary import GroupKind


def _geometry(eagle: bool, sw: int = 8) -> Geometry:
    return Geometry(groups=(GroupSpec(GroupKind.FULL, 16),
                            GroupSpec(GroupKind.SLIDING_WINDOW, 4, sliding_window=sw,
                                      eagle=eagle)),
                    blocks_per_chunk=1, retention_interval=0)


def _defect(identity: str, eagle: bool, impact: str = "lost-hit", *, sw: int = 8,
            prompt: int = 33) -> dict[str, Any]:
    case = resend_case(f"FA16+SWA4(sw{sw})", _geometry(eagle, sw), prompt).to_json()
    return {"id": identity, "latent": False, "impact": impact,
            "witness": {"theorem": "C12/upstream-no-lost-hits", "witness": case}}


STORE_THEOREM = "C10/upstream-store-stores-well-formed"


def _store_defect() -> dict[str, Any]:
    # A one-shot prefill of 32 tokens and 20 decode steps: with the prompt-only clamp the
    # full-attention chunk of tokens 32-48 is never stored (offload_prompt_only).
    case = StoreCase("FA16+SWA4(sw8)", _geometry(False), 32, (32,), "finished", decode=20)
    witness = dict(case.to_json(), kind="exhaustive", theorem=STORE_THEOREM)
    return {"id": "Dstore0000000", "latent": False, "impact": "corruption",
            "witness": {"theorem": STORE_THEOREM, "witness": witness}}


def _report(*defects: dict[str, Any], target: str = "vllm:installed") -> dict[str, Any]:
    return {"target": target, "vllm_version": None, "defects": list(defects)}


@needs_vllm
@needs_eagle_planning
def test_what_vllm_loses_is_confirmed_and_what_it_serves_is_not_reproduced() -> None:
    # The EAGLE replay boundary at retention 0: vLLM 0.33.0 stores for P - 1 alone, so the
    # resend of 33 tokens gets nothing where the spec promises 16; the window formula
    # (sw = 1 mod tpc) loses the resend of 48. Without EAGLE, vLLM serves the promise, and
    # its store path keeps the prompt-only clamp: a report claiming a loss or a C10
    # store there would be a stand-in's error.
    report = _report(_defect("Deagle0000000", eagle=True),
                     _defect("Dwindow000000", eagle=False, sw=9, prompt=48),
                     _defect("Dplain0000000", eagle=False),
                     _defect("Dwaste0000000", eagle=False, impact="waste"),
                     _store_defect())
    confirm_defects(report, None)
    eagle, window, plain, waste, store = report["defects"]
    assert eagle["live"]["status"] == "confirmed", eagle["live"]
    replay = eagle["live"]["replays"][0]
    assert replay["observed_hit"] == 0 and replay["gpu_promise"] == 16
    assert window["live"]["status"] == "confirmed", window["live"]
    assert window["live"]["replays"][0]["gpu_promise"] == 32
    assert plain["live"]["status"] == "not reproduced", plain["live"]
    assert plain["live"]["replays"][0]["observed_hit"] >= 16
    assert waste["live"]["status"] == "not reproduced"  # a C12 witness: replayed
    assert store["live"]["status"] == "not reproduced", store["live"]
    assert store["live"]["replays"][0]["verdict"] == "holds"
    assert report["live"]["vllm"] == _FOUND.vllm_version
    assert "overlay" not in report["live"]  # vllm:installed is the release as it is


@needs_vllm
def test_a_patch_runs_live_laid_over_the_installed_release(tmp_path: Path) -> None:
    # One patch file restating a function of config.py (the window formula, fixed) and a
    # method of the scheduler (the prompt-only clamp removed): both laid over the wheel.
    fixed = window_patch(tmp_path / "window.py", "fix").read_text()
    broken = store_patch(tmp_path / "store.py").read_text()
    patch = tmp_path / "patch.py"
    patch.write_text(fixed + "\n\n" + broken)
    report = _report(_defect("Dwindow000000", eagle=False, sw=9, prompt=48), _store_defect(),
                     target=f"module:{patch}{base_mark()}")
    confirm_defects(report, None)
    window, store = report["defects"]
    laid = "\n".join(report["live"]["laid_over"])
    assert "get_sliding_window_size_in_chunks" in laid
    assert "OffloadingConnectorScheduler._calc_num_offloadable_tokens" in laid
    assert window["live"]["status"] == "not reproduced", window["live"]
    assert window["live"]["replays"][0]["verdict"] == "as-promised"  # fixed, live
    assert store["live"]["status"] == "confirmed", store["live"]
    assert "past the 32 committed tokens" in store["live"]["text"]
    assert window["live"]["patched"] and store["live"]["patched"]


@needs_vllm
def test_another_release_than_the_installed_one_is_not_replayable() -> None:
    old = Path("~/.cache/kvcontract/vllm/0.28.0").expanduser()
    if not old.is_dir():
        pytest.skip("no 0.28.0 release tree in the cache (tools/audit/wheels)")
    report = _report(_defect("Deagle0000000", eagle=True), target=f"vllm:{old}")
    confirm_defects(report, None)
    live = report["defects"][0]["live"]
    assert live["status"] == "not replayable"
    assert "0.28.0" in live["why"] and str(_FOUND.vllm_version) in live["why"]


@needs_vllm
@pytest.mark.slow
def test_a_patch_that_breaks_the_window_is_confirmed_by_a_live_audit(tmp_path: Path) -> None:
    from kvcontract.options import audit_request
    from kvcontract.tools.audit.command import run_audit_command

    patch = window_patch(tmp_path / "window.py", "break")
    report = run_audit_command(f"module:{patch}{base_mark()}", audit_request(
        clauses=("C12",), timeout=2.0, live=True), quiet=True)
    lost = [d for d in report["defects"] if d["impact"] == "lost-hit" and not d["latent"]]
    assert lost, report["defects"]
    assert all(d["live"]["status"] == "confirmed" for d in lost), [d["live"] for d in lost]
