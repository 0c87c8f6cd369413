"""The proof cache: a theorem's result, stored under a key of everything it depends on.

Re-proving an unchanged implementation should cost the time to read a few files, not
the solver's (issue 11). A result is reused only when its key matches exactly; the key
of one theorem hashes

* the theorem's id, and for a member of an exhaustive family the ids of the members
  checked with it and the number of family shards (both appear in its details);
* the kvcontract version, the Z3 version and the Python version;
* the whole source of ``spec/`` (presets included) and ``proofs/`` (the statements,
  the domains, the solver's budgets and the prover itself), ``impl/bundle.py``,
  ``kvcontract/vocabulary.py`` and ``kvcontract/errors.py`` (``proofs/sources.py``, the
  call graph that decides what else enters the key, is among the prover's sources);
* the scope (``--model``/``--geometry``: every geometry's labels and values);
* of the implementation: which function each bundle field is, and the source of every
  function the theorem exercises (:class:`~kvcontract.proofs.sources.CallGraph`
  from the property's ``uses``; a case family reaches the whole scheduler module), plus
  the module-level code (constants, imports, class bodies without their methods) of
  every module those functions live in; for ``module:FILE.py`` the whole file as well.

Anything the key cannot account for (a bundle function defined outside the snapshot
modules, a lambda, a ``functools.partial``) leaves that theorem without a key: it is
proved, never looked up. So changing one function's source re-proves exactly the
theorems that reach it, and changing the spec or the prover re-proves everything.

Only deterministic verdicts are stored (PROVED, PROVED-FOR-DOMAIN, COUNTEREXAMPLE,
VACUOUS; the solver is rlimit-bound, so these do not depend on load); UNKNOWN is not.
Entries live in the user's cache folder (:func:`cache_dir`), one JSON file per key,
written atomically (a temporary file renamed over the entry); an unreadable, corrupt
or mismatching entry is a miss, and a cache that cannot be written is skipped: the
cache never changes a verdict and never fails a run.
"""

from __future__ import annotations

import ast
import contextlib
import copy
import hashlib
import json
import os
import sys
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvcontract.proofs.verdicts import TheoremResult, Verdict
from kvcontract.spec.geometry import Geometry

CACHE_ENV = "KVCONTRACT_CACHE_DIR"
"""Environment variable naming the cache folder (wins over ``$XDG_CACHE_HOME``)."""

ENTRY_FORMAT = 1
"""Version of an entry file's shape; an entry of another format is a miss."""

CACHED_VERDICTS = frozenset(
    {Verdict.PROVED, Verdict.PROVED_FOR_DOMAIN, Verdict.COUNTEREXAMPLE, Verdict.VACUOUS})
"""The verdicts a rerun reproduces exactly (rlimit budgets, no wall-clock limits)."""

Scope = tuple[tuple[str, Geometry], ...]


def cache_dir() -> Path:
    """``$KVCONTRACT_CACHE_DIR``, else ``$XDG_CACHE_HOME/kvcontract/proofs``, else
    ``~/.cache/kvcontract/proofs``: never the user's checkout."""
    explicit = os.environ.get(CACHE_ENV, "").strip()
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME", "").strip()
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "kvcontract" / "proofs"


