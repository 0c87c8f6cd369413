"""kvcontract.spec.properties.scoped: the catalogue on given geometries (``--model``,
``--geometry``): the same judges over bounded, deterministic case sets chosen around
each geometry's chunk and window boundaries; formula properties restricted to its SWA
groups; witnesses that replay by id.

Command R7B at bpc 1: SWA ``bs 16, sw 4097`` + FA ``bs 16`` (``tpc = A = 16``), retention 0;
``sw = 1 (mod tpc)`` with ``e = 0`` is upstream's window-bound case (one chunk too many).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from kvcontract.impl.variants import REFERENCE, get_implementation
from kvcontract.proofs.theorem import run_property
from kvcontract.proofs.verdicts import Verdict
from kvcontract.spec.geometry import Geometry, fa, swa
from kvcontract.spec.lookup import HIT, HIT_PENDING, MISS
from kvcontract.spec.models import get_preset
from kvcontract.spec.properties import CaseProperty, FormulaProperty, properties, replay
from kvcontract.spec.properties import scoped as S
from kvcontract.spec.properties.base import Violation
from kvcontract.vocabulary import Impact

COMMAND_R = (("command-r7b bpc=1", get_preset("command-r7b").geometry(1)),)
GPT_OSS = (("gpt-oss-20b bpc=1", get_preset("gpt-oss-20b").geometry(1)),)
QWEN = (("qwen3-next-80b bpc=16", get_preset("qwen3-next-80b").geometry(16)),)


def _by_id(scope: S.Scope) -> dict[str, Any]:
    return {p.theorem_id: p for p in S.scoped_properties(scope)}


def test_same_ids_and_judges_other_cases() -> None:
    full = {p.theorem_id: p for p in properties()}
    scoped = _by_id(COMMAND_R)
    assert set(scoped) <= set(full)
    for theorem_id, prop in scoped.items():
        if isinstance(prop, CaseProperty):
            assert prop.judge is full[theorem_id].judge
            assert prop.space.observe is full[theorem_id].space.observe
            assert prop.space.from_json is full[theorem_id].space.from_json
    families: dict[str, set[int]] = {}
    for prop in scoped.values():
        if isinstance(prop, CaseProperty):
            families.setdefault(prop.family, set()).add(id(prop.space))
    # one space per family (the prover checks a family in one pass over it)
    assert all(len(spaces) == 1 for spaces in families.values())
    assert {"lookup", "store", "end-to-end", "scan"} <= set(families)
    # the scanner spec is left out; the scan family runs as in the full catalogue
    assert not any(t.split("/")[1].startswith("spec-") for t in scoped)
    assert scoped["C2/scan-accepts-only-hit"] is full["C2/scan-accepts-only-hit"]
    assert S.scoped_properties(COMMAND_R) is S.scoped_properties(list(COMMAND_R))


@pytest.mark.parametrize("family", ["lookup", "store", "end-to-end"])
def test_cases_are_on_the_geometries_bounded_and_deterministic(family: str) -> None:
    prop = next(p for p in S.scoped_properties(COMMAND_R)
                if isinstance(p, CaseProperty) and p.family == family)
    first = [json.dumps(prop.space.to_json(c), sort_keys=True) for c in prop.space.cases()]
    second = [json.dumps(prop.space.to_json(c), sort_keys=True) for c in prop.space.cases()]
    assert first == second
    assert 50 < len(first) < 5_000
    geometry = COMMAND_R[0][1]
    for case in prop.space.cases():
        assert case.geometry == geometry
        assert case.geometry_name == "command-r7b bpc=1"
    domain = prop.domain
    assert "command-r7b bpc=1" in domain and f"{len(first)} " in domain


def test_prompt_lengths_around_chunks_and_windows() -> None:
    lengths = S.prompt_lengths(COMMAND_R[0][1])
    # one, two, three chunks of 16 (+-1); the window 4097 (+-1); the chunk ends past it
    for n in (15, 16, 17, 32, 48, 4096, 4097, 4098, 4112, 4113, 4128):
        assert n in lengths
    assert lengths == tuple(sorted(set(lengths)))
    # large chunks: prompts of 4k to 12k tokens
    long = S.prompt_lengths(get_preset("command-r7b").geometry(16))
    assert {4097, 8193, 12287} <= set(long) and max(long) <= S.MAX_PROMPT
    assert min(S.prompt_lengths(QWEN[0][1])) >= 4095  # one Mamba/FA chunk is 9216 tokens


def test_lookup_cases_single_faults_at_the_chunks_that_matter() -> None:
    geometry = COMMAND_R[0][1]
    cases = [c for c in S.lookup_cases(COMMAND_R) if c.num_tokens == 4113 and not c.local_hit]
    # every chunk HIT first
    assert all(s == HIT for row in cases[0].states for s in row)
    faults = []
    for case in cases[1:]:
        off = [(g, k, s) for g, row in enumerate(case.states) for k, s in enumerate(row)
               if s != HIT]
        assert 1 <= len(off) <= 2
        faults.append(off)
    singles = {tuple(f[0][:2]) for f in faults if len(f) == 1}
    # the SWA load set at maxhit 4112 is chunks [1, 257): its edges and one either side
    # (chunk 0 is also the extra chunk upstream's window demands), the FA group's last
    assert {(0, 0), (0, 1), (0, 2), (0, 255), (0, 256), (1, 0), (1, 256)} <= singles
    pairs = [f for f in faults if len(f) == 2]
    assert pairs and all({s for _, _, s in f} == {MISS, HIT_PENDING} for f in pairs)
    assert geometry.chunk_tokens(geometry.groups[0]) == 16


def test_formula_properties_on_the_groups_sizes() -> None:
    scoped = _by_id(COMMAND_R)
    prop = scoped["C4/load-window-exact"]
    assert isinstance(prop, FormulaProperty)
    assert prop.symbolic_sizes == ()
    assert "sw" not in prop.variables and "e" not in prop.variables
    [config] = prop.configs()
    assert config.values == {"bs": 16, "bpc": 1, "sw": 4097, "e": 0}
    assert "command-r7b bpc=1" in prop.domain
    # the masks: only the shape the geometry has (no EAGLE, retention 0)
    masks = [t for t in scoped if t.startswith(("C7/", "C8/stored"))]
    # (and the replay boundaries the store path passes: no window, no geometry)
    assert masks == ["C7/replay-boundary-supplied[plain-zero]",
                     "C7/replay-tail-supplied[plain-zero]", "C7/replay-boundaries-exact"]
    notes = " ".join(S.scope_notes(COMMAND_R))
    assert "C7/segment-boundaries-supplied[plain-none]" in notes
    assert "spec-scan-hit-only" in notes


def test_no_swa_group_no_window_properties() -> None:
    scoped = _by_id(QWEN)
    assert not any(t.startswith("C7/") for t in scoped)
    # Full attention and Mamba: of C1, only the Mamba group's retention, at its sizes.
    assert [t for t in scoped if t.startswith("C1/")] == ["C1/mamba-retention-exact"]
    assert "the mamba groups of the given geometries" in scoped["C1/mamba-retention-exact"].domain
    assert "C2/lookup-loads-only-hit" in scoped and "C12/no-lost-hits" in scoped


def test_formula_counterexample_on_the_geometry_replays_by_id() -> None:
    upstream = get_implementation("upstream-current")
    prop = _by_id(COMMAND_R)["C4/load-window-exact"]
    result = run_property(prop, upstream)
    assert result.verdict is Verdict.COUNTEREXAMPLE
    assert result.witness is not None
    values = result.witness["values"]
    assert (values["sw"], values["bs"], values["bpc"], values["e"]) == (4097, 16, 1, 0)
    witness = json.loads(json.dumps(result.witness))
    assert replay("C4/load-window-exact", witness, upstream)
    assert replay("C4/load-window-exact", witness, REFERENCE) is None
    assert run_property(prop, REFERENCE).verdict is Verdict.PROVED_FOR_DOMAIN


def _first_violation(prop: CaseProperty, impl: Any, impacts: set[Impact]) -> Any:
    for case in prop.space.cases():
        message = prop.check(case, impl)
        if message is not None and prop.impact_of(message) in impacts:
            return case, message
    return None


def test_lost_hit_on_command_r_replays_by_id() -> None:
    """Upstream's window bound loses the hits of Command R7B's consumers (C4 in the
    lookup, C12 end to end); the reference loses none and crashes none there."""
    upstream = get_implementation("upstream-current")
    scoped = _by_id(COMMAND_R)
    for theorem_id in ("C4/lookup-is-maximal", "C12/no-lost-hits"):
        prop = scoped[theorem_id]
        found = _first_violation(prop, upstream, {Impact.LOST_HIT})
        assert found is not None, theorem_id
        case, message = found
        witness = json.loads(json.dumps(prop.witness(case)))
        assert witness["geometry" if "geometry" in witness else "producer"]
        again = replay(theorem_id, witness, upstream)
        assert again == message
        assert replay(theorem_id, witness, REFERENCE) is None
    e2e = scoped["C12/no-lost-hits"]
    assert _first_violation(e2e, REFERENCE, {Impact.LOST_HIT, Impact.CRASH}) is None


def test_lookup_catches_a_stale_pending_flag() -> None:
    """Seed 000's shape on a real geometry: the pending/missing pairs find it."""
    prop = _by_id(GPT_OSS)["C3/lookup-defers-only-in-scope"]
    found = _first_violation(prop, get_implementation("stale-pending"), set(Impact))
    assert found is not None
    case, _ = found
    assert sorted(s.name for row in case.states for s in row if s != HIT) == [
        "HIT_PENDING", "MISS"]
    assert _first_violation(prop, REFERENCE, set(Impact)) is None


