"""Upstream's own store path (``tools/audit/store.py``): ``_build_store_jobs`` executed
step by step through stand-ins, judged by the store family's judges, and composed with
upstream's ``_lookup_complete_chunks`` for C12 (``upstream-no-lost-hits``)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from audit_releases import FIXED_SCAN, release_tree

from kvcontract.spec.properties import CaseProperty
from kvcontract.spec.properties.base import raised
from kvcontract.spec.properties.end_to_end import EndToEndCase
from kvcontract.spec.properties.store import (
    StoreCase,
    simulate_store_case,
    store_cases,
    store_properties,
)
from kvcontract.tools.audit import derived_spaces, store
from kvcontract.tools.audit.binding import bind
from kvcontract.tools.audit.engine import AuditOptions, run_audit
from kvcontract.tools.audit.roles import Binding, RoleBinding, has_lookahead_hashes
from kvcontract.tools.audit.targets import resolve_target
from kvcontract.vocabulary import ENDED_STATUSES, Impact

_BOUND: dict[str, Binding] = {}


def _bound(version: str) -> Binding:
    if version not in _BOUND:
        _BOUND[version] = bind(resolve_target(f"vllm:{release_tree(version)}"))
    return _BOUND[version]


def _offers(run: Any, g: int) -> list[list[int]]:
    return [sorted(offer) for offer in run.trackers[g].offers]


def _frontier_horizon(status: str, prompt_horizon_chunks: int, current_chunks: int,
                      retention_interval: int | None) -> int | None:
    """0.28/0.29's builder: every frontier closes a final segment."""
    return current_chunks


def _prompt_horizon(status: str, prompt_horizon_chunks: int, current_chunks: int,
                    retention_interval: int | None) -> int | None:
    """0.30+'s builder: the prompt horizon while prefilling, the real one on finish or
    abort, none under a retention interval (``store_horizon_chunks = None``)."""
    if retention_interval is not None:
        return None
    return current_chunks if status in ENDED_STATUSES else prompt_horizon_chunks


def _with_horizon(binding: Binding) -> Any:
    """The bound bundle with each release's store horizon written here, as this test's
    oracle. The audit no longer models the horizon from the builder's text (issue 20:
    its StoreTracker theorems are unchecked); these tests cross-check the executed store
    path against the tracker under the horizon the release's builder passes."""
    assert binding.implementation is not None
    old = binding.roles["store_predicate"].status == "found"
    return dataclasses.replace(
        binding.implementation,
        store_final_segment_end=_frontier_horizon if old else _prompt_horizon)


def _differences(binding: Binding) -> list[tuple[StoreCase, int, Any, Any]]:
    """``(case, group, upstream's run, the tracker's run)`` wherever upstream's executed
    store path and kvcontract's StoreTracker over the bound primitives (and the
    release's horizon, :func:`_with_horizon`) differ."""
    assert binding.implementation is not None
    run = store.make_store_runner(binding)
    impl = _with_horizon(binding)
    in_release, _ = store.without_absent_modes(binding, lambda case: case.geometry)
    found = []
    for case in store_cases():
        if store._has_mamba(case.geometry) or not in_release(case):
            continue  # left out of the upstream store theorems (MAMBA_NOTE, LOOKAHEAD_NOTE)
        upstream = run(case)
        ours = simulate_store_case(case, impl)
        for g in range(len(case.geometry.groups)):
            if _offers(upstream, g) != _offers(ours, g) or \
                    upstream.next_indices[g] != ours.next_indices[g]:
                found.append((case, g, upstream, ours))
    return found


def _all_offers(run: Any, g: int) -> set[int]:
    return {c for offer in run.trackers[g].offers for c in offer}


def test_upstream_store_path_offers_what_the_tracker_offers() -> None:
    """On 0.33.0 upstream's store path and the StoreTracker over the bound primitives
    offer the same chunks at the same steps on the whole store catalogue. With a
    retention interval ``_build_store_jobs`` sets ``store_horizon_chunks = None``: no
    final partial-segment tail, as vLLM's GPU cache keeps none (the contract owes none
    either, ``reachability.keeps_final_tail``), and the bound horizon models that."""
    binding = _bound("0.33.0")
    assert _differences(binding) == []
    retention = [c for c in store_cases() if c.geometry.retention_interval]
    assert retention  # the catalogue has retention-interval producers to compare
    # The audit itself binds no horizon (issue 20): nothing modelled from source text.
    assert binding.roles["store_horizon"].status == "missing"


