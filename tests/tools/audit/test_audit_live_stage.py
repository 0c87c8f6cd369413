"""``audit --live`` without vLLM: the overlay that lays a patch over a release
(:mod:`kvcontract.live.overlay`, on a small package written here standing for the
release), which witnesses the live stage replays and how, and the statuses it gives."""

from __future__ import annotations

import importlib
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kvcontract.live.overlay import OverlayError, install, plan_overlay
from kvcontract.spec.geometry import Geometry, GroupSpec
from kvcontract.spec.properties.end_to_end import resend_case
from kvcontract.spec.properties.store import StoreCase
from kvcontract.tools.audit.live_stage import (
    live_target,
    replays_of,
    status_of,
    store_theorem,
)
from kvcontract.vocabulary import GroupKind

RELEASE = {
    "sched.py": '''
        LIMIT = 3

        def window(n):
            return n + LIMIT

        class Base:
            def hello(self):
                return "base"

        class Scheduler(Base):
            def hello(self):
                return "release"

            def store(self, n):
                return window(n)

            def keep(self):
                return "kept"
        ''',
    "user.py": '''
        from pkg_kvc_overlay.sched import window

        def call(n):
            return window(n)
        ''',
}

PATCH = '''
    LIMIT = 100
    EXTRA = 7

    def _helper(n):
        return n * EXTRA

    def window(n):
        return _helper(n)

    class Scheduler:
        def hello(self):
            return "patched " + super().hello()

    def store(self, n):
        return -window(n)
    '''


@pytest.fixture
def release(tmp_path: Path) -> Iterator[Path]:
    package = tmp_path / "pkg_kvc_overlay"
    package.mkdir()
    (package / "__init__.py").write_text("")
    for name, text in RELEASE.items():
        (package / name).write_text(textwrap.dedent(text))
    sys.path.insert(0, str(tmp_path))
    try:
        yield package
    finally:
        sys.path.remove(str(tmp_path))
        for name in [m for m in sys.modules if m.startswith("pkg_kvc_overlay")]:
            del sys.modules[name]


def test_a_patch_replaces_the_release_definitions_it_restates_and_keeps_the_rest(
        release: Path, tmp_path: Path) -> None:
    patch = tmp_path / "patch.py"
    patch.write_text(textwrap.dedent(PATCH))
    overlay = plan_overlay(patch, release, ["sched.py", "user.py"], package="pkg_kvc_overlay")
    (layer,) = overlay.layers
    assert layer.module == "pkg_kvc_overlay.sched"
    # The bare `store` restates the one method of that name (the binding's any-class rule).
    assert dict(layer.replaced) == {"window": "window", "Scheduler.hello": "Scheduler.hello",
                                    "store": "Scheduler.store"}
    assert layer.added == ("EXTRA", "_helper")
    user = importlib.import_module("pkg_kvc_overlay.user")
    lines = install(overlay)
    sched = importlib.import_module("pkg_kvc_overlay.sched")
    assert len(lines) == 3
    scheduler = sched.Scheduler()
    assert scheduler.hello() == "patched base"  # zero-argument super() is the release's class
    assert scheduler.store(2) == -14 and scheduler.keep() == "kept"
    assert sched.LIMIT == 3  # the release's names are never overwritten but by replacements
    assert user.call(2) == 14  # `from sched import window` rebound too


def test_a_name_several_classes_define_is_not_guessed(release: Path, tmp_path: Path) -> None:
    patch = tmp_path / "patch.py"
    patch.write_text("def hello(self):\n    return 'which?'\n")
    overlay = plan_overlay(patch, release, ["sched.py"], package="pkg_kvc_overlay")
    assert overlay.empty
    assert any("matches 2 definitions" in note for note in overlay.notes)


def test_a_definition_that_cannot_be_laid_over_stops_the_run(release: Path,
                                                            tmp_path: Path) -> None:
    patch = tmp_path / "patch.py"
    patch.write_text("class Scheduler:\n    @no_such_decorator\n    def keep(self):\n"
                     "        return 1\n")
    overlay = plan_overlay(patch, release, ["sched.py"], package="pkg_kvc_overlay")
    with pytest.raises(OverlayError, match="no_such_decorator"):
        install(overlay)


def _geometry(sw: int = 8) -> Geometry:
    return Geometry(groups=(GroupSpec(GroupKind.FULL, 16),
                            GroupSpec(GroupKind.SLIDING_WINDOW, 4, sliding_window=sw)),
                    blocks_per_chunk=1, retention_interval=0)


