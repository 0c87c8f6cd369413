"""The public Python API (kvcontract.api, re-exported by kvcontract): cheap to import,
implementations by name, object or ``module:FILE.py``, arguments validated like the
command line's, Ctrl-C as KeyboardInterrupt, reproducers that import only public
modules."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import kvcontract
from kvcontract import api
from kvcontract.errors import (
    InputFileError,
    KvContractError,
    UnknownClauseError,
    UnknownPropertyError,
    UnknownTargetError,
    UsageError,
    WitnessError,
)
from kvcontract.impl.variants import REFERENCE, VARIANTS

ROOT = Path(__file__).resolve().parents[2]

MTP_PATCH = '''"""Ignores MTP's extra retained tokens when freeing (the shape of seed 003)."""


def get_num_skipped_tokens(num_computed_tokens, sliding_window, extra_retained):
    num_skipped = num_computed_tokens - sliding_window + 1
    if num_skipped < 0:
        return 0
    return num_skipped
'''
"""Violates C1 (retained-blocks-exact, load-set-exact) in about a second."""

WINDOW_PATCH = '''def get_sliding_window_size_in_chunks(sliding_window, extra_retained,
                                      tokens_per_chunk):
    lower = _cdiv(sliding_window, tokens_per_chunk)  # upstream's lower bound
    history = _cdiv(sliding_window - 1 + extra_retained, tokens_per_chunk)
    return lower if lower > history else history
