"""Project defaults from ``[tool.kvcontract]`` in ``pyproject.toml``.

The nearest ``pyproject.toml`` with a ``[tool.kvcontract]`` table, walking up from the
working directory (the convention of ruff), gives defaults to ``prove`` and ``audit``
(``fail-on`` and ``baseline-file`` also to ``merge``, which applies the findings baseline
to a sharded run); an option given on the command line always wins. Keys are the long option names::

    [tool.kvcontract]
    fail-on = "new"                            # or ["crash", "lost-hit", "new"]
    baseline-file = ".kvcontract-baseline.json"  # relative to this pyproject.toml
    budget = 250000                            # audit
    jobs = 2
    impl = "reference"                         # prove
    model = ["gpt-oss-20b"]                    # or one name
    require-complete = true                    # audit

A key a command does not have (``budget`` for ``prove``) is ignored by it; an unknown
key, a value of the wrong type or an unreadable file is an input error (exit 2)
naming the file and the key. Reading TOML needs Python 3.11's :mod:`tomllib`, or the
``tomli`` package on Python 3.10.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvcontract.errors import InputFileError, UsageError

CONFIG_FILE = "pyproject.toml"
TABLE = "tool.kvcontract"

_Check = Callable[[str, Any], Any]


def _string(key: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{key} must be a non-empty string, not {value!r}")
    return value


def _strings(key: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if (not isinstance(value, list) or not value
            or not all(isinstance(v, str) and v.strip() for v in value)):
        raise ValueError(f"{key} must be a string or a non-empty list of strings, not "
                         f"{value!r}")
    return tuple(value)


def _fail_on(key: str, value: Any) -> str:
    words = _strings(key, value)
    return ",".join(words)


def _count(low: int, high: int | None = None) -> _Check:
    def check(key: str, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{key} must be an integer, not {value!r}")
        if value < low or (high is not None and value > high):
            bound = f"at least {low}" if high is None else f"between {low} and {high}"
            raise ValueError(f"{key} must be {bound}, not {value}")
        return value
    return check


def _flag(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{key} must be true or false, not {value!r}")
    return value


def _keys() -> dict[str, tuple[str, _Check]]:
    from kvcontract.options import MAX_JOBS

    return {
        # key: (the click parameter it sets, its check)
        "fail-on": ("fail_on", _fail_on),
        "baseline-file": ("baseline_file", _string),
        "budget": ("budget", _count(1)),
        "jobs": ("jobs", _count(1, MAX_JOBS)),
        "impl": ("impl_name", _string),
        "model": ("models", _strings),
        "require-complete": ("require_complete", _flag),
    }


KEYS: tuple[str, ...] = ("fail-on", "baseline-file", "budget", "jobs", "impl", "model",
                         "require-complete")
"""The keys ``[tool.kvcontract]`` accepts."""


@dataclass(frozen=True)
class ProjectConfig:
    """The ``[tool.kvcontract]`` table found (``path`` None: none)."""

    path: Path | None = None
    values: Mapping[str, Any] = field(default_factory=dict)
    """Validated values by click parameter name (``baseline_file`` made absolute)."""


def _toml_loads(path: Path, text: str) -> dict[str, Any]:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        try:
            import tomli as tomllib
        except ImportError:
            raise InputFileError(str(path), "reading [tool.kvcontract] needs the tomli "
                                            "package on Python 3.10 (pip install tomli), "
                                            "or Python 3.11") from None
    try:
        data: dict[str, Any] = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InputFileError(str(path), f"not valid TOML: {exc}") from None
    return data


def _table(path: Path) -> Mapping[str, Any] | None:
    """The ``[tool.kvcontract]`` table of one pyproject.toml, or None."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise InputFileError(str(path), "not UTF-8 text (a pyproject.toml is TOML)") from None
    except OSError as exc:
        raise InputFileError(str(path), f"cannot read it ({exc.strerror or exc})") from None
    if "kvcontract" not in text:
        return None  # cheap: most pyproject.toml files say nothing about kvcontract
    tool = _toml_loads(path, text).get("tool")
    if not isinstance(tool, Mapping) or "kvcontract" not in tool:
        return None
    table = tool["kvcontract"]
    if not isinstance(table, Mapping):
        raise InputFileError(str(path), "[tool.kvcontract] must be a table")
    return table


def find_config(start: Path | None = None) -> tuple[Path, Mapping[str, Any]] | None:
    """The nearest ``pyproject.toml`` with a ``[tool.kvcontract]`` table, walking up
    from ``start`` (the working directory), and the table."""
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        candidate = folder / CONFIG_FILE
        if candidate.is_file():
            table = _table(candidate)
            if table is not None:
                return candidate, table
    return None


def load_config(start: Path | None = None) -> ProjectConfig:
    """The validated project configuration (empty when there is none)."""
    found = find_config(start)
    if found is None:
        return ProjectConfig()
    path, table = found
    keys = _keys()
    values: dict[str, Any] = {}
    for key, value in table.items():
        if key not in keys:
            raise InputFileError(str(path), f"[tool.kvcontract] has the unknown key {key!r}; "
                                            f"known keys: {', '.join(KEYS)}")
        parameter, check = keys[key]
        try:
            checked = check(key, value)
        except ValueError as exc:
            raise InputFileError(str(path), f"[tool.kvcontract] {exc}") from None
        if key == "baseline-file":
            checked = str(path.parent / Path(checked).expanduser())
        if key == "fail-on":
            from kvcontract.options import parse_gate_fail_on

            try:
                parse_gate_fail_on(checked)
            except UsageError as exc:
                raise InputFileError(str(path), f"[tool.kvcontract] fail-on: {exc}") from None
        values[parameter] = checked
    return ProjectConfig(path, values)


def apply_config(ctx: Any, params: dict[str, Any],
                 config: ProjectConfig | None = None) -> ProjectConfig:
    """Fill ``params`` (a command's keyword arguments) from the project configuration
    where the option was not given on the command line (nor by an environment
    variable); returns the configuration used. ``model`` applies only when neither
    ``--model`` nor ``--geometry`` is given."""
    import click

    config = config if config is not None else load_config()
    explicit = {
        name for name in params
        if ctx.get_parameter_source(name) not in (click.core.ParameterSource.DEFAULT,
                                                  click.core.ParameterSource.DEFAULT_MAP,
                                                  None)
    }
    for name, value in config.values.items():
        if name not in params or name in explicit:
            continue
        if name == "models" and ({"models", "geometry_files"} & explicit):
            continue
        params[name] = value
    return config
