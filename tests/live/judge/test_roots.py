"""Composed vLLM roots: a target's files laid over an installed package (no vLLM import:
the packages here are folders of small files)."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

from kvcontract.live.judge.roots import RootError, VllmRoot, activate, compose, version_of


def _package(root: Path, files: dict[str, str]) -> Path:
    package = root / "vllm"
    for rel, text in files.items():
        path = package / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return package


INSTALLED = {
    "__init__.py": "", "_version.py": "__version__ = version = '0.34.0'\n",
    "_C.abi3.so": "binary", "core/a.py": "A = 'installed'\n", "core/b.py": "B = 1\n",
    "core/old.py": "OLD = 1\n", "kernels/k.py": "K = 1\n",
}


def test_a_complete_tree_replaces_the_installed_modules(tmp_path: Path) -> None:
    base = _package(tmp_path / "site", INSTALLED)
    tree = _package(tmp_path / "checkout", {"__init__.py": "", "core/a.py": "A = 'main'\n",
                                            "core/b.py": "B = 2\n", "core/new.py": "N = 1\n"})
    root = compose(tree, base, cache=tmp_path / "cache")
    package = root.package
    assert (package / "core" / "a.py").read_text() == "A = 'main'\n"
    assert (package / "core" / "new.py").is_file()
    # removed from a folder the checkout has: stays removed; a folder it lacks (built at
    # install time) and the compiled and generated files come from the installed wheel
    assert not (package / "core" / "old.py").exists()
    assert (package / "kernels" / "k.py").is_file()
    assert (package / "_C.abi3.so").is_file()
    assert version_of(package) == "0.34.0"
    assert root.complete and root.version is None
    assert "a vLLM checkout (no _version.py)" in root.description
    assert "laid over the installed vLLM 0.34.0" in root.description


def test_a_partial_tree_keeps_every_installed_file_it_does_not_replace(tmp_path: Path) -> None:
    base = _package(tmp_path / "site", INSTALLED)
    tree = _package(tmp_path / "release", {
        "_version.py": "__version__ = version = '0.33.0'\n", "core/a.py": "A = 'old'\n"})
    root = compose(tree, base, cache=tmp_path / "cache")
    assert not root.complete
    assert (root.package / "core" / "old.py").is_file()
    assert (root.package / "core" / "a.py").read_text() == "A = 'old'\n"
    assert root.version == "0.33.0" and root.installed_version == "0.34.0"
    assert "replacing their counterparts in the installed vLLM 0.34.0" in root.description


def test_a_composed_root_is_reused_until_a_file_changes(tmp_path: Path) -> None:
    base = _package(tmp_path / "site", INSTALLED)
    tree = _package(tmp_path / "tree", {"core/a.py": "A = 1\n"})
    first = compose(tree, base, cache=tmp_path / "cache")
    assert compose(tree, base, cache=tmp_path / "cache").path == first.path
    (tree / "core" / "a.py").write_text("A = 22\n")
    assert compose(tree, base, cache=tmp_path / "cache").path != first.path


def test_the_installed_package_itself_is_the_installed_root(tmp_path: Path) -> None:
    base = _package(tmp_path / "site", INSTALLED)
    root = compose(base, base, cache=tmp_path / "cache")
    assert root.is_installed and root.description == "vLLM 0.34.0 (installed)"


def test_a_process_runs_one_vllm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    base = _package(tmp_path / "site", INSTALLED)
    elsewhere = _package(tmp_path / "other", {"__init__.py": ""})
    fake = types.ModuleType("vllm")
    fake.__file__ = str(elsewhere / "__init__.py")
    monkeypatch.setitem(sys.modules, "vllm", fake)
    root = VllmRoot(tmp_path, base, "vLLM 0.34.0 (test)", "0.34.0", "0.34.0")
    with pytest.raises(RootError, match="already imported in this process"):
        activate(root)
    # the vLLM already imported is the one asked for: nothing to do
    activate(VllmRoot(None, elsewhere, "the same", None, None))


def test_a_root_needs_an_installed_vllm(tmp_path: Path) -> None:
    tree = _package(tmp_path / "tree", {"core/a.py": ""})
    with pytest.raises(RootError, match="not a folder"):
        compose(tmp_path / "missing", tree, cache=tmp_path / "cache")
