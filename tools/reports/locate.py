"""Where a finding points: the implementation function that differs from the reference
(:func:`locate`), a function's definition, or the clause's catalogue entry (the
fallback every renderer can use)."""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from kvcontract.proofs.uses import LOOKUP_FUNCTIONS, THEOREM_FUNCTIONS

_FUNCTIONS_OF_THEOREM: dict[str, tuple[str, ...]] = THEOREM_FUNCTIONS
"""Implementation functions each theorem exercises, most specific first
(:mod:`kvcontract.proofs.uses`); unknown theorems fall back to the lookup's."""

_LOOKUP_FUNCTIONS: tuple[str, ...] = LOOKUP_FUNCTIONS


def _project_root() -> Path:
    import kvcontract.errors

    return Path(kvcontract.errors.__file__).resolve().parents[1]


def display_path(path: str | Path) -> str:
    """A path as reports show it: relative to the working directory (or the project),
    POSIX separators, so SARIF uploads and editor links resolve inside a checkout."""
    resolved = Path(path).resolve()
    for base in (Path.cwd().resolve(), _project_root()):
        try:
            return resolved.relative_to(base).as_posix()
        except ValueError:
            continue
    return resolved.as_posix()


def function_location(fn: Callable[..., Any]) -> dict[str, Any] | None:
    """``{"path", "line"}`` of a Python function's definition, or None if unknown."""
    try:
        target = inspect.unwrap(fn)
        source = inspect.getsourcefile(target)
        _, line = inspect.getsourcelines(target)
    except (OSError, TypeError):
        return None
    if source is None:
        return None
    return {"path": display_path(source), "line": max(1, line)}


def locate(target: str, theorem_id: str) -> dict[str, Any] | None:
    """Where a finding about ``theorem_id`` for implementation ``target`` points.

    The function of the implementation that the theorem exercises and that differs from
    the reference (the defect's home); for the reference itself, the first function the
    theorem exercises. None when ``target`` is not a registered implementation.
    """
    from kvcontract.impl.variants import REFERENCE, VARIANTS

    impl = VARIANTS.get(target)
    if impl is None:
        return None
    name = theorem_id.split("/", 1)[-1].split("[", 1)[0]
    if name.startswith("fuzz"):
        candidates: tuple[str, ...] = ()
    else:
        candidates = _FUNCTIONS_OF_THEOREM.get(name, _LOOKUP_FUNCTIONS)
    every = tuple(f for f in REFERENCE.__dataclass_fields__ if callable(getattr(REFERENCE, f)))
    changed = [f for f in every if getattr(impl, f) is not getattr(REFERENCE, f)]
    chosen = next((f for f in candidates if f in changed), None)
    if chosen is None and not candidates:
        chosen = changed[0] if changed else None
    if chosen is None and candidates:
        chosen = candidates[0]
    if chosen is None:
        return None
    return function_location(getattr(impl, chosen))


def clause_location(clause: str) -> dict[str, Any]:
    """The clause's entry in the catalogue (the fallback location of a finding)."""
    import kvcontract.spec.clauses as catalogue

    path = inspect.getsourcefile(catalogue) or catalogue.__file__
    line = 1
    try:
        lines, _ = inspect.getsourcelines(catalogue)
        # The entry may be written on one line or with its arguments on the next ones.
        needle = re.compile(rf'Clause\(\s*"{re.escape(clause)}"')
        source = "".join(lines)
        found = needle.search(source)
        if found is not None:
            line = source.count("\n", 0, found.start()) + 1
    except OSError:
        pass
    return {"path": display_path(path), "line": line}


def result_location(result: Mapping[str, Any]) -> dict[str, Any]:
    """A normalized result's own location, else its clause's (renderers need a line)."""
    location = result.get("location")
    if isinstance(location, Mapping):
        return dict(location)
    return clause_location(result["clause"])