'''
"""Upstream's window formula; load_window_size_in_chunks calls it, so it changes too."""


@pytest.fixture
def patches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "mtp.py").write_text(MTP_PATCH, encoding="utf-8")
    (tmp_path / "window.py").write_text(WINDOW_PATCH, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_import_is_cheap() -> None:
    code = ("import sys, kvcontract, kvcontract.api\n"
            "impl = kvcontract.load_implementation('reference')\n"
            "print(sorted(m for m in ('z3', 'torch', 'click', 'rich', 'hypothesis')"
            " if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=True)
    assert done.stdout.strip() == "[]"


def test_exports() -> None:
    for name in ("prove", "audit", "fuzz", "replay", "load_implementation", "assert_contract",
                 "ProveReport", "FuzzReport", "TheoremResult", "Verdict", "Impact",
                 "Implementation", "ContractViolation", "UsageError", "WitnessError"):
        assert name in kvcontract.__all__ and getattr(kvcontract, name) is not None
    assert kvcontract.prove is api.prove
    # Every public name of the API module is served by the package too.
    exported = {n for n in api.__all__ if n != "IMPL_ENV"}
    assert exported <= set(kvcontract.__all__)
    assert all(getattr(kvcontract, n) is getattr(api, n) for n in exported)
    assert issubclass(kvcontract.ContractViolation, AssertionError)
    assert kvcontract.ProveReport.__name__ == "ProveReport"
    with pytest.raises(AttributeError):
        _ = kvcontract.no_such_name  # type: ignore[attr-defined]


# -- implementations ------------------------------------------------------------------------
def test_load_by_name_and_object() -> None:
    assert api.load_implementation("reference") is REFERENCE
    assert api.load_implementation(" upstream-current ") is VARIANTS["upstream-current"]
    assert api.load_implementation(REFERENCE) is REFERENCE
    with pytest.raises(UnknownTargetError, match=r"module:FILE\.py"):
        api.load_implementation("nope")
    with pytest.raises(UsageError):
        api.load_implementation(3)  # type: ignore[arg-type]


def test_load_module_file(patches: Path) -> None:
    impl = api.load_implementation("module:window.py")
    assert impl.name == "module:window.py"
    changed = {f for f in ("get_sliding_window_size_in_chunks", "load_window_size_in_chunks",
                           "sliding_window_lookup", "is_block_reachable")
               if getattr(impl, f) is not getattr(REFERENCE, f)}
    assert changed == {"get_sliding_window_size_in_chunks", "load_window_size_in_chunks"}
    assert impl.get_sliding_window_size_in_chunks(9, 0, 4) == 3  # cdiv(9, 4), not 2
    assert REFERENCE.get_sliding_window_size_in_chunks(9, 0, 4) == 2
    assert api.load_implementation("module:window.py") is impl  # cached while unchanged
    (patches / "window.py").write_text(WINDOW_PATCH + "\n# edited\n", encoding="utf-8")
    os.utime(patches / "window.py", ns=(time.time_ns(), time.time_ns() + 10**9))
    assert api.load_implementation("module:window.py") is not impl


def test_a_whole_copy_of_the_reference_loads(patches: Path) -> None:
    """A file defining every function of impl/reference.py (a user's edited copy): the
    two EAGLE-drop fields are read from their one function, ``drops_eagle_block``."""
    import inspect

    from kvcontract.impl import reference

    (patches / "copy.py").write_text(inspect.getsource(reference), encoding="utf-8")
    impl = api.load_implementation("module:copy.py")
    assert impl.lookup_drops_eagle_block(True, 0) and not impl.store_drops_eagle_block(True, 1)
    assert impl.lookup_drops_eagle_block.__name__ == "drops_eagle_block"


@pytest.mark.parametrize(("source", "name", "error", "match"), [
    (None, "missing.py", InputFileError, "no such file"),
    ("x = 1\n", "notes.txt", UsageError, r"module:FILE\.py"),
    ("def unrelated():\n    return 1\n", "other.py", UsageError, "impl/reference.py"),
    ("def get_num_skipped_tokens(a, b, c):\n    return 0\nraise RuntimeError('boom')\n",
     "raises.py", InputFileError, "RuntimeError: boom"),
    ("def lookup_complete_chunks():\n    pass\n\nclass StoreTracker:\n    pass\n",
     "scheduler.py", UsageError, "impl/scheduler.py"),
    ("def get_num_skipped_tokens(:\n", "broken.py", UsageError, "cannot read"),
])
def test_bad_module_files(patches: Path, source: str | None, name: str,
                          error: type[Exception], match: str) -> None:
    if source is not None:
        (patches / name).write_text(source, encoding="utf-8")
    with pytest.raises(error, match=match):
        api.load_implementation(f"module:{name}")


def test_prove_a_module_file_and_replay(patches: Path) -> None:
    report = kvcontract.prove("module:mtp.py", clauses="C1", jobs=1)
    assert report.target == "module:mtp.py"
    assert report.exit_code == 1
    found = {r.theorem: r for r in report.results}
    assert found["retained-blocks-exact"].verdict is kvcontract.Verdict.COUNTEREXAMPLE
    assert found["retained-blocks-exact"].impact == "corruption"
    witness = found["retained-blocks-exact"].witness
    assert witness is not None
    assert kvcontract.replay("C1/retained-blocks-exact", witness, "module:mtp.py")
    assert kvcontract.replay("C1/retained-blocks-exact", witness) is None
    with pytest.raises(UnknownPropertyError):
        kvcontract.replay("C1/no-such-theorem", witness)
    with pytest.raises(WitnessError):
        kvcontract.replay("C1/retained-blocks-exact", [1, 2])  # type: ignore[arg-type]


def test_prove_an_implementation_object() -> None:
    broken = dataclasses.replace(REFERENCE, retained_block_range=lambda n, bs, sw, e: (0, 0))
    before = dict(VARIANTS)
    report = kvcontract.prove(broken, clauses=["C1"], jobs=1)
    assert report.target == "custom:reference"
    assert report.exit_code == 1
    assert before == VARIANTS  # registered for the call only


def test_assert_contract(patches: Path) -> None:
    assert kvcontract.assert_contract("reference", ["C1"], jobs=1).exit_code == 0
    with pytest.raises(kvcontract.ContractViolation) as caught:
        kvcontract.assert_contract("module:mtp.py", ["C1"], jobs=1)
    message = str(caught.value)
    assert "C1/retained-blocks-exact: COUNTEREXAMPLE [corruption]" in message
    assert '"theorem": "C1/retained-blocks-exact"' in message  # the witness
    assert caught.value.report.exit_code == 1
    # Below --fail-on the finding is reported and passes, as on the command line.
    assert kvcontract.assert_contract("module:mtp.py", ["C1"], jobs=1,
                                      fail_on="lost-hit").exit_code == 0


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"clauses": ["C99"]}, UnknownClauseError, "C99"),
    ({"clauses": ["C11"]}, UsageError, "kvcontract fuzz"),
    ({"clauses": [2]}, UsageError, "strings"),
    ({"jobs": 0}, UsageError, "at least 1"),
    ({"jobs": "2"}, UsageError, "integer"),
    ({"fail_on": "sometimes"}, UsageError, "sometimes"),
    ({"model": "no-such-model"}, UsageError, "no-such-model"),
    ({"bpc": 4}, UsageError, "--model"),
    ({"model": "gpt-oss-20b", "bpc": 0}, UsageError, "--bpc"),
    ({"geometries": [object()]}, UsageError, "geometries"),
    ({"geometries": [{"groups": []}]}, UsageError, "groups"),
    ({"geometries": ["/no/such/geometry.json"]}, InputFileError, "geometry.json"),
    ({"impl": "no-such-impl"}, UnknownTargetError, "no-such-impl"),
])
def test_prove_validates_before_any_work(kwargs: dict[str, object], error: type[Exception],
                                         match: str) -> None:
    started = time.perf_counter()
    with pytest.raises(error, match=match):
        kvcontract.prove(**kwargs)  # type: ignore[arg-type]
    assert time.perf_counter() - started < 10


def test_prove_on_given_geometries() -> None:
    geometry = kvcontract.Geometry.from_dict({"groups": [
        {"kind": "full", "block_size": 16},
        {"kind": "sliding_window", "block_size": 4, "sliding_window": 8}]})
    report = kvcontract.prove("reference", clauses=["C1"], geometries=[("mine", geometry)],
                              jobs=1)
    assert report.exit_code == 0
    assert [g["label"] for g in report.geometries] == ["mine"]


def test_fuzz_and_audit() -> None:
    fuzzed = kvcontract.fuzz("reference", examples=0)
    assert fuzzed.exit_code == 0 and fuzzed.cases >= 5 and not fuzzed.differences
    for kwargs, match in (({"examples": -1}, "at least 0"), ({"device": "tpu"}, "tpu"),
                          ({"seed": -1}, "seed"), ({"matrix": True, "model": "gpt-oss-20b"},
                                                   "matrix")):
        with pytest.raises(UsageError, match=match):
            kvcontract.fuzz("reference", **kwargs)  # type: ignore[arg-type]
    audited = kvcontract.audit("reference", clauses=["C1"], jobs=1)
    assert audited["command"] == "audit" and audited["exit_code"] == 0
    assert {r["verdict"] for r in audited["results"]} == {"PROVED"}
    for target, kwargs, error in ((3, {}, UsageError), ("nothing-here", {}, UnknownTargetError),
                                  ("reference", {"timeout": float("nan")}, UsageError),
                                  ("reference", {"budget": 0}, UsageError),
                                  ("reference", {"clauses": ["C0"]}, UnknownClauseError)):
        with pytest.raises(error):
            kvcontract.audit(target, **kwargs)  # type: ignore[arg-type]


def test_errors_are_one_hierarchy() -> None:
    for error in (UsageError, UnknownClauseError, UnknownTargetError, UnknownPropertyError,
                  InputFileError, WitnessError, kvcontract.GeometryError):
        assert issubclass(error, KvContractError)


def test_ctrl_c_reaches_the_caller(tmp_path: Path) -> None:
    """Ctrl-C (SIGINT to the process group, as a terminal sends it) during a parallel
    proof: the caller gets KeyboardInterrupt at once, no traceback of a worker."""
    script = tmp_path / "interrupt.py"
    script.write_text(textwrap.dedent("""
        import sys
        import kvcontract
        print("started", flush=True)
        try:
            kvcontract.prove("reference", jobs=2)  # every clause: a minute, interrupted
        except KeyboardInterrupt:
            print("KeyboardInterrupt", flush=True)
            sys.exit(42)
        print("finished", flush=True)
    """), encoding="utf-8")
    process = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)
    assert process.stdout is not None
    assert process.stdout.readline().strip() == "started"
    time.sleep(2.5)
    os.killpg(process.pid, signal.SIGINT)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 42, (out, err)
    assert "KeyboardInterrupt" in out
    assert "Traceback" not in err, err


# -- reproducers import only public modules ------------------------------------------------
def test_reproducers_import_only_public_modules(patches: Path) -> None:
    out = patches / "repro"
    done = subprocess.run([sys.executable, "-m", "kvcontract", "gen-tests", "--impl",
                           "module:mtp.py", "--clause", "C1", "--jobs", "1", "--quiet",
                           "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    files = sorted(out.glob("test_*.py"))
    assert len(files) == 2
    for path in files:
        imported = re.findall(r"^(?:from|import) (\S+)", path.read_text(), re.MULTILINE)
        assert set(imported) <= {"__future__", "os", "kvcontract.api",
                                 "kvcontract.spec.properties"}, imported
    env = {k: v for k, v in os.environ.items() if k != api.IMPL_ENV}
    pytest_run = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(out)]
    failing = subprocess.run(pytest_run, capture_output=True, text=True, env=env, timeout=300,
                             cwd=patches)
    assert failing.returncode == 1, failing.stdout
    assert "C1 violated" in failing.stdout
    fixed = subprocess.run(pytest_run, capture_output=True, text=True, timeout=300,
                           env={**env, api.IMPL_ENV: "reference"}, cwd=patches)
    assert fixed.returncode == 0, fixed.stdout


# -- the Python API section of docs/usage.md runs ------------------------------------------
def readme_blocks(heading: str, language: str = "python") -> list[str]:
    """The ``language`` code blocks of the section ``## heading`` of docs/usage.md (the
    README's long sections moved there)."""
    text = (ROOT / "docs" / "usage.md").read_text(encoding="utf-8")
    section = text.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    return [block.split("```", 1)[0] for block in section.split(f"```{language}\n")[1:]]


def test_readme_api_snippet_runs(patches: Path, capsys: pytest.CaptureFixture[str]) -> None:
    patch, usage = readme_blocks("Python API")
    assert patch.startswith("# my_patch.py")
    (patches / "my_patch.py").write_text(patch, encoding="utf-8")
    exec(compile(usage, "<docs/usage.md>", "exec"), {})
    assert "C1/retained-blocks-exact: COUNTEREXAMPLE [corruption]" in capsys.readouterr().out


PACKAGE_IMPLS = '''import dataclasses

