"""The live backend's environment check and its separation from the core (no vLLM
needed)."""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import pytest

from kvcontract.live import env

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
    assert "pip install --no-deps vllm==0.33.0" in text
    with pytest.raises(env.LiveUnavailable, match="no-such-distribution"):
        env.require()


def test_an_unsupported_release_is_a_problem(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(env, "_version",
                        lambda d: "0.29.0" if d == "vllm" else "2.13.0+cpu")
    found = env.check(import_modules=False)
    assert not found.ok
    assert any("0.29.0" in p and "0.33.0" in p for p in found.problems)


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
