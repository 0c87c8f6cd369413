"""Output files of the verifying commands: the format an output's suffix implies, the
pairing of ``--format`` and ``--output`` options, and writing a file."""

from __future__ import annotations

from pathlib import Path

from kvcontract.errors import UsageError
from kvcontract.tools.reports.formats import FORMATS

FORMAT_SUFFIXES: dict[str, str] = {
    ".json": "json",
    ".xml": "junit",
    ".sarif": "sarif",
    ".md": "markdown",
    ".txt": "text",
    ".mypy": "mypy",
    ".github": "github",
}
"""Output-file suffixes from which the CLI infers a format when none is given."""

STDOUT = "-"
"""``--output -``: this ``--format`` goes to standard output (with the others to files,
e.g. ``--format github --output - --format sarif --output r.sarif``)."""


def format_for_path(path: str) -> str:
    """The format an output file's suffix implies (``.sarif`` -> ``sarif``, ...)."""
    suffix = Path(path).suffix.lower()
    fmt = FORMAT_SUFFIXES.get(suffix)
    if fmt is None:
        raise UsageError(
            f"cannot tell the format of {path} from its suffix; give --format "
            f"({', '.join(FORMATS)}) or use one of {', '.join(sorted(FORMAT_SUFFIXES))}"
        )
    return fmt


def pair_outputs(
    formats: tuple[str, ...], outputs: tuple[str, ...]
) -> list[tuple[str, str | None]]:
    """Match ``--format`` and ``--output`` options: pairwise, one format to stdout, or
    formats inferred from the output suffixes. ``None`` as a path means stdout
    (``--output -`` names it when several formats are paired)."""
    for fmt in formats:
        if fmt not in FORMATS:
            raise UsageError(f"unknown report format {fmt!r}; choose one of: {', '.join(FORMATS)}")
    if STDOUT in outputs and not formats:
        raise UsageError(f"--output {STDOUT} (standard output) needs a --format")
    if sum(1 for path in outputs if path == STDOUT) > 1:
        raise UsageError(f"--output {STDOUT} (standard output) is given twice; give one "
                         "format to standard output and the others a file each")
    if not outputs:
        if len(formats) > 1:
            raise UsageError("several --format options need one --output FILE each")
        return [(fmt, None) for fmt in formats]
    if not formats:
        return [(format_for_path(path), path) for path in outputs]
    if len(formats) != len(outputs):
        raise UsageError(
            f"{len(formats)} --format options but {len(outputs)} --output options; "
            "give one --output per --format (in the same order)"
        )
    return [(fmt, None if path == STDOUT else path)
            for fmt, path in zip(formats, outputs, strict=True)]