def test_old_store_path_findings_the_tracker_cannot_see() -> None:
    """0.29.0's builder, executed: on finish it stores ``req.num_tokens`` (the final
    sampled slot, C10) and keeps the EAGLE exclusion of the last chunk (issue #52735, no
    ``is_finished`` lift in ``storable_chunks``): the tracker over the bound primitives
    uses kvcontract's token count and EAGLE rule and sees neither."""
    differences = {(case.geometry_name, case.prompt_len, case.steps, g):
                   (_all_offers(up, g) - _all_offers(ours, g),
                    _all_offers(ours, g) - _all_offers(up, g))
                   for case, g, up, ours in _differences(_bound("0.29.0"))}
    assert differences[("FA16+SWA4(sw8,e3),decoded", 32, (32,), 1)] == ({8}, set())
    assert differences[("FA16+SWA4(sw8,eagle),decoded", 31, (31,), 1)] == (set(), {7})
    # The EAGLE exclusion kept on finish shows on every decoded EAGLE producer, the
    # full-attention EAGLE group's too.
    assert {name for name, *_ in differences} == {"FA16+SWA4(sw8,e3),decoded",
                                                  "FA16+SWA4(sw8,eagle),decoded",
                                                  "FA4(eagle)+SWA4(sw8),decoded"}
    theorems = {t.name: t for t in store.upstream_store_theorems(_bound("0.29.0"))}
    well_formed = theorems["upstream-store-stores-well-formed"]
    case = next(c for c in well_formed.space.cases()
                if c.geometry_name == "FA16+SWA4(sw8,e3),decoded" and c.steps == (32,)
                and c.ending == "finished")
    impl = _bound("0.29.0").implementation
    assert impl is not None
    assert "past the 35 committed tokens" in str(well_formed.check(case, impl))


def _failing(theorem: CaseProperty, binding: Binding) -> dict[str, str]:
    """The cases a theorem fails (by their witness JSON) and the impact of each."""
    found: dict[str, str] = {}
    impl = _with_horizon(binding)  # the upstream-* theorems ignore it
    for case in theorem.space.cases():
        try:
            message = theorem.check(case, impl)
        except Exception as exc:
            message = raised(exc)
        if message is not None:
            found[json.dumps(case.to_json(), sort_keys=True)] = theorem.impact_of(message).value
    return found


def test_store_judges_on_upstream_store_path() -> None:
    """Every store judge applies to the upstream run, and on 0.33.0 it fails exactly the
    cases it fails on the tracker over the bound primitives (the EAGLE replay tails: ``P -
    1`` alone, the GPU's EAGLE boundaries' tails missing; the mask's first EAGLE block at
    ``need == per``); nothing on the retention-interval producers (no final tail, on
    either side)."""
    binding = _bound("0.33.0")
    theorems = {t.name: t for t in store.upstream_store_theorems(binding)}
    catalogue = {t.name: t for t in store_properties()}
    assert sorted(theorems) == sorted(store.UPSTREAM_STORE + name for name in catalogue)
    eagle, retention = "FA16+SWA4(sw8,eagle),retention0", "FA16+SWA4(sw8),retention32"
    for name, prop in catalogue.items():
        upstream = _failing(theorems[store.UPSTREAM_STORE + name], binding)
        ours = _failing(prop, binding)
        assert set(upstream) == set(ours), name
        assert Impact.CRASH.value not in upstream.values(), name
        geometries = {json.loads(key)["geometry_name"] for key in upstream}
        if name in ("store-horizon", "store-steps"):
            assert eagle in geometries, name  # the GPU's EAGLE boundary tails missing
        if name == "stores-only-demanded":
            # upstream's mask stores everything at need == per, an EAGLE group's first
            # block too, which no boundary demands (one block of waste per request)
            assert "FA8+SWA4(sw5,eagle),need=period" in geometries, name
        assert retention not in geometries, name
        if name in ("offered-at-most-once", "stores-well-formed"):
            assert not upstream, name


