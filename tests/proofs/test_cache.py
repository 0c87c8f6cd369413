"""The proof cache (proofs/cache.py): keys, storage, and reuse by the prover."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from kvcontract.impl.variants import REFERENCE, VARIANTS
from kvcontract.proofs import cache as proof_cache
from kvcontract.proofs import sources
from kvcontract.proofs.cache import ProofCache, cache_dir, group_key, theorem_keys
from kvcontract.proofs.runner import _groups, catalog, prove, select
from kvcontract.proofs.verdicts import TheoremResult, Verdict
from kvcontract.spec.properties import CaseProperty


def _all_keys(impl_name: str = "reference") -> dict[str, str | None]:
    theorems = catalog()
    groups = _groups(theorems, select(None))
    keys = theorem_keys(impl_name, theorems, groups, (), 4)
    return {theorems[i].theorem_id: key for i, key in keys.items()}


def _patched_snapshot(monkeypatch: pytest.MonkeyPatch, module: str, old: str,
                      new: str) -> None:
    """The module's source as the key reads it, with ``old`` replaced by ``new`` (the
    file on disk is not touched)."""
    real = sources.snapshot

    def snapshot(name: str) -> sources.ModuleSource:
        found = real(name)
        if name != module:
            return found
        assert old in found.source, f"{old!r} not in {name}: update the test"
        return dataclasses.replace(found, source=found.source.replace(old, new, 1))

    monkeypatch.setattr(sources, "snapshot", snapshot)


def _text_callers(source: str, name: str) -> set[str]:
    """``name`` and the module's functions whose text calls it, transitively."""
    import ast

    bodies = {node.name: ast.get_source_segment(source, node) or ""
              for node in ast.parse(source).body if isinstance(node, ast.FunctionDef)}
    found = {name}
    while True:
        more = {f for f, text in bodies.items() if f not in found
                and any(f"{g}(" in text.split(":", 1)[1] for g in found)}
        if not more:
            return found
        found |= more


def test_changing_one_function_invalidates_exactly_its_theorems(
        monkeypatch: pytest.MonkeyPatch) -> None:
    before = _all_keys()
    assert all(key is not None for key in before.values())
    _patched_snapshot(monkeypatch, sources.REFERENCE_MODULE,
                      "def retained_block_range(",
                      "def retained_block_range(  # edited\n")
    # A comment alone does not change the function: the key reads the code (ast).
    assert _all_keys() == before
    monkeypatch.undo()
    body = "def retained_block_range("
    _patched_snapshot(monkeypatch, sources.REFERENCE_MODULE, body,
                      "def _new_helper() -> int:\n    return 1\n\n\n" + body)
    # A new function nothing calls changes no theorem's key.
    assert _all_keys() == before
    monkeypatch.undo()
    _patched_snapshot(monkeypatch, sources.REFERENCE_MODULE,
                      "return skipped // block_size,", "return skipped // block_size + 0,")
    after = _all_keys()
    changed = {t for t in before if before[t] != after[t]}
    # Those that use it: the theorems whose `uses` name it or a reference function
    # that calls it (found here by reading the text, not by the key's call graph), and
    # the case families, which drive the scheduler (it calls impl.load_chunk_range).
    callers = _text_callers(sources.snapshot(sources.REFERENCE_MODULE).source,
                            "retained_block_range")
    assert callers == {"retained_block_range", "load_chunk_range"}
    users = {t.theorem_id for t in catalog()
             if callers & set(t.uses) or isinstance(t, CaseProperty)}
    assert changed == users
    assert "C1/retained-blocks-exact" in changed
    assert "C4/load-window-exact" not in changed  # another function entirely
    assert "C2/spec-scan-hit-only" not in changed  # the spec alone


def test_a_module_constant_reaches_every_function_of_the_module(
        monkeypatch: pytest.MonkeyPatch) -> None:
    before = _all_keys()
    _patched_snapshot(monkeypatch, sources.REFERENCE_MODULE, "from __future__ import annotations",
                      "from __future__ import annotations\nLIMIT = 3")
    after = _all_keys()
    changed = {t for t in before if before[t] != after[t]}
    runs_code = {t.theorem_id for t in catalog() if t.uses}
    assert changed == runs_code


def test_the_spec_and_the_versions_are_in_every_key(monkeypatch: pytest.MonkeyPatch) -> None:
    before = _all_keys()
    monkeypatch.setattr(proof_cache, "base_key", lambda: "another z3")
    after = _all_keys()
    assert all(before[t] != after[t] for t in before)


def test_a_module_file_is_in_every_key(tmp_path: Path) -> None:
    from kvcontract.api import register_implementation

    patch = tmp_path / "patch.py"
    patch.write_text("def load_window_size_in_chunks(sliding_window, extra, tpc):\n"
                     "    return -(-(sliding_window - 1 + extra) // tpc)\n")
    name = register_implementation(f"module:{patch}")
    try:
        first = _all_keys(name)
        patch.write_text(patch.read_text() + "\n\nUNRELATED = 1\n")
        second = _all_keys(name)
    finally:
        VARIANTS.pop(name, None)
    keyed = [t for t in first if first[t] is not None]
    assert keyed and all(first[t] != second[t] for t in keyed)


