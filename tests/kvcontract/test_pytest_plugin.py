"""The pytest plugin (kvcontract.pytest_plugin): ``--kvcontract-impl``, the
``kvcontract_impl`` fixture and the ``kvcontract`` marker, run in a child pytest on a
temporary test file (``-p kvcontract.pytest_plugin``, as without the entry point)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

MTP_PATCH = '''def get_num_skipped_tokens(num_computed_tokens, sliding_window, extra_retained):
    num_skipped = num_computed_tokens - sliding_window + 1  # - extra_retained forgotten
    if num_skipped < 0:
        return 0
    return num_skipped
'''


def _readme_plugin_snippet() -> str:
    text = (ROOT / "docs" / "usage.md").read_text(encoding="utf-8")
    section = text.split("## pytest plugin\n", 1)[1].split("\n## ", 1)[0]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "my_patch.py").write_text(MTP_PATCH, encoding="utf-8")
    (tmp_path / "test_contract.py").write_text(_readme_plugin_snippet(), encoding="utf-8")
    return tmp_path


def _pytest(project: Path, *args: str, impl_env: str | None = None,
            ) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("KVCONTRACT_IMPL", "PYTEST_ADDOPTS", "COLUMNS")}
    if impl_env is not None:
        env["KVCONTRACT_IMPL"] = impl_env
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "kvcontract.pytest_plugin", "-p",
         "no:cacheprovider", "-rf", "test_contract.py", *args],
        cwd=project, capture_output=True, text=True, env=env, timeout=300)


def test_marker_fails_with_the_counterexample(project: Path) -> None:
    done = _pytest(project, "--kvcontract-impl", "module:my_patch.py")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "1 failed, 1 passed" in done.stdout
    assert "test_retention_contract" in done.stdout
    assert "C1/retained-blocks-exact: COUNTEREXAMPLE [corruption]" in done.stdout
    assert '"theorem": "C1/retained-blocks-exact"' in done.stdout  # the witness
    assert "kvcontract: implementation module:my_patch.py" in done.stdout  # the header


def test_reference_passes_and_env_var_chooses(project: Path) -> None:
    assert _pytest(project).returncode == 0  # default: the reference
    from_env = _pytest(project, impl_env="module:my_patch.py")
    assert from_env.returncode == 1, from_env.stdout


def test_unknown_implementation_is_a_usage_error(project: Path) -> None:
    done = _pytest(project, "--kvcontract-impl", "no-such-impl")
    assert done.returncode == pytest.ExitCode.USAGE_ERROR
    assert "--kvcontract-impl: unknown implementation 'no-such-impl'" in done.stderr
    assert "Traceback" not in done.stderr


def test_entry_point_is_declared() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    data = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    entry = data["project"]["entry-points"]["pytest11"]
    # Named as the module, so `-p kvcontract.pytest_plugin` and the automatic loading of
    # an installed kvcontract never register it twice.
    assert entry == {"kvcontract.pytest_plugin": "kvcontract.pytest_plugin"}


def test_importing_the_plugin_is_cheap() -> None:
    code = ("import sys, kvcontract.pytest_plugin\n"
            "print(sorted(m for m in ('z3', 'torch') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=True)
    assert done.stdout.strip() == "[]"
