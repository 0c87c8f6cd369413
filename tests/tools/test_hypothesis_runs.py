"""Hypothesis runs that depend only on the commit and the seed (tools/hypothesis_runs.py)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.internal.conjecture import providers

from kvcontract.tools.hypothesis_runs import deterministic_hypothesis, local_constants_active

MARK = 918_273_645


@pytest.fixture
def local_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> object:
    """A module of the user's (local: outside site-packages and the stdlib) that holds a
    distinctive integer constant."""
    (tmp_path / "users_module_with_a_constant.py").write_text(f"LIMIT = {MARK}\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("users_module_with_a_constant")
    yield module
    sys.modules.pop("users_module_with_a_constant", None)


def test_local_constants_are_off_inside_a_run_and_back_after(local_module: object) -> None:
    original = providers._get_local_constants
    assert MARK in providers._get_local_constants().integers  # Hypothesis collects it
    assert local_constants_active()
    with deterministic_hypothesis():
        assert not local_constants_active()
        assert MARK not in providers._get_local_constants().integers
        assert len(providers._get_local_constants()) == 0
        with deterministic_hypothesis():  # re-entrant
            assert len(providers._get_local_constants()) == 0
        assert len(providers._get_local_constants()) == 0
    assert providers._get_local_constants is original
    assert local_constants_active()


def _constant_pools() -> list[tuple[tuple[object, ...], tuple[object, ...]]]:
    """The provider's cached ``(global, local)`` constant pools, one per choice kind."""
    return list(providers.CONSTANTS_CACHE.cache.values())


def test_a_run_draws_from_no_local_pool(local_module: object) -> None:
    """The pools a run draws constants from hold no local constant (without the context
    manager the integer pool holds the user's ``MARK``)."""

    @settings(max_examples=300, database=None, derandomize=True, deadline=None)
    @given(st.integers())
    def probe(value: int) -> None:
        pass

    with deterministic_hypothesis():
        probe()
        pools = _constant_pools()
        assert pools  # the run did consult the constants
        assert all(not local for _, local in pools)
    assert not _constant_pools()  # nothing of the run leaks out
    probe()  # outside a run, Hypothesis's default is back: MARK is in a local pool
    assert any(MARK in local for _, local in _constant_pools())


def test_fuzz_writes_nothing_into_the_current_folder(tmp_path: Path) -> None:
    """``kvcontract fuzz`` runs Hypothesis in the user's folder: no ``.hypothesis/`` (no
    database, no constants cache) is left there."""
    import subprocess

    run = subprocess.run([sys.executable, "-m", "kvcontract", "fuzz", "--examples", "3",
                          "--seed", "1"], capture_output=True, text=True, cwd=tmp_path,
                         timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    assert list(tmp_path.iterdir()) == []
