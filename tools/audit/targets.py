"""Resolve an audit ``--target`` string to the files (or built-in bundle) it names.

Accepted forms:

* ``vllm:PATH`` - a vLLM source checkout (``PATH/vllm/...``), an unpacked wheel (the
  same layout), a site-packages folder, or the ``vllm`` package folder itself;
* ``vllm:installed`` - the installed ``vllm`` package, located with
  :func:`importlib.util.find_spec` (which reads the import path, never runs vLLM);
* ``module:FILE.py`` - one (patched) file that defines the functions under their
  upstream names;
* ``builtin:NAME`` or a plain registered name - the reference or a historic variant.

Nothing here imports vLLM: a target is only ever read as text.
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass, field
from pathlib import Path

from kvcontract.errors import InputFileError, UnknownTargetError
from kvcontract.impl.variants import VARIANTS

SCHEDULER = "distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py"
OFFLOAD_CONFIG = "distributed/kv_transfer/kv_connector/v1/offloading/config.py"
MANAGER = "v1/core/single_type_kv_cache_manager.py"
"""Files (relative to the ``vllm`` package folder) that hold the audited functions in
0.28.0 to 0.33.0; see :mod:`.binding` for which function lives where in which release."""

KNOWN_FILES = (SCHEDULER, OFFLOAD_CONFIG, MANAGER)

TARGET_FORMS = ["vllm:PATH", "vllm:installed", "module:FILE.py", "builtin:NAME"]


@dataclass(frozen=True)
class Target:
    """A resolved audit target."""

    spec: str
    """The string the user gave."""
    kind: str
    """``vllm`` (a package tree), ``module`` (one file) or ``builtin``."""
    name: str
    """Short display name: the version for a vLLM tree, the file name, the variant."""
    package_dir: Path | None = None
    """The ``vllm`` package folder (kind ``vllm``)."""
    files: tuple[Path, ...] = ()
    """The source files to search, in search order."""
    version: str | None = None
    builtin: str | None = None
    notes: list[str] = field(default_factory=list)

    def display(self) -> str:
        if self.kind == "builtin":
            return f"builtin:{self.builtin}"
        if self.kind == "module":
            return f"module:{self.files[0]}"
        return f"vllm {self.version or '(version unknown)'} at {self.package_dir}"


def _version_of(package_dir: Path) -> str | None:
    """The release, from ``_version.py`` or a sibling ``*.dist-info`` (no import)."""
    version_file = package_dir / "_version.py"
    if version_file.is_file():
        match = re.search(r"""__version__\s*=\s*version\s*=\s*['"]([^'"]+)""",
                          version_file.read_text(errors="replace"))
        if match is None:
            match = re.search(r"""__version__\s*=\s*['"]([^'"]+)""",
                              version_file.read_text(errors="replace"))
        if match:
            return match.group(1)
    for info in sorted(package_dir.parent.glob("vllm-*.dist-info")):
        return info.name[len("vllm-"): -len(".dist-info")]
    parent = package_dir.parent.name
    match = re.fullmatch(r"v?(\d+\.\d+\.\d+\S*)", parent)
    return match.group(1) if match else None


def _package_dir(root: Path) -> Path | None:
    """The ``vllm`` package folder under ``root`` (a checkout, wheel or the package)."""
    for candidate in (root / "vllm", root):
        if any((candidate / rel).is_file() for rel in KNOWN_FILES):
            return candidate
    return None


def _resolve_vllm(spec: str, where: str) -> Target:
    if where == "installed":
        found = importlib.util.find_spec("vllm")
        if found is None or not found.submodule_search_locations:
            raise InputFileError("vllm:installed", "no vllm package is installed in this Python")
        root = Path(next(iter(found.submodule_search_locations)))
    else:
        root = Path(where).expanduser()
        if not root.exists():
            raise InputFileError(where, "no such file or directory")
        if not root.is_dir():
            raise InputFileError(where, "vllm:PATH must be a folder (a checkout, an unpacked "
                                        "wheel or the vllm package); use module:FILE.py for a file")
    package = _package_dir(root)
    if package is None:
        raise InputFileError(
            str(root),
            "no vLLM offloading sources found (looked for vllm/"
            + ", vllm/".join(KNOWN_FILES) + ")",
        )
    files = tuple(package / rel for rel in KNOWN_FILES if (package / rel).is_file())
    version = _version_of(package)
    return Target(spec=spec, kind="vllm", name=version or package.parent.name,
                  package_dir=package, files=files, version=version)


def resolve_target(spec: str) -> Target:
    """Parse and validate a target string; a clear one-line error if it names nothing."""
    text = spec.strip()
    if not text:
        raise UnknownTargetError(spec, [*TARGET_FORMS, *VARIANTS])
    kind, sep, rest = text.partition(":")
    if sep and kind == "vllm":
        if not rest:
            raise UnknownTargetError(spec, TARGET_FORMS)
        return _resolve_vllm(text, rest)
    if sep and kind == "module":
        path = Path(rest).expanduser()
        if path.is_dir():
            raise InputFileError(rest, "a folder; module:FILE.py names one Python file "
                                       "(use vllm:PATH for a checkout or a wheel)")
        if not path.is_file():
            raise InputFileError(rest, "no such file")
        if path.suffix != ".py":
            raise InputFileError(rest, "module:FILE must name a Python source file (.py)")
        return Target(spec=text, kind="module", name=path.name, files=(path,))
    if sep and kind == "builtin":
        if rest not in VARIANTS:
            raise UnknownTargetError(rest, sorted(VARIANTS))
        return Target(spec=text, kind="builtin", name=rest, builtin=rest)
    if not sep and text in VARIANTS:
        return Target(spec=text, kind="builtin", name=text, builtin=text)
    raise UnknownTargetError(spec, [*TARGET_FORMS, *VARIANTS])