def _defect(theorem: str, witness: dict[str, Any], impact: str = "lost-hit") -> dict[str, Any]:
    return {"id": "D0", "impact": impact, "latent": False,
            "witness": {"theorem": theorem, "witness": witness}}


def test_the_replays_of_each_witness_kind() -> None:
    e2e = resend_case("g", _geometry(), 33).to_json()
    store = dict(StoreCase("g", _geometry(), 32, (16, 16), "aborted").to_json(),
                 kind="exhaustive", theorem="C10/upstream-store-stores-well-formed")
    lookup = {"kind": "exhaustive", "geometry": _geometry().to_dict(), "num_tokens": 17,
              "local_hit": 0, "states": {"0": ["HIT"], "1": ["MISS"]}}
    (found,), why = replays_of(_defect("C12/upstream-no-lost-hits", e2e))
    assert found.kind == "end-to-end" and why is None
    (found,), why = replays_of(_defect("C10/upstream-store-stores-well-formed", store,
                                       "corruption"))
    assert found.kind == "store" and found.theorem == "C10/stores-well-formed"
    assert "kind" not in found.case and StoreCase.from_json(found.case).steps == (16, 16)
    assert replays_of(_defect("C3/upstream-lookup-defers-only-in-scope", lookup))[0] == []
    assert "lookup state" in str(replays_of(_defect("C3/x", lookup))[1])
    assert "formula" in str(replays_of(_defect("C7/mask", {"sw": 2}))[1])
    assert store_theorem("C9/upstream-store-store-steps") == "C9/store-steps"


def _result(kind: str, verdict: str, **more: Any) -> dict[str, Any]:
    return {"case": "c", "kind": kind, "verdict": verdict, "observed_hit": 0,
            "gpu_promise": 16, "raised": None, "refused": "no" if verdict == "refused"
            else None, "theorem": "C10/stores-well-formed", "offers": [[[0]]],
            "scheduled": [16], "expected_schedule": [8, 8], "message": "m", **more}


def test_statuses() -> None:
    assert status_of("lost-hit", [_result("end-to-end", "lost-hit")])[0] == "confirmed"
    status, text = status_of("lost-hit", [_result("end-to-end", "as-promised")])
    assert status == "not reproduced" and "stand-ins" in text
    assert status_of("corruption", [_result("store", "violated")])[0] == "confirmed"
    status, text = status_of("corruption", [_result("store", "holds")])
    assert status == "not reproduced" and "tools/audit/store.py" in text
    status, text = status_of("corruption", [_result("store", "other schedule")])
    assert status == "not replayable" and "[8, 8]" in text
    assert status_of("crash", [_result("store", "crash", raised="KeyError: x")])[0] == \
        "confirmed"
    assert status_of("waste", [_result("end-to-end", "refused")])[0] == "not replayable"
    status, text = status_of("lost-hit", [_result("end-to-end", "error", error="E: x"),
                                          _result("end-to-end", "lost-hit")])
    assert status == "confirmed"  # a case that could not run leaves the others' verdict
    assert "E: x" in status_of("lost-hit", [_result("end-to-end", "error", error="E: x")])[1]


def test_a_builtin_or_another_base_release_is_not_replayable(tmp_path: Path) -> None:
    assert "kvcontract's own code" in str(live_target("builtin:reference", "0.33.0").why)
    patch = tmp_path / "patch.py"
    patch.write_text("def get_sliding_window_size_in_chunks(spec, tpc):\n    return 1\n")
    old = Path("~/.cache/kvcontract/vllm/0.31.0").expanduser()
    if not old.is_dir():
        pytest.skip("no 0.31.0 release tree in the cache")
    where = live_target(f"module:{patch}@base=vllm:{old}", "0.33.0")
    assert where.why is not None and "0.31.0" in where.why and "0.33.0" in where.why


def test_every_format_says_the_live_status_in_the_same_words() -> None:
    from kvcontract.tools.reports.common import defect_message, live_line

    defect = {"id": "D0", "impact": "corruption", "title": "well-formed stores",
              "clauses": ["C10"], "theorems": ["C10/upstream-store-stores-well-formed"],
              "witness": {"line": "P=21"},
              "live": {"status": "confirmed", "vllm": "0.33.0", "patched": True,
                       "text": "vLLM's store path: group 1 offered chunk 2"}}
    line = live_line(defect)
    assert line == ("live: confirmed on vLLM 0.33.0 (the target's code laid over it): "
                    "vLLM's store path: group 1 offered chunk 2")
    assert defect_message(defect).endswith(line)  # the GitHub and SARIF message
    assert live_line({"live": {"status": "not replayable", "why": "a formula"}}) == \
        "live: not replayable: a formula"
    assert live_line({}) == ""
