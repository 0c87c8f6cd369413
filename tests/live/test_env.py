"""The live backend's environment check, its capability detection and its separation
from the core (no vLLM needed, but where a test says so)."""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import pytest

from kvcontract.live import capabilities, env
from kvcontract.releases import LIVE_RELEASES, NEWEST_RELEASE
from tests.live.conftest import _FOUND, needs_vllm

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_check_names_what_is_missing_and_how_to_install(monkeypatch: pytest.MonkeyPatch,
                                                        ) -> None:
    monkeypatch.setitem(env.PURE_PYTHON_CLOSURE, "kvcontract_no_such_module",
                        "no-such-distribution")
    found = env.check(import_modules=False)
    assert not found.ok
    assert "no-such-distribution" in found.missing
    text = "\n".join(found.lines())
    assert "missing: " in text and "no-such-distribution" in text
    assert f"pip install --no-deps vllm=={NEWEST_RELEASE}" in text
    assert "pip install --no-deps xgrammar==0.2.8" in text
    with pytest.raises(env.LiveUnavailable, match="no-such-distribution"):
        env.require()


def test_no_release_is_refused_by_its_version(monkeypatch: pytest.MonkeyPatch) -> None:
    """A release no list names passes the check: only capabilities decide."""
    monkeypatch.setattr(env, "PURE_PYTHON_CLOSURE", {})
    monkeypatch.setattr(env, "_version",
                        lambda d: "9.99.0" if d == "vllm" else "2.13.0+cpu")
    found = env.check(import_modules=False)
    assert found.ok, found.lines()
    assert "9.99.0" not in LIVE_RELEASES
    assert "9.99.0" in found.lines()[0]


def _without_vllm(monkeypatch: pytest.MonkeyPatch, *absent: str) -> None:
    """The full check over a stand-in capability record: every probe present but
    ``absent`` (no vLLM import: LIVE_MODULES emptied)."""
    monkeypatch.setattr(env, "PURE_PYTHON_CLOSURE", {})
    monkeypatch.setattr(env, "LIVE_MODULES", ())
    monkeypatch.setattr(env, "_version",
                        lambda d: "9.99.0" if d == "vllm" else "2.13.0+cpu")
    found = capabilities.Capabilities(tuple(
        capabilities.Capability(p.name, p.api, p.name not in absent, p.required, p.use)
        for p in capabilities.PROBES))
    monkeypatch.setattr(capabilities, "capabilities", lambda: found)


def test_a_missing_required_capability_fails_the_check_naming_the_api(
        monkeypatch: pytest.MonkeyPatch) -> None:
    _without_vllm(monkeypatch, "model-runner-output")
    found = env.check(import_modules=True)
    assert not found.ok
    api = capabilities.CAPABILITY_API["model-runner-output"]
    assert any(api in problem for problem in found.problems), found.problems
    assert any("model-runner-output: no (required)" in line
               for line in found.capability_lines())


def test_a_missing_optional_capability_passes_the_check(
        monkeypatch: pytest.MonkeyPatch) -> None:
    _without_vllm(monkeypatch, "model-output-index-map", "failed-transfer-jobs")
    found = env.check(import_modules=True)
    assert found.ok, found.problems
    assert found.capabilities is not None
    assert not found.capabilities.has("failed-transfer-jobs")


def test_every_capability_is_named_once_with_its_api() -> None:
    names = [p.name for p in capabilities.PROBES]
    assert len(names) == len(set(names))
    assert all(p.api and p.use for p in capabilities.PROBES)
    assert {p.name for p in capabilities.PROBES if p.required} >= {
        "scheduler", "offloading-connector", "model-runner-output", "connector-output"}


# -- the AST probes, on functions of each shape (no vLLM) ----------------------------------
def _reserve_first(max_num_new_tokens: int | None) -> int:
    max_hit_size_tokens = 64
    max_hit_size_tokens -= 1
    if max_num_new_tokens is not None:
        max_hit_size_tokens = min(max_hit_size_tokens, max_num_new_tokens)
    return max_hit_size_tokens


def _clamp_first(max_num_new_tokens: int | None) -> int:
    max_hit_size_tokens = 64
    if max_num_new_tokens is not None:
        max_hit_size_tokens = min(max_hit_size_tokens, max_num_new_tokens)
    max_hit_size_tokens -= 1
    return max_hit_size_tokens


def _placeholders(block_ids: list[int], src_block_ids: list[int]) -> None:
    for i in range(2):
        block_id = block_ids[i]
        src_block_ids.append(block_id)
        if block_id == 0:
            continue


def _skips(block_ids: list[int], src_block_ids: list[int]) -> None:
    for i in range(2):
        block_id = block_ids[i]
        if block_id == 0:
            continue
        src_block_ids.append(block_id)


def test_the_ast_probes_tell_the_shapes_apart() -> None:
    assert capabilities.swa_reserve_before_clamps(_reserve_first) is True
    assert capabilities.swa_reserve_before_clamps(_clamp_first) is False
    assert capabilities.swa_reserve_before_clamps(test_the_ast_probes_tell_the_shapes_apart) \
        is None
    assert capabilities.null_page_placeholders(_placeholders) is True
    assert capabilities.null_page_placeholders(_skips) is False
    assert capabilities.null_page_placeholders(_reserve_first) is None
    assert capabilities.null_page_placeholders(len) is None  # no source: unknown


@needs_vllm
def test_the_installed_vllm_offers_every_required_capability() -> None:
    found = capabilities.detect()
    assert not found.missing
    assert [c.name for c in found.found] == [p.name for p in capabilities.PROBES]
    # each optional capability is told, except where the release reshaped its code
    assert all(c.present is not None for c in found.found
               if c.name not in capabilities.AST_PROBES)
    assert _FOUND.capabilities == found


def test_importing_the_package_imports_no_vllm() -> None:
    code = ("import sys, kvcontract.live, kvcontract.live.confirm, kvcontract.live.scenarios,"
            " kvcontract.tools.commands.live; "
            "print(sorted(m for m in sys.modules if m == 'vllm' or m.startswith('vllm.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("package", ["spec", "impl", "proofs", "kvcontract"])
def test_the_core_never_imports_the_live_backend_or_vllm(package: str) -> None:
    offenders = []
    for path in sorted((ROOT / package).rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            offenders += [f"{path.relative_to(ROOT)}: {n}" for n in names
                          if n.split(".")[0] == "vllm" or n.startswith("kvcontract.live")]
    assert offenders == []