def test_a_function_the_key_cannot_read_is_never_cached() -> None:
    from kvcontract.api import register_implementation

    odd = dataclasses.replace(REFERENCE, name="lambda-load-range",
                              load_chunk_range=lambda *args: REFERENCE.load_chunk_range(*args))
    name = register_implementation(odd)
    try:
        keys = _all_keys(name)
    finally:
        VARIANTS.pop(name, None)
    assert keys["C1/load-set-exact"] is None
    assert keys["C1/retained-blocks-exact"] is not None


def _result(verdict: Verdict = Verdict.PROVED) -> TheoremResult:
    return TheoremResult("C1", "load-set-exact", verdict, "all values", 0.5,
                         rlimit_used=10, queries=1)


def test_entries_round_trip_and_a_bad_entry_is_a_miss(tmp_path: Path) -> None:
    store = ProofCache(tmp_path)
    key = "ab" * 32
    assert store.get(key, 1) is None
    assert store.put(key, [_result()])
    [again] = store.get(key, 1) or []
    assert again.to_json() == _result().to_json()
    assert store.get(key, 2) is None  # a family of another size
    entry = store._path(key)
    for garbage in ("{", "[]", json.dumps({"format": 1, "key": "cd" * 32, "results": []}),
                    json.dumps({"format": 99, "key": key, "results": [_result().to_json()]}),
                    json.dumps({"format": 1, "key": key, "results": [{"verdict": "X"}]})):
        entry.write_text(garbage)
        assert store.get(key, 1) is None, garbage
    entry.write_bytes(b"\xff\xfe")
    assert store.get(key, 1) is None
    assert not list(entry.parent.glob(".*.tmp"))  # no temporary file left behind


def test_unknown_is_never_stored(tmp_path: Path) -> None:
    store = ProofCache(tmp_path)
    assert not store.put("ef" * 32, [_result(Verdict.UNKNOWN)])
    assert not store.put("ef" * 32, [_result(), _result(Verdict.UNKNOWN)])
    assert not any(tmp_path.rglob("*.json"))


def test_an_unwritable_cache_is_skipped(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    assert not ProofCache(blocker / "cache").put("ab" * 32, [_result()])


def test_cache_folder(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("KVCONTRACT_CACHE_DIR", str(tmp_path / "mine"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "mine"
    monkeypatch.delenv("KVCONTRACT_CACHE_DIR")
    assert cache_dir() == tmp_path / "xdg" / "kvcontract" / "proofs"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_dir() == tmp_path / "home" / ".cache" / "kvcontract" / "proofs"


def test_the_prover_reads_what_it_stored(tmp_path: Path) -> None:
    store = ProofCache(tmp_path)
    cold = prove("reference", ["C1"], jobs=1, cache=store)
    assert not any(cold.cached)
    assert all("cached" not in row for row in cold.to_json()["results"])
    warm = prove("reference", ["C1"], jobs=1, cache=store)
    assert warm.cached == [True] * len(cold.results)
    assert all(row["cached"] is True for row in warm.to_json()["results"])
    assert [r.to_json() for r in warm.results] == [r.to_json() for r in cold.results]
    # The results really come from the entries: an edited entry is what is reported.
    theorems = catalog()
    groups = _groups(theorems, select(["C1"]))
    keys = theorem_keys("reference", theorems, groups, (), 1)
    key = group_key(keys, groups[0])
    assert key is not None
    entry = store._path(key)
    data = json.loads(entry.read_text())
    data["results"][0]["message"] = "read from the cache"
    entry.write_text(json.dumps(data))
    edited = prove("reference", ["C1"], jobs=1, cache=store)
    assert edited.results[0].message == "read from the cache"
    # Without the cache nothing is read.
    assert prove("reference", ["C1"], jobs=1).results[0].message == ""


def test_a_family_is_cached_with_its_members(tmp_path: Path) -> None:
    store = ProofCache(tmp_path)
    cold = prove("reference", ["C9", "C10"], jobs=1, cache=store)
    warm = prove("reference", ["C9", "C10"], jobs=1, cache=store)
    assert warm.cached == [True] * len(cold.results)
    assert [r.to_json() for r in warm.results] == [r.to_json() for r in cold.results]
    # Another selection of the family is another entry (its details name the pass); a
    # formula theorem of the clause is its own entry, read back.
    other = prove("reference", ["C9"], jobs=1, cache=store)
    family = {t.name for t in catalog() if getattr(t, "family", None) == "store"}
    members = [c for r, c in zip(other.results, other.cached, strict=True)
               if r.theorem in family]
    assert members and not any(members)
    assert all(c for r, c in zip(other.results, other.cached, strict=True)
               if r.theorem not in family)