@dataclass(frozen=True)
class ProofCache:
    """One cache folder: entries by key (hex digests from :func:`theorem_keys`)."""

    root: Path

    def _path(self, key: str) -> Path:
        # Two-character fan-out keeps folders small for a long-lived cache.
        return self.root / key[:2] / f"{key}.json"

    def get(self, key: str, count: int) -> list[TheoremResult] | None:
        """The ``count`` results stored under ``key``, or None (a miss: absent,
        unreadable, corrupt, another format or another key)."""
        try:
            data = json.loads(self._path(key).read_text(encoding="utf-8"))
            if (not isinstance(data, dict) or data.get("format") != ENTRY_FORMAT
                    or data.get("key") != key):
                return None
            rows = data.get("results")
            if not isinstance(rows, list) or len(rows) != count:
                return None
            results = [TheoremResult.from_json(row) for row in rows]
        except (OSError, UnicodeDecodeError, ValueError, TypeError, KeyError,
                AttributeError, RecursionError):
            return None
        if any(r.verdict not in CACHED_VERDICTS for r in results):
            return None
        return results

    def put(self, key: str, results: Sequence[TheoremResult]) -> bool:
        """Store ``results`` under ``key`` (only when every verdict is deterministic);
        True when written. A folder that cannot be written is not an error."""
        if not results or any(r.verdict not in CACHED_VERDICTS for r in results):
            return False
        text = json.dumps({"format": ENTRY_FORMAT, "key": key,
                           "results": [r.to_json() for r in results]}, sort_keys=True)
        path = self._path(key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            # Atomic: a reader (another shard, a parallel CI job) sees the old entry or
            # the new one, never half a file.
            handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=".", suffix=".tmp")
            try:
                with os.fdopen(handle, "w", encoding="utf-8") as stream:
                    stream.write(text)
                os.replace(temporary, path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(temporary)
                raise
        except OSError:
            return False
        return True


# -- the key ---------------------------------------------------------------------------
def _digest(*parts: str) -> str:
    hasher = hashlib.sha256()
    for part in parts:
        data = part.encode("utf-8", "surrogatepass")
        hasher.update(len(data).to_bytes(8, "big"))
        hasher.update(data)
    return hasher.hexdigest()


def _package_root() -> Path:
    import kvcontract.spec

    # The distribution maps each top-level folder to a subpackage (pyproject.toml).
    return Path(kvcontract.spec.__file__).resolve().parents[1]


def _tree_files() -> list[Path]:
    import kvcontract.errors
    import kvcontract.impl
    import kvcontract.proofs
    import kvcontract.spec

    files: list[Path] = []
    for package in (kvcontract.spec, kvcontract.proofs):
        folder = Path(str(package.__file__)).resolve().parent
        files.extend(p for p in folder.rglob("*") if p.suffix in (".py", ".json")
                     and p.is_file() and "__pycache__" not in p.parts)
    impl = Path(str(kvcontract.impl.__file__)).resolve().parent
    core = Path(str(kvcontract.errors.__file__)).resolve().parent
    # The call graph the keys are read from is proofs/sources.py (above).
    files += [impl / "bundle.py", core / "vocabulary.py", core / "errors.py"]
    return sorted(set(files))


def base_key() -> str:
    """The part of every key that does not depend on the theorem or the implementation:
    versions and the sources of the spec, the prover and what they import."""
    import importlib.metadata

    import z3

    try:
        version = importlib.metadata.version("kvcontract")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    root = _package_root()
    parts = [f"kvcontract {version}", f"z3 {z3.get_full_version()}",
             f"python {sys.version_info.major}.{sys.version_info.minor}"]
    for path in _tree_files():
        try:
            name = str(path.relative_to(root))
        except ValueError:
            name = str(path)
        parts += [name, path.read_text(encoding="utf-8")]
    return _digest(*parts)


def scope_key(scope: Scope) -> str:
    """The geometries of a scoped run, labels and values (empty: the catalogue)."""
    return json.dumps([[label, geometry.to_dict()] for label, geometry in scope],
                      sort_keys=True, default=str)


class _Sources:
    """What an implementation's functions are, read statically (one per run)."""

    def __init__(self, impl_name: str) -> None:
        from kvcontract.proofs.sources import (
            REFERENCE_MODULE,
            SCHEDULER_MODULE,
            CallGraph,
            functions,
            resolve_sources,
            snapshot,
        )

        target = resolve_sources(impl_name)
        modules = list(target.modules)
        names = {m.name for m in modules}
        for extra in (REFERENCE_MODULE, SCHEDULER_MODULE):
            if extra not in names:  # a module: file stands for one; the other is read too
                modules.append(snapshot(extra))
        self.fields = dict(target.field_functions)
        self.graph = CallGraph(modules, self.fields)
        self.scheduler = SCHEDULER_MODULE
        self.functions: dict[tuple[str, str], str] = {}
        self.skeletons: dict[str, str] = {}
        self.whole_file = ""
        for m in modules:
            tree = _overlaid(m.source, m.base_source)
            for qualname, node in functions(tree):
                self.functions[(m.name, qualname)] = ast.unparse(node)
            self.skeletons[m.name] = _skeleton(tree)
            if m.base_source is not None:  # module:FILE.py: the file is in every key
                self.whole_file += _digest(m.path, m.source)

    def key(self, uses: Iterable[str], family: bool) -> str | None:
        roots: set[tuple[str, str]] = set()
        for use in uses:
            node = self.fields.get(use)
            if node is None or node not in self.functions:
                return None  # a function outside the snapshot: no key, no reuse
            roots.add(node)
        if family:
            # The property layer drives the scheduler's loops (lookup, store path) on
            # every case: its whole module is part of what a family exercises.
            roots |= {n for n in self.functions if n[0] == self.scheduler}
        reached = self.graph.closure(roots)
        if any(node not in self.functions for node in reached):
            return None
        modules = sorted({module for module, _ in reached})
        parts = [self.whole_file,
                 json.dumps(sorted(self.fields.items()), default=str)]
        parts += [f"module {m}\n{self.skeletons[m]}" for m in modules]
        parts += [f"{m}:{q}\n{self.functions[(m, q)]}" for m, q in sorted(reached)]
        return _digest(*parts)


def _overlaid(source: str, base_source: str | None) -> ast.Module:
    """The module's tree; for an overlay (``module:FILE.py``), the base's definitions
    the file does not replace followed by the file's (as
    :class:`~kvcontract.proofs.sources.CallGraph` reads it)."""
    tree = ast.parse(source)
    if base_source is None:
        return tree
    base = ast.parse(base_source)
    own = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    tree.body = [n for n in base.body
                 if not (isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name in own)
                 ] + tree.body
    return tree


def _skeleton(tree: ast.Module) -> str:
    """The module without its functions' and methods' definitions: imports, constants,
    class bodies (a changed constant reaches every function of the module)."""
    def strip(body: list[ast.stmt]) -> list[ast.stmt]:
        kept: list[ast.stmt] = []
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            if isinstance(node, ast.ClassDef):
                shell = copy.copy(node)
                shell.body = strip(node.body) or [ast.Pass()]
                kept.append(shell)
                continue
            kept.append(node)
        return kept

    return ast.unparse(ast.fix_missing_locations(ast.Module(body=strip(tree.body),
                                                            type_ignores=[])))


def theorem_keys(impl_name: str, theorems: Sequence[Any], groups: Sequence[Sequence[int]],
                 scope: Scope, family_shards: int) -> dict[int, str | None]:
    """The key of each theorem index in ``groups`` (each group: the indices run as one
    task, a family's members together); None where the theorem cannot be keyed."""
    from kvcontract.spec.properties import CaseProperty

    try:
        sources: _Sources | None = _Sources(impl_name)
        common = _digest(base_key(), scope_key(scope))
    except Exception:  # an implementation the static reading cannot follow: no reuse
        sources, common = None, ""
    keys: dict[int, str | None] = {}
    for group in groups:
        members = [theorems[i] for i in group]
        together = json.dumps([m.theorem_id for m in members])
        for index, theorem in zip(group, members, strict=True):
            family = isinstance(theorem, CaseProperty)
            own = sources.key(theorem.uses, family) if sources is not None else None
            keys[index] = None if own is None else _digest(
                common, theorem.theorem_id, together,
                str(family_shards if family else 1), own)
    return keys


def group_key(keys: Mapping[int, str | None], group: Sequence[int]) -> str | None:
    """The entry key of a task (one theorem, or a family stored as one entry)."""
    parts = [keys.get(i) for i in group]
    if any(p is None for p in parts):
        return None
    return parts[0] if len(parts) == 1 else _digest(*(str(p) for p in parts))