def _c12_findings(version: str) -> tuple[CaseProperty, list[tuple[EndToEndCase, str]]]:
    binding = _bound(version)
    theorem = store.upstream_end_to_end_theorems(binding)[0]
    assert theorem.theorem_id == "C12/upstream-no-lost-hits"
    found = []
    for case in theorem.space.cases():
        assert "Mamba" not in case.geometry_name  # stored by the GPU's hand-off, left out
        try:
            message = theorem.check(case, binding.implementation)
        except Exception as exc:
            message = raised(exc)
        if message is not None:
            found.append((case, message))
    return theorem, found


@pytest.mark.parametrize("version", ["0.33.0", "0.30.0"])
def test_upstream_no_lost_hits_finds_the_known_lost_hits(version: str) -> None:
    theorem, found = _c12_findings(version)
    by_geometry: dict[str, set[str]] = {}
    for case, message in found:
        by_geometry.setdefault(case.geometry_name, set()).add(theorem.impact_of(message).value)
    # The EAGLE resend at retention 0: promised 16, upstream (P - 1 alone) serves 0.
    resend = [m for c, m in found if c.geometry_name == "FA16+SWA4(sw8,eagle),retention0"
              and c.producer.prompt_len == 33 and c.producer.steps == (33,)
              and c.producer.ending == "finished" and c.consumer.kind == "resend"]
    assert resend and "accepted hit 0, promised 16" in str(resend[0])
    case = next(c for c, m in found if c.geometry_name == "FA16+SWA4(sw8,eagle),retention0")
    assert store.blame(theorem, case) == (["_build_store_jobs"], "store_jobs")
    # Upstream's window formula, sw = 1 (mod tpc): the lookup demands a chunk more.
    for name in ("FA16+SWA4(sw9)", "FA16+SWA4(sw9),retention0"):
        assert by_geometry[name] == {Impact.LOST_HIT.value}
        case = next(c for c, m in found if c.geometry_name == name)
        assert store.blame(theorem, case) == (["_lookup_complete_chunks"], "multi_group_lookup")
    # No final partial-segment tail is owed under a retention interval (vLLM's GPU cache
    # keeps none either): upstream passing no final horizon there loses nothing.
    assert "FA16+SWA4(sw8),retention32" not in by_geometry
    crashes = {name for name, impacts in by_geometry.items() if Impact.CRASH.value in impacts}
    # 0.30 ignores MTP's e in the lookup and the store mask (docs/CONTRACT.md 8.3, fixed
    # in 0.31): a read chunk was never stored. Nothing else crashes.
    assert crashes == (set() if version == "0.33.0" else {"FA16+SWA4(sw8,e3),retention0"})


def test_audit_rows_of_the_upstream_store_theorems() -> None:
    binding = _bound("0.33.0")
    run = run_audit(binding, AuditOptions(clauses=["C12"], examples=20, jobs=1))
    # kvcontract's C12 driver needs a store horizon, never modelled from source text
    # (issue 20): unchecked and named; upstream's executed store path is checked.
    # The junction theorem judges junction consumers only, which the stand-ins leave out:
    # unchecked and named, never a vacuous pass.
    assert [(u["clause"], u["theorem"]) for u in run.unchecked] == [
        ("C12", "upstream-junction-registered-exact"), ("C12", "no-lost-hits"),
        ("C12", "junction-registered-exact")]
    assert "junction consumers are left out" in run.unchecked[0]["reason"]
    assert "upstream-store-*" in run.unchecked[1]["reason"]
    assert not any(r["theorem"] == "upstream-junction-registered-exact" for r in run.rows)
    row = next(r for r in run.rows if r["theorem"] == "upstream-no-lost-hits")
    assert row["verdict"] == "COUNTEREXAMPLE" and row["impact"] == "lost-hit"
    assert row["blame"] == ["_build_store_jobs"]
    assert row["location"]["line"] == binding.roles["store_jobs"].line
    assert row["location"]["path"].startswith(str(release_tree("0.33.0")))
    assert "_build_store_jobs" in row["via"] and "_lookup_complete_chunks" in row["via"]
    assert "geometries with a Mamba group are left out" in row["domain"]


