"""Fetch released vLLM wheels into a cache and unpack only the audited ``.py`` files.

For tests and benchmarks: ``pip download --no-deps --only-binary=:all: vllm==X`` (the
ordinary client, one wheel, about 300 MiB), then only the files under
:data:`MEMBERS` are extracted to ``CACHE/X/vllm/...``. The repository never holds vLLM
code; the cache lives in ``~/.cache/kvcontract/vllm`` (or ``$KVCONTRACT_VLLM_CACHE``).

A tree that is already unpacked is reused: ``CACHE/X``, ``CACHE/vX`` (either holding a
``vllm/`` folder) count, so ``KVCONTRACT_VLLM_CACHE`` may point at a research folder.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from kvcontract.tools.audit.targets import KNOWN_FILES

RELEASES = ("0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.32.0", "0.33.0")
"""The released shapes the audit is regression-tested on."""

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
    wheels.mkdir(parents=True, exist_ok=True)
    wheel = next(iter(sorted(wheels.glob("vllm-*.whl"))), None)
    if wheel is None:
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
    with tempfile.TemporaryDirectory(dir=base) as scratch:
        tree = Path(scratch) / "tree"
        try:
            with zipfile.ZipFile(wheel) as archive:
                names = set(archive.namelist())
                for member in MEMBERS:
                    if member in names:
                        archive.extract(member, tree)
        except (OSError, zipfile.BadZipFile) as exc:
            raise FetchError(f"cannot unpack {wheel}: {exc}") from None
        if not (tree / "vllm").is_dir():
            raise FetchError(f"{wheel} holds none of the audited files")
        if root.exists():  # a partial earlier attempt
            import shutil

            shutil.rmtree(root)
        tree.rename(root)
    return root
