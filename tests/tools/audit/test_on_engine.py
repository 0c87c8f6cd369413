"""The audit judged on vLLM's engine (tools/audit/on_engine): who judges, how findings
the engine did not judge are graded, what a report says and exits with."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from kvcontract.tools.audit.on_engine import STAND_INS, grade, prepare_engine
from kvcontract.tools.audit.report import exit_code
from kvcontract.tools.audit.targets import resolve_target
from kvcontract.tools.reports.summary import summary_lines
from kvcontract.vocabulary import Impact


def _row(theorem: str, judge: str, impact: str | None, cause: str | None = None,
         verdict: str = "COUNTEREXAMPLE", **extra: Any) -> dict[str, Any]:
    row: dict[str, Any] = {"clause": "C4", "theorem": theorem, "verdict": verdict,
                           "impact": impact, "judge": judge, **extra}
    if cause is not None:
        row["root_cause"] = {"how": "rebound", "functions": [{"qualname": cause}]}
    return row


ENGINE = {"ran": True, "release": "vLLM 9.9.9 (installed)"}


def test_a_finding_the_engine_shows_keeps_its_impact_and_says_so() -> None:
    rows = [_row("upstream-lookup-is-maximal", "engine", "lost-hit", "W"),
            _row("window-exact", "functions", "lost-hit", "W"),
            _row("mask-exact", "functions", "lost-hit", "mask"),
            _row("lookup-is-maximal", "functions", "lost-hit", "lw",
                 engine_replay={"fails": True, "message": "lost"})]
    grade(rows, ENGINE)
    assert rows[1]["impact"] == "lost-hit"
    assert rows[1]["reached_by"] == ["C4/upstream-lookup-is-maximal"]
    assert rows[2]["impact"] == Impact.LATENT.value and "no run of vLLM's engine" in \
        rows[2]["latent"]
    assert rows[3]["reached_by"] == ["its witness, run on vLLM's engine"]
    # idempotent: grading again (a merge of shards) gives the same rows
    again = [dict(r) for r in rows]
    grade(again, ENGINE)
    assert again == rows


def test_a_finding_reached_only_in_a_mode_needs_that_mode() -> None:
    """A finding reached only through engine findings that need a configuration beyond
    vLLM's defaults (legacy block hashes) needs it too; one also reached in the default
    mode does not."""
    from kvcontract.tools.audit.on_engine import LEGACY_HASHES_MODE

    legacy = {**_row("upstream-no-lost-hits", "engine", "lost-hit", "replay"),
              "mode": LEGACY_HASHES_MODE}
    rows = [legacy, _row("mask-exact", "functions", "lost-hit", "replay")]
    grade(rows, ENGINE)
    assert rows[1]["mode"] == LEGACY_HASHES_MODE
    # an engine finding of another impact in the default mode does not lift it
    rows += [_row("upstream-store-store-horizon", "engine", "waste", "replay")]
    grade(rows, ENGINE)
    assert rows[1]["mode"] == LEGACY_HASHES_MODE
    rows += [_row("upstream-lookup-is-maximal", "engine", "lost-hit", "replay")]
    grade(rows, ENGINE)
    assert "mode" not in rows[1] and rows[1]["impact"] == "lost-hit"


def test_a_finding_the_engine_stopped_short_of_is_unconfirmed_not_latent() -> None:
    """An engine search cut by the budget (TESTED) may not have reached a finding: not
    reaching it proves nothing, so the finding is unconfirmed (exit 3), never latent
    (exit 0)."""
    rows = [{**_row("upstream-lookup-defers-only-in-scope", "engine", None, "scan"),
             "verdict": "TESTED"},
            _row("scan-refines-spec", "functions", "delay", "scan")]
    grade(rows, ENGINE)
    assert rows[1]["impact"] == "delay" and "stopped short" in rows[1]["unconfirmed"]
    assert exit_code({"results": rows}) == 3
    report = {"target": "t", "results": rows, "engine": ENGINE,
              "defects": [{"id": "Dabc", "impact": "delay", "impacts": ["delay"],
                           "latent": False, "unconfirmed": True, "clauses": ["C3"],
                           "title": "scanner", "theorems": ["C3/scan-refines-spec"]}]}
    text = "\n".join(line for line, _ in summary_lines(report))
    assert "unconfirmed (vLLM's engine did not reach it before its search stopped" in text


def test_a_latent_engine_finding_confirms_nothing() -> None:
    rows = [_row("upstream-lookup-converges", "engine", "latent", "W"),
            _row("window-exact", "functions", "lost-hit", "W")]
    grade(rows, ENGINE)
    assert rows[1]["impact"] == "latent"


def test_without_an_engine_findings_are_unconfirmed_and_exit_3() -> None:
    fallback = {"ran": False, "why": "no vllm package is installed", "fallback": True}
    rows = [_row("upstream-lookup-is-maximal", "stand-ins", "lost-hit", "W"),
            _row("window-exact", "functions", "lost-hit", "W"),
            _row("prefix", "functions", None, verdict="PROVED")]
    grade(rows, fallback)
    assert rows[0]["unconfirmed"].startswith(STAND_INS) and rows[0]["impact"] == "lost-hit"
    report = {"results": rows}
    assert exit_code(report) == 3
    # Stand-ins chosen (--judge stand-ins): the findings stand as the stand-ins judged
    chosen = [_row("window-exact", "functions", "lost-hit", "W")]
    grade(chosen, {"ran": False, "why": "stand-ins chosen", "fallback": False})
    assert "unconfirmed" not in chosen[0] and exit_code({"results": chosen}) == 1


def test_the_summary_says_who_judged() -> None:
    report: dict[str, Any] = {
        "command": "audit", "target": "vllm:installed", "exit_code": 3, "summary": [],
        "engine": {"ran": False, "why": "vLLM does not import here", "fallback": True},
        "defects": [{"id": "Dabc", "title": "window size W in chunks", "impact": "lost-hit",
                     "impacts": ["lost-hit"], "latent": False, "unconfirmed": True,
                     "clauses": ["C4"], "theorems": ["C4/window-exact"],
                     "witness": {"line": "x"}}]}
    text = "\n".join(line for line, _ in summary_lines(report))
    assert "judged on stand-ins, not run on vLLM: vLLM does not import here" in text
    assert "unconfirmed (judged on stand-ins" in text and "[Dabc]" in text
    report["engine"] = {"ran": True, "release": "vLLM 0.34.0 (installed)"}
    report["defects"][0]["unconfirmed"] = False
    text = "\n".join(line for line, _ in summary_lines(report))
    assert "judged on vLLM's engine: vLLM 0.34.0 (installed)" in text
    assert "[1] window size W in chunks" in text


def test_who_cannot_be_judged_on_the_engine(tmp_path: Path) -> None:
    assert prepare_engine(resolve_target("builtin:reference"))[0] is None
    patch = tmp_path / "p.py"
    patch.write_text("def get_sliding_window_size_in_chunks(spec, tpc):\n    return 1\n")
    engine, why = prepare_engine(resolve_target(f"module:{patch}", base="none"))
    assert engine is None and "--base none" in why
    engine, why = prepare_engine(resolve_target("builtin:reference"), "stand-ins")
    assert engine is None
    from kvcontract.errors import UsageError

    with pytest.raises(UsageError, match="--judge"):
        prepare_engine(resolve_target("builtin:reference"), "oracle")


@pytest.mark.live
def test_the_installed_vllm_judges_its_own_lookup(tmp_path: Path) -> None:
    """An audit of the installed vLLM: the upstream lookup theorems run on vLLM's engine
    (C3 on the first geometries of the family), every row says who judged, and the
    formula findings are graded by the engine."""
    from tests.live.conftest import _FOUND, LIVE_REASON

    if not _FOUND.ok:
        pytest.skip(LIVE_REASON)
    from kvcontract.tools.cli import main

    out = tmp_path / "r.json"
    with pytest.raises(SystemExit) as info:
        main(["audit", "--target", "vllm:installed", "--clause", "C3", "--budget", "4000",
              "--jobs", "2", "--quiet", "--catalogue-only", "--json", str(out)])
    report = json.loads(out.read_text())
    assert int(info.value.code or 0) == report["exit_code"]
    assert report["engine"]["ran"] is True
    rows = {r["theorem"]: r for r in report["results"]}
    engine_row = rows["upstream-lookup-defers-only-in-scope"]
    assert engine_row["judge"] == "engine" and engine_row["engine"]["vllm_runs"] > 0
    assert "vLLM's own scheduler and OffloadingConnector" in engine_row["via"]
    assert all(r.get("judge") in ("engine", "functions", "stand-ins")
               for r in report["results"])
    for row in report["results"]:
        if row["verdict"] == "COUNTEREXAMPLE" and row["judge"] != "engine":
            assert row["impact"] == "latent" or row.get("reached_by"), row["theorem"]


def _package(folder: Path, version: str, *modules: str) -> Path:
    package = folder / "vllm"
    for module in ("__init__.py", *modules):
        (package / module).parent.mkdir(parents=True, exist_ok=True)
        (package / module).write_text(f"# {version} {module}\n")
    (package / "_version.py").write_text(f"__version__ = version = '{version}'\n")
    return package


def test_a_partial_tree_of_another_release_runs_among_its_own_release(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The audited files of release B over an installed release A run among B's whole
    Python from B's cached wheel (A's compiled parts beneath); without the wheel the
    root is refused, naming the download that fixes it."""
    import zipfile

    from kvcontract.live.judge.roots import RootError
    from kvcontract.tools.audit.on_engine import _release_beneath

    monkeypatch.setenv("KVCONTRACT_VLLM_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("KVCONTRACT_ROOTS_DIR", str(tmp_path / "roots"))
    many = [f"m{i}.py" for i in range(8)]  # a release's other modules
    installed = _package(tmp_path / "site", "0.34.0", "a.py", "core/b.py", "core/c.py",
                         "d.py", *many)
    (installed / "_C.abi3.so").write_bytes(b"\0")
    tree = _package(tmp_path / "release", "0.33.0", "core/b.py")
    with pytest.raises(RootError, match=r"no wheel of it is cached \(pip download"):
        _release_beneath(tree, installed)
    wheels = tmp_path / "cache" / "wheels" / "0.33.0"
    wheels.mkdir(parents=True)
    with zipfile.ZipFile(wheels / "vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl",
                         "w") as wheel:
        for module in ("__init__.py", "_version.py", "a.py", "core/b.py", "core/c.py", *many):
            wheel.writestr(f"vllm/{module}", f"# wheel 0.33.0 {module}\n")
        wheel.writestr("vllm/_C.abi3.so", "compiled")
    root = _release_beneath(tree, installed)
    assert root.version == "0.33.0" and root.installed_version == "0.34.0"
    assert "its wheel's Python laid over the installed vLLM 0.34.0" in root.description
    read = {m: (root.package / m).read_text() for m in ("a.py", "core/b.py", "core/c.py")}
    assert read == {"a.py": "# wheel 0.33.0 a.py\n", "core/b.py": "# 0.33.0 core/b.py\n",
                    "core/c.py": "# wheel 0.33.0 core/c.py\n"}
    assert (root.package / "_C.abi3.so").read_bytes() == b"\0"  # the installed build
    assert not (root.package / "d.py").exists()  # modules 0.33.0 does not have
    # the same release as the installed one: its files replace their counterparts
    same = _package(tmp_path / "same", "0.34.0", "core/b.py")
    assert _release_beneath(same, installed).description.endswith(
        "replacing their counterparts in the installed vLLM 0.34.0")


def _mode_fixture(monkeypatch: pytest.MonkeyPatch, fails_at_default: Any,
                  why_not: str | None = None) -> tuple[Any, Any, Any, list[Any]]:
    """A store case at retention None (the witness) in a family of two, an engine store
    theorem failing at retention None and at default retention 0 on the prompts
    ``fails_at_default`` says, an engine judge stub; vLLM's default retention read as 0
    without importing vLLM. Returns the case, the theorem, the judge and the judged
    ``(prompt, retention)`` pairs."""
    from types import SimpleNamespace

    from kvcontract.spec.geometry import Geometry, fa, swa
    from kvcontract.spec.properties.store import STORE_SPACE, StoreCase
    from kvcontract.tools.audit import on_engine

    monkeypatch.setattr(on_engine, "MODE_SETTINGS", (on_engine.ModeSetting(
        "retention_interval", "prefix_cache_retention_interval", lambda: 0, "retained"),))
    geometry = Geometry((fa(16), swa(4, 8)), blocks_per_chunk=8)
    witness = StoreCase("g", geometry, 136, (136,), "aborted")
    family = [witness, dataclasses.replace(witness, prompt_len=140, steps=(140,)),
              dataclasses.replace(witness, geometry=dataclasses.replace(
                  geometry, retention_interval=0)),
              # another block-hash mode (legacy hashes with a drafter): it fails at the
              # default retention, and shows nothing about the witness's mode
              StoreCase("e", Geometry((fa(16), swa(4, 8, eagle=True))), 33, (33,), "finished")]
    seen: list[Any] = []

    def judge(case: StoreCase, observed: Any) -> str | None:
        seen.append((case.prompt_len, case.geometry.retention_interval))
        at_default = case.geometry.retention_interval is not None
        return "waste" if not at_default or fails_at_default(case.prompt_len) \
            or case.geometry_name == "e" else None

    stores = SimpleNamespace(why_not=lambda case: why_not, observe=lambda case: "ran")
    engine = SimpleNamespace(judges=lambda: SimpleNamespace(stores=stores))
    space = dataclasses.replace(STORE_SPACE, family=on_engine.ENGINE_STORE,
                                cases=lambda: iter(family))
    theorem = SimpleNamespace(space=space, relevant=None, judge=judge)
    return witness, theorem, engine, seen


def test_a_finding_gone_at_vllms_default_retention_needs_the_retention(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The retention a finding needs is decided on the engine over its family at vLLM's
    default (not by the geometry, nor by the witness alone): named when no case fails
    there, nothing when one does, 'not decided' when the engine or the budget stops the
    search; nothing to decide at the default already."""
    from kvcontract.tools.audit import on_engine
    from kvcontract.tools.audit.on_engine import finding_mode

    case, theorem, engine, seen = _mode_fixture(monkeypatch, lambda prompt: False)
    mode = finding_mode(case, theorem, engine)
    assert seen == [(136, 0), (140, 0)]  # the witness first, each changed case once
    assert mode is not None and mode.startswith("prefix_cache_retention_interval=None") \
        and "gone at vLLM's default, 0: 2 cases" in mode
    case, theorem, engine, seen = _mode_fixture(monkeypatch, lambda prompt: prompt == 140)
    assert finding_mode(case, theorem, engine) is None and seen == [(136, 0), (140, 0)]
    case, theorem, engine, seen = _mode_fixture(monkeypatch, lambda prompt: False,
                                                why_not="no engine here")
    mode = finding_mode(case, theorem, engine)
    assert seen == [] and mode is not None and "not decided" in mode \
        and "no engine here" in mode
    monkeypatch.setattr(on_engine, "MODE_SEARCH_CASES", 1)
    case, theorem, engine, seen = _mode_fixture(monkeypatch, lambda prompt: False)
    mode = finding_mode(case, theorem, engine)
    assert mode is not None and "the budget stopped the search" in mode
    default = dataclasses.replace(case, geometry=dataclasses.replace(case.geometry,
                                                                      retention_interval=0))
    seen.clear()
    assert finding_mode(default, theorem, engine) is None and seen == []


@pytest.mark.slow
def test_the_abort_tail_finding_needs_dense_retention_on_the_engine(tmp_path: Path) -> None:
    """On vLLM's engine: the store path's abort-tail waste (C10) is gone at vLLM's default
    retention and its defect says so; the lookup's lost hit (C4) needs no mode."""
    from tests.live.conftest import _FOUND, LIVE_REASON

    if not _FOUND.ok:
        pytest.skip(LIVE_REASON)
    from kvcontract.tools.cli import main

    modes = {}
    for clause in ("C10", "C4"):
        out = tmp_path / f"{clause}.json"
        with pytest.raises(SystemExit):
            main(["audit", "--target", "vllm:installed", "--clause", clause, "--jobs", "2",
                  "--quiet", "--catalogue-only", "--json", str(out)])
        report = json.loads(out.read_text())
        modes[clause] = [d.get("mode") for d in report["defects"]]
    assert modes["C10"] and all(m and m.startswith("prefix_cache_retention_interval=None")
                                for m in modes["C10"])
    assert modes["C4"] and all(m is None for m in modes["C4"])


def test_a_junction_never_registered_is_located_where_the_lookup_would_register_it(
        tmp_path: Path) -> None:
    """A junction consumer's finding on a connector with no junction registration, whose
    first consumer registered none, is located at the connector's _lookup; not where the
    release has the registration, nor when a junction was registered, nor for another
    consumer."""
    from types import SimpleNamespace

    from kvcontract.spec.properties.end_to_end import END_TO_END_SPACE
    from kvcontract.tools.audit import on_engine

    junction = next(c for c in END_TO_END_SPACE.cases() if c.consumer.kind == "junction")
    resend = next(c for c in END_TO_END_SPACE.cases() if c.consumer.kind == "resend")
    registered: list[int] = [0]
    resends = SimpleNamespace(observe=lambda case: SimpleNamespace(junction=registered[0]))
    engine = SimpleNamespace(judges=lambda: SimpleNamespace(resends=resends))
    theorem = SimpleNamespace(space=SimpleNamespace(family=on_engine.ENGINE_END_TO_END))
    source = tmp_path / "scheduler.py"

    def cause(methods: str, case: Any) -> Any:
        source.write_text("class OffloadingConnectorScheduler:\n" + "".join(
            f"    def {m}(self):\n        pass\n" for m in methods.split()))
        binding = SimpleNamespace(roles={"multi_group_lookup": SimpleNamespace(
            path=str(source))}, engine=engine)
        return on_engine._absent_junction_registration(binding, theorem, case)

    found = cause("_lookup _lookup_complete_chunks", junction)
    assert found is not None and found["functions"][0]["qualname"] == on_engine.LOOKUP_ENTRY
    assert found["functions"][0]["line"] == 2 and found["how"] == "loop"
    assert cause("_lookup _maybe_register_shared_prefix_junction", junction) is None
    assert cause("_lookup", resend) is None
    registered[0] = 16
    assert cause("_lookup", junction) is None
