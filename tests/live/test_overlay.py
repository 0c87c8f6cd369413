"""``kvcontract.live.overlay``: a patch is laid over a release only where its definitions
take what the release's callers pass (no vLLM needed: plain files)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvcontract.live.overlay import Overlay, OverlayError, plan_overlay

RELEASE = '''
class Scheduler:
    def _scan(self, keys, window, context, initial=None):
        return 0

    def other(self):
        return 1
'''


def _plan(tmp_path: Path, patch_source: str) -> Overlay:
    package = tmp_path / "vllm"
    package.mkdir()
    (package / "sched.py").write_text(RELEASE)
    patch = tmp_path / "patch.py"
    patch.write_text(patch_source)
    return plan_overlay(patch, package, ["sched.py"])


@pytest.mark.parametrize("signature", [
    "self, keys, window, context, initial=None",
    "self, keys, window, context, initial=None, extra=3",  # a new optional parameter
    "self, *args, **kwargs",
])
def test_a_definition_that_takes_what_the_callers_pass_is_laid_over(
        tmp_path: Path, signature: str) -> None:
    overlay = _plan(tmp_path, f"def _scan({signature}):\n    return 1\n")
    assert overlay.replaced() == ["sched.py:Scheduler._scan"]


@pytest.mark.parametrize(("signature", "why"), [
    ("self, keys, window, context", "lacks initial"),  # an older release's signature
    ("self, keys, window, context, initial=None, *, mode", "requires mode"),
])
def test_a_definition_written_for_another_release_is_refused_naming_both(
        tmp_path: Path, signature: str, why: str) -> None:
    with pytest.raises(OverlayError, match=why) as raised:
        _plan(tmp_path, f"def _scan({signature}):\n    return 1\n")
    message = str(raised.value)
    assert "Scheduler._scan(self, keys, window, context, initial)" in message
    assert "written for another release" in message
