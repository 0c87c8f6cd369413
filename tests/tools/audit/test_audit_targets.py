"""Target resolution: every accepted form, and a one-line error for everything else."""

from __future__ import annotations

import importlib.util
import subprocess
import textwrap
import zipfile
from pathlib import Path

import pytest
from audit_releases import STALE_PENDING_SCAN, release_tree

from kvcontract.errors import InputFileError, UnknownTargetError, UsageError
from kvcontract.tools.audit.audited_files import MANAGER, SCHEDULER
from kvcontract.tools.audit.binding import bind
from kvcontract.tools.audit.targets import resolve_target
from kvcontract.tools.audit.wheels import FetchError, fetch_release


def test_builtin_forms() -> None:
    assert resolve_target("builtin:stale-pending").builtin == "stale-pending"
    assert resolve_target("reference").kind == "builtin"
    binding = bind(resolve_target("unaligned-hit"))
    assert binding.implementation is not None
    assert binding.implementation.name == "unaligned-hit"


@pytest.mark.parametrize("spec", ["", "nonsense", "builtin:nope", "vllm:", "other:thing"])
def test_unknown_targets(spec: str) -> None:
    with pytest.raises(UnknownTargetError) as info:
        resolve_target(spec)
    assert "\n" not in str(info.value)
    assert isinstance(info.value, UsageError)


def test_bad_paths(tmp_path: Path) -> None:
    with pytest.raises(InputFileError, match="no such file or directory"):
        resolve_target(f"vllm:{tmp_path / 'missing'}")
    with pytest.raises(InputFileError, match="no vLLM offloading sources"):
        resolve_target(f"vllm:{tmp_path}")
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(InputFileError, match="must be a folder"):
        resolve_target(f"vllm:{tmp_path / 'notes.txt'}")
    with pytest.raises(InputFileError, match=r"\.py"):
        resolve_target(f"module:{tmp_path / 'notes.txt'}")
    with pytest.raises(InputFileError, match="no such file"):
        resolve_target(f"module:{tmp_path / 'absent.py'}")


def test_unparsable_module_is_an_input_error(tmp_path: Path) -> None:
    path = tmp_path / "broken.py"
    path.write_text("def _sliding_window_lookup(:\n")
    with pytest.raises(InputFileError, match="cannot parse"):
        bind(resolve_target(f"module:{path}"))


def test_installed_without_vllm() -> None:
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vllm is installed here")
    with pytest.raises(InputFileError, match="no vllm package is installed"):
        resolve_target("vllm:installed")


def test_checkout_layouts(tmp_path: Path) -> None:
    """A checkout root, the package folder itself and a site-packages folder all resolve."""
    package = tmp_path / "site-packages" / "vllm"
    (package / Path(SCHEDULER)).parent.mkdir(parents=True)
    (package / SCHEDULER).write_text(STALE_PENDING_SCAN)
    (package / "_version.py").write_text("__version__ = version = '9.9.9'\n")
    for root in (tmp_path / "site-packages", package):
        target = resolve_target(f"vllm:{root}")
        assert target.package_dir == package
        assert target.version == "9.9.9"
        assert target.files == (package / SCHEDULER,)


def test_release_tree_resolves() -> None:
    root = release_tree("0.29.0")
    target = resolve_target(f"vllm:{root}")
    assert target.version == "0.29.0"
    assert target.package_dir is not None
    assert (target.package_dir / MANAGER) in target.files


def test_installed_package_is_located_not_imported(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("a real vllm is installed here")
    package = tmp_path / "vllm"
    (package / Path(SCHEDULER)).parent.mkdir(parents=True)
    (package / SCHEDULER).write_text(
        "class OffloadingConnectorScheduler:\n" + textwrap.indent(STALE_PENDING_SCAN, "    "))
    (package / "__init__.py").write_text("raise RuntimeError('vllm must not be imported')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    target = resolve_target("vllm:installed")
    assert target.package_dir == package
    assert bind(target).roles["sw_scan"].status == "found"


def test_wheel_cache_unpacks_only_audited_files(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels" / "9.9.9"
    wheels.mkdir(parents=True)
    with zipfile.ZipFile(wheels / "vllm-9.9.9-py3-none-any.whl", "w") as archive:
        archive.writestr(f"vllm/{SCHEDULER}", STALE_PENDING_SCAN)
        archive.writestr("vllm/_version.py", "__version__ = version = '9.9.9'\n")
        archive.writestr("vllm/model_executor/huge.py", "x = 1\n")
    root = fetch_release("9.9.9", tmp_path)
    assert sorted(p.relative_to(root).as_posix() for p in root.rglob("*.py")) == sorted(
        [f"vllm/{SCHEDULER}", "vllm/_version.py"])
    assert resolve_target(f"vllm:{root}").version == "9.9.9"
    assert fetch_release("9.9.9", tmp_path) == root  # reused, not unpacked again


def test_unreachable_registry_is_a_fetch_error(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    def failing(*args: object, **kwargs: object) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(["pip"], 1, "", "ERROR: network is unreachable")

    monkeypatch.setattr(subprocess, "run", failing)
    with pytest.raises(FetchError, match="network is unreachable"):
        fetch_release("9.8.7", tmp_path)
