"""Which vLLM ``import vllm`` runs: the installed wheel, or a target laid over it.

The audit judges a target (``vllm:installed``, an unpacked release or wheel, a checkout
of vLLM's main, a partial tree, a patch over a base) by running it. A target that is
not the installed package is made importable by a *composed root*: a folder whose
``vllm/`` package mirrors the installed one file by file (symbolic links) with the
target's own files laid over it, put first on ``sys.path`` in the process that judges.
So a release's or a checkout's Python runs on the installed wheel's compiled parts and
generated files (``_version.py``, kernels it never calls here), as "a checkout laid over
an installed wheel of the nearest release" would.

* A *complete* tree (it has the package's ``__init__.py`` and at least half the installed
  package's modules: an unpacked wheel, a checkout) keeps only the installed package's
  compiled and generated files, and whole folders the tree lacks (built at install
  time); a module the tree removed stays removed.
* A *partial* tree (say the audited files alone) keeps every installed file it does not
  replace: the judge then runs the target's files within the installed release, and
  :attr:`VllmRoot.description` says so.

Composed roots are cached (:func:`cache_dir`), keyed by the installed package and by every target
file's path, size and modification time, so a second audit of the same tree reuses the
folder and the bytecode Python compiled there (a cold import of vLLM takes about 20 s,
a warm one about 6 s).

Nothing here imports vLLM; :func:`activate` only edits ``sys.path`` and refuses when
another ``vllm`` is already imported in the process.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import re
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

COMPILED_SUFFIXES = (".so", ".pyd", ".dylib")
GENERATED_FILES = ("_version.py",)
"""Files of the installed package a checkout lacks because the build writes them."""
SKIPPED_NAMES = ("__pycache__",)


class RootError(RuntimeError):
    """A root cannot be composed or activated (the message names what and why)."""


class RootConflict(RootError):
    """Another vLLM is already imported in this process: the root needs a fresh one."""


@dataclass(frozen=True)
class VllmRoot:
    """Where ``import vllm`` finds the code the judge runs, and what that code is."""

    path: Path | None
    """The folder to put first on ``sys.path`` (its ``vllm/`` is the package); None: the
    installed package as it is."""
    package: Path
    """The ``vllm`` package folder imports will resolve to (the target's, or the
    installed one)."""
    description: str
    """One line: ``vLLM 0.34.0 (installed)``, ``vLLM 0.33.0 at PATH (2,911 files) laid
    over the installed vLLM 0.34.0``."""
    version: str | None
    """The target's release (its ``_version.py``), None for a checkout without one."""
    installed_version: str | None
    laid_files: int = 0
    """Files of the target laid over the installed package (0: the installed one)."""
    complete: bool = True
    """Whether the target is a whole package (else only its files replace the
    installed release's)."""

    @property
    def is_installed(self) -> bool:
        return self.path is None

    def to_json(self) -> dict[str, object]:
        return {"path": str(self.path) if self.path else None, "package": str(self.package),
                "description": self.description, "version": self.version,
                "installed_version": self.installed_version, "laid_files": self.laid_files,
                "complete": self.complete}


def installed_package() -> Path | None:
    """The installed ``vllm`` package folder (located by the import system's path
    finder, never imported; a composed root this process put on ``sys.path`` is not the
    installed one), None when there is none."""
    import importlib.machinery

    entries = [entry for entry in sys.path if entry not in _ACTIVATED]
    try:
        found = importlib.machinery.PathFinder.find_spec("vllm", entries)
    except (ImportError, ValueError):
        return None
    if found is None or not found.submodule_search_locations:
        return None
    return Path(next(iter(found.submodule_search_locations))).resolve()


def version_of(package: Path) -> str | None:
    """A vLLM package folder's release, from its ``_version.py`` or a sibling
    ``vllm-X.dist-info`` (read as text)."""
    version_file = package / "_version.py"
    if version_file.is_file():
        text = version_file.read_text(errors="replace")
        for pattern in (r"""__version__\s*=\s*version\s*=\s*['"]([^'"]+)""",
                        r"""__version__\s*=\s*['"]([^'"]+)"""):
            match = re.search(pattern, text)
            if match:
                return match.group(1)
    for info in sorted(package.parent.glob("vllm-*.dist-info")):
        return info.name[len("vllm-"):-len(".dist-info")]
    return None


def cache_dir() -> Path:
    """Where composed roots are kept: ``$KVCONTRACT_ROOTS_DIR``, else
    ``$XDG_CACHE_HOME/kvcontract/roots``, else ``~/.cache/kvcontract/roots``."""
    configured = os.environ.get("KVCONTRACT_ROOTS_DIR")
    if configured:
        return Path(configured).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "kvcontract" / "roots"


def installed_root() -> VllmRoot:
    """The installed vLLM as it is; :class:`RootError` when none is installed."""
    package = installed_package()
    if package is None:
        raise RootError("no vllm package is installed in this Python (the live set-up: "
                        ".ci/install-live, or the README's live recipe)")
    version = version_of(package)
    return VllmRoot(None, package, f"vLLM {version or '(version unknown)'} (installed)",
                    version, version)