def test_missing_function_leaves_the_theorems_unchecked() -> None:
    binding = _bound("0.33.0")
    functions = {k: v for k, v in binding.functions.items() if k != "storable_chunks"}
    roles = {**binding.roles, "storable_chunks": RoleBinding(
        "storable_chunks", "missing", "storable chunks of a group")}
    partial = dataclasses.replace(binding, functions=functions, roles=roles)
    assert store.missing(partial) == ["RequestOffloadState.storable_chunks (missing)"]
    assert store.upstream_store_theorems(partial) == []
    assert store.upstream_end_to_end_theorems(partial) == []
    lines = {u["theorem"]: u["reason"] for u in store.unchecked(partial, {"C9", "C12"})}
    assert set(lines) == {"upstream-store-store-horizon", "upstream-store-store-steps",
                          "upstream-no-lost-hits", "upstream-junction-registered-exact"}
    assert all("RequestOffloadState.storable_chunks" in r for r in lines.values())


def test_a_file_without_the_store_path(write_module: Callable[..., Path]) -> None:
    """A patched file that holds only a scanner: the store theorems are unchecked, with a
    line naming ``_build_store_jobs``; nothing crashes."""
    path = write_module("scan_only.py", FIXED_SCAN)
    binding = bind(resolve_target(f"module:{path}"))
    run = run_audit(binding, AuditOptions(clauses=["C8", "C12"], budget=1000, examples=20,
                                          jobs=1))
    unchecked = {u["theorem"]: u["reason"] for u in run.unchecked}
    assert "_build_store_jobs (missing)" in unchecked["upstream-store-offered-at-most-once"]
    assert "_build_store_jobs" in unchecked["upstream-no-lost-hits"]
    assert not any(r["theorem"].startswith(store.UPSTREAM_STORE) for r in run.rows)


def test_scoped_store_path_on_a_preset() -> None:
    """``--model``: the upstream store theorems observe the scoped store space (here
    GPT-OSS-20B with its EAGLE-3 drafter, bpc 4, vLLM's default retention 0), where
    upstream's executed store path offers what the tracker offers."""
    from kvcontract.spec.models import get_preset
    from kvcontract.tools.audit.engine import theorems_for

    binding = _bound("0.33.0")
    assert binding.implementation is not None
    scope = (("gpt-oss-20b-eagle3 bpc=4", get_preset("gpt-oss-20b-eagle3").geometry(4)),)
    theorem = next(t for t in theorems_for(binding, scope)
                   if t.name == store.UPSTREAM_STORE + "store-steps")
    assert isinstance(theorem, CaseProperty)
    run = store.make_store_runner(binding)
    cases = list(theorem.space.cases())
    assert cases and all(c.geometry_name == "gpt-oss-20b-eagle3 bpc=4" for c in cases)
    for case in cases:
        upstream, ours = run(case), simulate_store_case(case, _with_horizon(binding))
        for g in range(len(case.geometry.groups)):
            assert _offers(upstream, g) == _offers(ours, g), case
            assert upstream.next_indices[g] == ours.next_indices[g], case


def test_lookahead_geometries_are_left_out_where_the_release_has_no_such_mode() -> None:
    """0.33.0's offloading code has no lookahead block hashes (docs/CONTRACT.md 2.1): its
    upstream store theorems leave those geometries out, saying why, instead of judging
    a mode the release does not have."""
    binding = _bound("0.33.0")
    assert not has_lookahead_hashes(binding)
    theorems = store.upstream_store_theorems(binding)
    assert theorems
    cases = list(theorems[0].space.cases())
    assert cases and not any(case.geometry.hash_lookahead for case in cases)
    assert derived_spaces.LOOKAHEAD_NOTE in theorems[0].space.describe()
