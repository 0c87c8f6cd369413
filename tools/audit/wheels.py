"""Fetch released vLLM wheels into a cache and unpack only the audited ``.py`` files.

For tests and benchmarks: ``pip download --no-deps --only-binary=:all: vllm==X`` (the
ordinary client, one wheel, about 300 MiB), then only the files under
:data:`MEMBERS` are extracted to ``CACHE/X/vllm/...``. The repository never holds vLLM
code; the cache lives in ``~/.cache/kvcontract/vllm`` (or ``$KVCONTRACT_VLLM_CACHE``).

:func:`python_tree` unpacks a cached wheel's whole Python package (its ``.py`` and data
files, never its compiled kernels): vLLM's engine judges a release's audited files on
that release's own Python laid over the installed vLLM's compiled parts.

A tree that is already unpacked is reused: ``CACHE/X``, ``CACHE/vX`` (either holding a
``vllm/`` folder) count, so ``KVCONTRACT_VLLM_CACHE`` may point at a research folder.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

from kvcontract.tools.audit.audited_files import KNOWN_FILES

MEMBERS = (*tuple(f"vllm/{rel}" for rel in KNOWN_FILES), "vllm/_version.py")

CACHE_ENV = "KVCONTRACT_VLLM_CACHE"


class FetchError(RuntimeError):
    """The wheel could not be obtained (registry unreachable, no such release...)."""


def cache_dir() -> Path:
    configured = os.environ.get(CACHE_ENV)
    if configured:
        return Path(configured).expanduser()
    return Path.home() / ".cache" / "kvcontract" / "vllm"


def cached_tree(version: str, cache: Path | None = None) -> Path | None:
    """An already unpacked tree for ``version`` (a folder holding ``vllm/``), if any."""
    base = cache or cache_dir()
    for name in (version, f"v{version}"):
        root = base / name
        if all((root / member).is_file() for member in MEMBERS[:1]) and (root / "vllm").is_dir():
            return root
    return None


def fetch_release(version: str, cache: Path | None = None, timeout: float = 900.0) -> Path:
    """The unpacked tree of ``version`` (downloading the wheel once); raises FetchError."""
    base = cache or cache_dir()
    found = cached_tree(version, base)
    if found is not None:
        return found
    root = base / version
    wheels = base / "wheels" / version
    wheel = cached_wheel(version, base)
    if wheel is None:
        wheels.mkdir(parents=True, exist_ok=True)
        command = [sys.executable, "-m", "pip", "download", "--no-deps",
                   "--only-binary=:all:", "--disable-pip-version-check",
                   "-d", str(wheels), f"vllm=={version}"]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                                  check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise FetchError(f"pip download vllm=={version} failed: {exc}") from None
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
            raise FetchError(f"pip download vllm=={version} failed: {tail[0]}")
        wheel = next(iter(sorted(wheels.glob("vllm-*.whl"))), None)
        if wheel is None:
            raise FetchError(f"pip download vllm=={version} produced no wheel")
    members = set(MEMBERS)
    _unpack(wheel, root, members.__contains__, "none of the audited files", Path("vllm"))
    return root


def _unpack(wheel: Path, root: Path, keep: Callable[[str], bool], lacking: str,
            required: Path) -> None:
    """Extract the members ``keep`` accepts from ``wheel`` into ``root`` (replacing a
    partial earlier attempt), or FetchError saying the wheel holds ``lacking``."""
    root.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root.parent) as scratch:
        tree = Path(scratch) / "tree"
        try:
            with zipfile.ZipFile(wheel) as archive:
                for member in archive.namelist():
                    if keep(member):
                        archive.extract(member, tree)
        except (OSError, zipfile.BadZipFile) as exc:
            raise FetchError(f"cannot unpack {wheel}: {exc}") from None
        if not (tree / required).exists():
            raise FetchError(f"{wheel} holds {lacking}")
        if root.exists():
            shutil.rmtree(root)
        tree.rename(root)


PYTHON_SUFFIXES = (".py", ".pyi", ".json", ".jinja", ".typed")
"""What :func:`python_tree` unpacks: the modules and the data they read at import."""


def cached_wheel(version: str, cache: Path | None = None) -> Path | None:
    """The wheel :func:`fetch_release` downloaded for ``version``, if it is still there."""
    wheels = (cache or cache_dir()) / "wheels" / version
    return next(iter(sorted(wheels.glob("vllm-*.whl"))), None) if wheels.is_dir() else None


def python_tree(version: str, cache: Path | None = None) -> Path | None:
    """The whole Python package of release ``version`` (a folder holding ``vllm/``),
    unpacked once from its cached wheel; None when no wheel of it is cached. Raises
    FetchError when the wheel cannot be read."""
    base = cache or cache_dir()
    root = base / "python" / version
    if (root / "vllm" / "__init__.py").is_file():
        return root
    wheel = cached_wheel(version, base)
    if wheel is None:
        return None
    _unpack(wheel, root, _is_python, "no vllm package", Path("vllm/__init__.py"))
    return root


def _is_python(member: str) -> bool:
    return member.startswith("vllm/") and member.endswith(PYTHON_SUFFIXES)