def _files(tree: Path) -> list[Path]:
    found = []
    for folder, dirs, files in os.walk(tree):
        dirs[:] = sorted(d for d in dirs if d not in SKIPPED_NAMES)
        for name in sorted(files):
            if name.endswith(".pyc"):
                continue
            found.append(Path(folder, name).relative_to(tree))
    return found


def _is_complete(tree_files: set[Path], base_files: list[Path]) -> bool:
    modules = [f for f in base_files if f.suffix == ".py"]
    own = [f for f in tree_files if f.suffix == ".py"]
    return Path("__init__.py") in tree_files and len(own) * 2 >= len(modules)


def compose(tree: Path, base: Path | None = None, cache: Path | None = None) -> VllmRoot:
    """The root that imports ``tree`` (a ``vllm`` package folder) laid over ``base``
    (the installed package by default). ``tree`` that is ``base`` itself gives the
    installed root."""
    base = (base or installed_package())
    if base is None:
        raise RootError(f"{tree} can only be run laid over an installed vLLM, and none is "
                        "installed (the live set-up: .ci/install-live)")
    tree, base = tree.resolve(), base.resolve()
    installed_version = version_of(base)
    if tree == base:
        return VllmRoot(None, base, f"vLLM {installed_version or '(version unknown)'} "
                                    "(installed)", installed_version, installed_version)
    if not tree.is_dir():
        raise RootError(f"{tree} is not a folder")
    tree_files = _files(tree)
    base_files = _files(base)
    own = set(tree_files)
    complete = _is_complete(own, base_files)
    digest = hashlib.sha256()
    digest.update(f"{base}\0{installed_version}\0{tree}\0{complete}\n".encode())
    for rel in tree_files:
        stat = (tree / rel).stat()
        digest.update(f"{rel}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    folder = (cache or cache_dir()) / digest.hexdigest()[:24]
    if not (folder / "vllm" / "__init__.py").exists():
        _build(folder, tree, tree_files, base, base_files, complete)
    version = version_of(tree)
    own_release = f"vLLM {version}" if version else "a vLLM checkout (no _version.py)"
    how = ("laid over" if complete else "replacing their counterparts in")
    description = (f"{own_release} at {tree} ({len(tree_files):,} files) {how} the "
                   f"installed vLLM {installed_version or '(version unknown)'}")
    return VllmRoot(folder, folder / "vllm", description, version, installed_version,
                    len(tree_files), complete)


def _kept_from_base(rel: Path, own: set[Path], own_dirs: set[Path], complete: bool) -> bool:
    if rel in own:
        return False
    if not complete:
        return True
    if rel.suffix in COMPILED_SUFFIXES or rel.name in GENERATED_FILES:
        return True
    # A folder the tree lacks entirely is built at install time (kernels, vendored
    # packages): kept. A module removed from a folder the tree has stays removed.
    return rel.parent not in own_dirs


def _build(folder: Path, tree: Path, tree_files: list[Path], base: Path,
           base_files: list[Path], complete: bool) -> None:
    folder.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="compose-", dir=folder.parent))
    try:
        package = scratch / "vllm"
        own = set(tree_files)
        own_dirs = {Path(".")} | {p for f in tree_files for p in f.parents}
        for rel in base_files:
            if _kept_from_base(rel, own, own_dirs, complete):
                _link(base / rel, package / rel)
        for rel in tree_files:
            _link(tree / rel, package / rel)
        if folder.exists():
            shutil.rmtree(folder, ignore_errors=True)
        os.replace(scratch, folder)
    except OSError as exc:
        shutil.rmtree(scratch, ignore_errors=True)
        raise RootError(f"cannot compose a vLLM root in {folder}: {exc}") from None


def _link(source: Path, destination: Path) -> None:
    destination.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(source, destination)


def activate(root: VllmRoot) -> None:
    """Make ``import vllm`` in this process resolve to ``root``: its folder first on
    ``sys.path``. Refused (:class:`RootError`) when a ``vllm`` from elsewhere is
    already imported: a process runs one vLLM."""
    loaded = sys.modules.get("vllm")
    if loaded is not None:
        # The path the import system found it by (a composed root's files are links:
        # resolving them would name the target's tree, not the root).
        where = Path(os.path.abspath(getattr(loaded, "__file__", "") or ".")).parent
        if where not in (Path(os.path.abspath(root.package)), root.package.resolve()):
            raise RootConflict(f"vLLM is already imported in this process from {where}; "
                            f"{root.description} (at {root.package}) needs a process of "
                            "its own")
        return
    if root.path is not None:
        entry = str(root.path)
        if entry in sys.path:
            sys.path.remove(entry)
        sys.path.insert(0, entry)
        _ACTIVATED.add(entry)
        importlib.invalidate_caches()


_ACTIVATED: set[str] = set()
"""The ``sys.path`` entries :func:`activate` put there: composed roots, never the
installed package (:func:`installed_package` looks past them)."""


def active_package() -> Path | None:
    """The folder of the ``vllm`` imported in this process (None: not imported)."""
    loaded = sys.modules.get("vllm")
    if loaded is None or not getattr(loaded, "__file__", None):
        return None
    return Path(str(loaded.__file__)).resolve().parent
