"""Packaging (issue 11): the license, the pre-commit hooks, the project metadata."""

from __future__ import annotations

import hashlib
import re
import shlex
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvcontract.tools.cli import cli

ROOT = Path(__file__).resolve().parents[1]

APACHE_2_MD5 = "3b83ef96387f14655fc854ddc3c6bd57"
"""md5 of https://www.apache.org/licenses/LICENSE-2.0.txt, the full text."""


def test_license_is_the_full_apache_2_text() -> None:
    text = (ROOT / "LICENSE").read_bytes()
    assert hashlib.md5(text).hexdigest() == APACHE_2_MD5
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0"
    assert project["license-files"] == ["LICENSE"]
    assert not [c for c in project["classifiers"] if c.startswith("License ::")]  # PEP 639


def _hooks() -> list[dict[str, object]]:
    import yaml  # PyYAML, in the [test] extra
    hooks = yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text(encoding="utf-8"))
    assert isinstance(hooks, list)
    return hooks


def test_pre_commit_hooks() -> None:
    hooks = {h["id"]: h for h in _hooks()}
    assert set(hooks) == {"kvcontract-prove", "kvcontract-audit"}
    for hook in hooks.values():
        assert {"id", "name", "entry", "language"} <= set(hook)
        assert hook["pass_filenames"] is False
        argv = shlex.split(str(hook["entry"]))
        assert argv[0] == "kvcontract"
        # The entry parses (its options exist): --help after them exits 0.
        done = CliRunner().invoke(cli, [*argv[1:], "--help"])
        assert done.exit_code == 0, done.output
    try:  # pre-commit's own schema, when pre-commit is installed
        from pre_commit.clientlib import load_manifest
    except ImportError:
        return
    assert [h["id"] for h in load_manifest(str(ROOT / ".pre-commit-hooks.yaml"))] == [
        "kvcontract-prove", "kvcontract-audit"]


def test_readme_pre_commit_snippet_names_the_hooks() -> None:
    """The pre-commit section of docs/usage.md (moved from the README)."""
    text = (ROOT / "docs" / "usage.md").read_text(encoding="utf-8")
    section = text.split("## pre-commit\n", 1)[1].split("\n## ", 1)[0]
    import yaml
    config = yaml.safe_load(section.split("```yaml\n", 1)[1].split("```", 1)[0])
    ids = {h["id"] for repo in config["repos"] for h in repo["hooks"]}
    assert ids == {h["id"] for h in _hooks()}
    for repo in config["repos"]:
        for hook in repo["hooks"]:
            entry = next(h for h in _hooks() if h["id"] == hook["id"])["entry"]
            argv = [*shlex.split(str(entry))[1:], *hook.get("args", [])]
            if argv[0] == "prove":  # the args parse with the entry (not run: --help)
                done = CliRunner().invoke(cli, [*argv, "--help"])
                assert done.exit_code == 0, done.output


def _package_dirs() -> list[str]:
    """The folders ``[tool.setuptools.package-dir]`` maps to packages (every one the
    build needs: a subpackage added there is copied too)."""
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    table = text.split("\n[tool.setuptools.package-dir]\n", 1)[1].split("\n[", 1)[0]
    folders = re.findall(r'^"[\w.]+"\s*=\s*"([^"]+)"', table, re.MULTILINE)
    assert "kvcontract" in folders, table
    return folders


def _pip_for(env_dir: Path) -> list[str]:
    """A fresh venv at ``env_dir`` and the command that runs pip on it: the running
    interpreter's pip through ``--python`` (pip 22.3+, no copy of pip to install), else
    the venv's own pip."""
    import sys
    import venv

    python = env_dir / "bin" / "python"
    try:
        from pip import __version__ as pip_version
    except ImportError:
        pip_version = "0"
    major, minor = (int(part) for part in re.findall(r"\d+", pip_version)[:2] or (0, 0))
    if (major, minor) >= (22, 3):
        venv.create(env_dir, system_site_packages=False, with_pip=False)
        return [sys.executable, "-m", "pip", "--python", str(python)]
    venv.create(env_dir, system_site_packages=False, with_pip=True)
    return [str(python), "-m", "pip"]


USER_FILE = '''
from kvcontract.spec.geometry import Geometry


def alignment(geometry: Geometry) -> int:
    return geometry.alignment_tokens
'''


def test_mypy_sees_the_types_of_a_strict_editable_install(tmp_path: Path) -> None:
    """A user's mypy run types ``kvcontract`` from an editable install made the way the
    README says (``editable_mode=strict``: a link tree, which mypy follows; the default
    mode's import hook leaves every ``kvcontract`` name ``Any``). The user file returns an
    ``int | None`` as ``int``: mypy must say so, which it can only if it sees the type."""
    import subprocess
    import sys

    if shutil.which("mypy") is None and subprocess.run(
            [sys.executable, "-m", "mypy", "--version"], capture_output=True).returncode:
        pytest.skip("mypy is not installed")
    project = tmp_path / "project"  # a copy: the install writes build/ into the project
    project.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, project / name)
    for package in _package_dirs():
        shutil.copytree(ROOT / package, project / package,
                        ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    env_dir = tmp_path / "venv"
    # Independent of what any interpreter has: no system site packages (inside a
    # virtualenv the "system" is the base interpreter, whose setuptools may predate the
    # project's SPDX license expression), and pip's build isolation installs the
    # project's own `build-system.requires` (setuptools>=77) for the build.
    pip = _pip_for(env_dir)
    python = env_dir / "bin" / "python"
    install = subprocess.run(
        [*pip, "install", "-q", "--no-deps", "--disable-pip-version-check",
         "-e", str(project), "--config-settings", "editable_mode=strict"],
        capture_output=True, text=True, cwd=tmp_path)
    assert install.returncode == 0, install.stderr
    user = tmp_path / "user.py"
    user.write_text(USER_FILE)
    checked = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-incremental", "--python-executable", str(python),
         str(user)], capture_output=True, text=True, cwd=tmp_path)
    assert checked.returncode == 1, checked.stdout + checked.stderr
    assert 'Incompatible return value type (got "int | None", expected "int")' in \
        checked.stdout, checked.stdout
    assert "import-not-found" not in checked.stdout


def test_test_modules_outside_packages_have_unique_basenames() -> None:
    """pytest imports a test module outside a package by its basename (rootdir-relative
    "prepend" mode): two such modules with one name stop the whole run at collection."""
    tests = Path(__file__).resolve().parent
    by_name: dict[str, list[str]] = {}
    for path in sorted(tests.rglob("test_*.py")):
        if not (path.parent / "__init__.py").exists():
            by_name.setdefault(path.name, []).append(str(path.relative_to(tests)))
    assert {n: p for n, p in by_name.items() if len(p) > 1} == {}