def test_labels_and_retention_reach_the_cases() -> None:
    geometry = Geometry((fa(16), swa(4, 8)), retention_interval=32)
    scope = (("mine", geometry),)
    store = next(p for p in S.scoped_properties(scope)
                 if isinstance(p, CaseProperty) and p.family == "store")
    cases = list(store.space.cases())
    assert {c.geometry.retention_interval for c in cases} == {32}
    assert {c.prompt_only for c in cases} == {True, False}
    assert {c.ending for c in cases} == {"finished", "aborted"}
    assert all(sum(c.steps) <= c.prompt_len for c in cases)
    masks = [p.theorem_id for p in S.scoped_properties(scope) if p.clause == "C7"]
    assert sorted(masks) == ["C7/replay-boundaries-exact",
                             "C7/replay-boundary-supplied[plain-interval]",
                             "C7/replay-tail-supplied[plain-interval]",
                             "C7/segment-boundaries-supplied[plain-interval]"]
    replay = next(p for p in S.scoped_properties(scope)
                  if p.theorem_id == "C7/replay-boundaries-exact")
    assert isinstance(replay, FormulaProperty)
    assert [c.values for c in replay.configs()] == [
        {"eagle": 0, "Ak": 1, "A": 16, "Rk": 1, "R": 32}]
    assert replay.variables == ("P", "x")
    assert run_property(replay, REFERENCE).verdict is Verdict.PROVED_FOR_DOMAIN


def test_describe_scope() -> None:
    latent = Geometry((fa(528), swa(32, 64)))
    described = S.describe_scope((*COMMAND_R, ("latent", latent)))
    assert described[0]["label"] == "command-r7b bpc=1"
    assert described[0]["preset"] == "command-r7b" and described[0]["buildable"] is True
    assert described[1]["buildable"] is False and "528" in described[1]["reason"]
    assert Geometry.from_dict(described[1]["geometry"]) == latent


def test_violation_type_kept() -> None:
    # scoped judges are the catalogue's: their Violation impacts survive
    prop = _by_id(COMMAND_R)["C12/no-lost-hits"]
    found = _first_violation(prop, get_implementation("upstream-current"), {Impact.LOST_HIT})
    assert found is not None and isinstance(found[1], Violation)
