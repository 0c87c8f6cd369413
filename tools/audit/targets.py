"""Resolve an audit ``--target`` string to the files (or built-in bundle) it names.

Accepted forms:

* ``vllm:PATH`` - a vLLM source checkout (``PATH/vllm/...``), an unpacked wheel (the
  same layout), a site-packages folder, or the ``vllm`` package folder itself;
* ``vllm:installed`` - the installed ``vllm`` package, located with
  :func:`importlib.util.find_spec` (which reads the import path, never runs vLLM);
* ``module:FILE.py`` - one (patched) file that defines the functions under their
  upstream names;
* ``builtin:NAME`` or a plain registered name - the reference or a historic variant.

A patch (``module:FILE.py``) and a partial tree (a ``vllm:PATH`` lacking some of
:data:`KNOWN_FILES`) are audited laid over a *base release* (``resolve_target(spec,
base=...)``, the audit's ``--base``): every function the patch does not define, every
file the partial tree lacks, is bound from the base's own files, so the release's code is
what runs there. ``base`` is ``vllm:PATH``, ``vllm:installed``, a release version
(``0.33.0``: :func:`~kvcontract.tools.audit.wheels.fetch_release`), ``none`` (the patch
alone, as before) or :data:`AUTO` (the installed vLLM when one is importable, else the
newest release, ``kvcontract.releases.NEWEST_RELEASE``, fetched, else none, with a note
saying so). The resolved
base is part of the target's ``spec`` (``module:FILE.py@base=vllm:ROOT``), so a report's
target binds again to the same code (reproducers, ``explain``, ``merge``).

Nothing here imports vLLM: a target is only ever read as text.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import re
from dataclasses import dataclass, field
from pathlib import Path

from kvcontract.errors import InputFileError, UnknownTargetError
from kvcontract.impl.variants import VARIANTS
from kvcontract.tools.audit.audited_files import KNOWN_FILES

TARGET_FORMS = ["vllm:PATH", "vllm:installed", "module:FILE.py", "builtin:NAME"]

BASE_FORMS = ["vllm:PATH", "vllm:installed", "VERSION", "none"]
AUTO = "auto"
"""``base=AUTO``: the installed vLLM, else the newest release fetched, else none."""
BASE_MARK = "@base="
"""Separates a target from the base it is laid over in a target's ``spec``."""


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
    base: Target | None = None
    """The release the target is laid over (a patch or a partial tree), kind ``vllm``."""

    def display(self) -> str:
        if self.kind == "builtin":
            return f"builtin:{self.builtin}"
        if self.kind == "module":
            own = f"module:{self.files[0]}"
        else:
            own = f"vllm {self.version or '(version unknown)'} at {self.package_dir}"
        if self.base is not None:
            return f"{own} over base {self.base.display()}"
        return own


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


def needs_base(target: Target) -> bool:
    """A patch, or a tree that lacks some of the audited files."""
    if target.kind == "module":
        return True
    return target.kind == "vllm" and len(target.files) < len(KNOWN_FILES)


def resolve_base(spec: str) -> Target | None:
    """The base release ``spec`` names (:data:`BASE_FORMS`, or :data:`AUTO`); None for
    ``none``, or for :data:`AUTO` when no release can be found."""
    return _base_and_notes(spec)[0]


def _base_and_notes(spec: str) -> tuple[Target | None, list[str]]:
    """:func:`resolve_base`, and why there is none where :data:`AUTO` found none."""
    text = spec.strip()
    if text in ("", "none"):
        return None, []
    if text == AUTO:
        return _auto_base()
    if text.startswith("vllm:"):
        base = _resolve_vllm(text, text[len("vllm:"):])
    elif re.fullmatch(r"v?\d+\.\d+\.\d+\S*", text):
        from kvcontract.tools.audit.wheels import FetchError, fetch_release

        try:
            root = fetch_release(text.lstrip("v"))
        except FetchError as exc:
            raise InputFileError(f"--base {text}", str(exc)) from None
        base = _resolve_vllm(f"vllm:{root}", str(root))
    else:
        raise UnknownTargetError(spec, BASE_FORMS)
    if len(base.files) < len(KNOWN_FILES):
        raise InputFileError(base.spec, "a base release must hold every audited file; "
                                        "missing vllm/" + ", vllm/".join(
                                            rel for rel in KNOWN_FILES
                                            if base.package_dir is None
                                            or not (base.package_dir / rel).is_file()))
    return base, []


def _auto_base() -> tuple[Target | None, list[str]]:
    """The installed vLLM (located, never imported), else the newest release fetched;
    with the note saying why there is none."""
    found = importlib.util.find_spec("vllm")
    if found is not None and found.submodule_search_locations:
        try:
            base = _resolve_vllm("vllm:installed", "installed")
            if len(base.files) == len(KNOWN_FILES):
                return base, []
        except InputFileError:
            pass
    from kvcontract.releases import NEWEST_RELEASE as newest
    from kvcontract.tools.audit.wheels import FetchError, fetch_release

    try:
        root = fetch_release(newest)
    except FetchError as exc:
        return None, [f"no base release: vLLM is not installed and {newest} could not be "
                      f"fetched ({exc}); every function the target does not define is left "
                      "unbound"]
    return _resolve_vllm(f"vllm:{root}", str(root)), []


def _with_base(target: Target, base: Target | None, notes: list[str]) -> Target:
    if base is None:
        target.notes.extend(notes)
        return target
    assert base.package_dir is not None
    root = base.package_dir.parent if base.package_dir.name == "vllm" else base.package_dir
    spec = f"{target.spec}{BASE_MARK}vllm:{root}"
    return dataclasses.replace(target, spec=spec, base=base, notes=[
        *target.notes, f"laid over base {base.display()}: every function "
                       + ("the patch" if target.kind == "module" else "of a file the tree")
                       + " does not define is the base release's own code"])


def resolve_target(spec: str, base: str | None = None) -> Target:
    """Parse and validate a target string; a clear one-line error if it names nothing.

    A patch or a partial tree is laid over ``base`` (:func:`resolve_base`), or over the
    base its spec names (``...@base=vllm:ROOT``); ``base=None`` and no such mark: alone."""
    text = spec.strip()
    own, mark, named = text.partition(BASE_MARK)
    if mark:
        text = own
        if base is None or base == AUTO:
            base = named
    target = _resolve_one(spec, text)
    if base is None or not needs_base(target):
        return target
    return _with_base(target, *_base_and_notes(base))


def _resolve_one(spec: str, text: str) -> Target:
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