import kvcontract
from kvcontract.impl.variants import VARIANTS

BROKEN = dataclasses.replace(
    kvcontract.load_implementation("reference"), name="pkg-broken",
    retained_block_range=lambda n, bs, sw, e: (0, 0))


def make_upstream_window():
    """A factory: entry points and package.module:NAME may name one."""
    upstream = VARIANTS["upstream-current"]
    return dataclasses.replace(kvcontract.load_implementation("reference"),
                               name="pkg-window",
                               load_window_size_in_chunks=upstream.load_window_size_in_chunks)


NOT_AN_IMPLEMENTATION = 42
'''


@pytest.fixture
def package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An importable package ``kvc_user_impls`` and an installed distribution that
    registers two of its implementations as entry points (a dist-info on ``sys.path``,
    which is what ``pip install`` leaves)."""
    pkg = tmp_path / "kvc_user_impls"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "impls.py").write_text(PACKAGE_IMPLS)
    dist = tmp_path / "kvc_user_impls-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: kvc-user-impls\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        "[kvcontract.implementations]\n"
        "user-window = kvc_user_impls.impls:make_upstream_window\n"
        "user-broken-entry = kvc_user_impls.no_such_module:X\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in [m for m in sys.modules if m.startswith("kvc_user_impls")]:
        sys.modules.pop(name)


def test_package_module_name(package: Path) -> None:
    broken = api.load_implementation("kvc_user_impls.impls:BROKEN")
    assert broken.name == "pkg-broken"
    window = api.load_implementation("kvc_user_impls.impls:make_upstream_window")
    assert window.name == "pkg-window"  # a factory is called
    before = dict(VARIANTS)
    report = kvcontract.prove("kvc_user_impls.impls:BROKEN", clauses=["C1"], jobs=1)
    assert report.exit_code == 1
    assert before == VARIANTS  # registered for the call only
    with pytest.raises(UsageError, match="not a kvcontract Implementation"):
        api.load_implementation("kvc_user_impls.impls:NOT_AN_IMPLEMENTATION")
    with pytest.raises(UsageError, match="has no attribute NOPE"):
        api.load_implementation("kvc_user_impls.impls:NOPE")
    with pytest.raises(UsageError, match=r"cannot import kvc_user_impls\.nothing"):
        api.load_implementation("kvc_user_impls.nothing:X")


def test_entry_point_group(package: Path) -> None:
    names = api.implementation_names()
    assert names[0] == "reference"
    assert {"user-window", "user-broken-entry"} <= set(names)
    window = api.load_implementation("user-window")
    assert window.name == "pkg-window"
    report = kvcontract.prove("user-window", clauses=["C4"], jobs=1)
    assert report.exit_code == 1  # upstream's window formula: C4 load-window-exact
    with pytest.raises(UsageError, match=r"entry point 'user-broken-entry'.*cannot be loaded"):
        api.load_implementation("user-broken-entry")
    with pytest.raises(UnknownTargetError) as unknown:
        api.load_implementation("no-such-implementation")
    assert "user-window" in str(unknown.value) and "package.module:NAME" in str(unknown.value)


def test_cli_takes_package_module_name(package: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(package)}
    run = subprocess.run([sys.executable, "-m", "kvcontract", "prove", "--no-cache", "--impl",
                          "kvc_user_impls.impls:BROKEN", "--clause", "C1", "--jobs", "1"],
                         capture_output=True, text=True, env=env, cwd=package)
    assert run.returncode == 1, run.stdout + run.stderr
    bad = subprocess.run([sys.executable, "-m", "kvcontract", "prove", "--impl",
                          "kvc_user_impls.impls:NOPE", "--clause", "C1"],
                         capture_output=True, text=True, env=env, cwd=package)
    assert bad.returncode == 2 and "has no attribute NOPE" in bad.stderr


def test_the_api_and_the_cli_give_the_same_audit_document(tmp_path: Path) -> None:
    """One pipeline (tools/audit/command.produce_report): the same audit through
    ``kvcontract.api.audit`` and through ``kvcontract audit --json`` is one document,
    its timing aside."""
    from kvcontract.tools.cli import main
    from kvcontract.tools.reports.merge import comparable

    out = tmp_path / "cli.json"
    with pytest.raises(SystemExit):
        main(["audit", "--target", "builtin:unaligned-hit", "--clause", "C2", "--clause",
              "C4", "--jobs", "1", "--quiet", "--timeout", "2", "--json", str(out)])
    cli = json.loads(out.read_text())
    api = kvcontract.audit("builtin:unaligned-hit", clauses=["C2", "C4"], jobs=1)
    for report in (cli, api):
        for defect in report.get("defects", []):
            defect.pop("explain", None)  # names the JSON file the CLI wrote
            defect.pop("reproduce", None)
    assert comparable(api) == comparable(cli)
    assert api["exit_code"] == cli["exit_code"] == 1


def test_the_api_and_the_cli_give_the_same_prove_document(tmp_path: Path) -> None:
    """One pipeline (api.run_prove, api.prove_document): ``kvcontract prove --json``
    and the API's document agree, defects and their root causes included, timing aside."""
    from kvcontract.api import prove_document, run_prove
    from kvcontract.options import prove_options
    from kvcontract.tools.cli import main
    from kvcontract.tools.reports.merge import comparable

    out = tmp_path / "cli.json"
    with pytest.raises(SystemExit):
        main(["prove", "--impl", "unaligned-hit", "--clause", "C2", "--jobs", "1",
              "--no-cache", "--quiet", "--json", str(out)])
    cli = json.loads(out.read_text())
    options = prove_options("unaligned-hit", clauses=("C2",), jobs=1,
                            fail_on=kvcontract.prove("reference", "C1", jobs=1).fail_on,
                            report_file=str(out))
    api = prove_document(run_prove(options), options)
    assert api["defects"] and api["defects"] == cli["defects"]
    assert comparable(api) == comparable(cli)
    assert api["exit_code"] == cli["exit_code"] == 1
