"""``kvcontract vllm-tests``: a vLLM release's own offloading tests, fetched from its
sdist and laid out to run on CPU, offline (:mod:`kvcontract.live.vllm_tests`).

``--release X`` (default: the installed vLLM's version) ``--dest DIR``: the tests go to
``DIR/vllm-X/``, an offline Hugging Face cache for the model they configure to
``DIR/hf-home``; the command prints where, the support files the release lacks, and the
shell line that runs ``test_scheduler.py`` (``--test-file`` another file of the folder)
with the interpreter that has that release installed. Exit 0 when the files were
written, 2 for a usage or input error (no release named and no vLLM installed, a
release pip cannot fetch, a destination that is not a folder, no pip).
"""

from __future__ import annotations

from pathlib import Path

import click

from kvcontract.errors import UsageError


@click.command("vllm-tests")
@click.option("--release", metavar="X.Y.Z",
              help="the vLLM release whose tests to fetch (default: the installed vLLM's)")
@click.option("--dest", "dest", required=True, metavar="DIR",
              help="the folder to lay them out in (DIR/vllm-X/, DIR/hf-home)")
@click.option("--test-file", default="test_scheduler.py", show_default=True, metavar="FILE",
              help="the file of tests/v1/kv_connector/unit/offloading_connector/ the printed "
                   "line runs")
def vllm_tests(release: str | None, dest: str, test_file: str) -> None:
    """Fetch a vLLM release's own offloading-connector tests (from its sdist, with pip)
    and print how to run them on CPU, offline."""
    from kvcontract.live.vllm_tests import OFFLOADING_FOLDER, fetch_tests, pip_available

    folder = _check_dest(dest)
    name = release.strip() if release is not None else _installed_release()
    if not name:
        raise UsageError("--release needs a version (e.g. 0.34.0)")
    if not test_file.strip() or "/" in test_file:
        raise UsageError(f"--test-file {test_file!r}: name a file of {OFFLOADING_FOLDER}/")
    if not pip_available():
        raise UsageError("pip is not installed for this Python; kvcontract vllm-tests "
                         "downloads vLLM's sdist with it (python -m ensurepip)")
    click.echo(f"fetching vLLM {name}'s sdist with pip (a minute; pip's metadata step "
               "fails, as expected: the unpacked sdist is used) ...", err=True)
    fetched = fetch_tests(name, folder)
    click.echo(f"vLLM {fetched.release}'s offloading tests: {fetched.root}")
    click.echo(f"offline Hugging Face cache (facebook/opt-125m config.json): "
               f"{fetched.hf_home}")
    for missing in fetched.missing:
        click.echo(f"not in this release: {missing}")
    if not (fetched.root / OFFLOADING_FOLDER / test_file).is_file():
        click.echo(f"note: vLLM {fetched.release} has no {OFFLOADING_FOLDER}/{test_file}")
    click.echo("to judge the contract as they run, add: -p kvcontract.monitor "
               "--kvcontract-report monitor.json (docs/usage.md, \"Runtime monitor\")")
    click.echo(f"run them on CPU with the Python that has vLLM {fetched.release} installed:")
    click.echo(fetched.shell_line(test_file, python=_python_for(fetched.release)))


def _check_dest(dest: str) -> Path:
    """The destination, a folder or creatable as one (a usage error otherwise)."""
    import os

    if not dest or not dest.strip():
        raise UsageError("--dest needs a folder name, not an empty string")
    target = Path(dest).expanduser()
    if target.exists() and not target.is_dir():
        raise UsageError(f"--dest {dest} exists and is not a folder")
    existing = target
    while not existing.exists():
        if existing.parent == existing:
            break
        existing = existing.parent
    if not existing.is_dir():
        raise UsageError(f"--dest {dest}: {existing} is not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UsageError(f"--dest {dest}: {existing} is not writable")
    return target.resolve()


def _installed_release() -> str:
    """The installed vLLM's version (a usage error without one)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("vllm")
    except PackageNotFoundError:
        raise UsageError("vLLM is not installed here: name the release with --release X.Y.Z"
                         ) from None


def _python_for(release: str) -> str:
    """The interpreter to print: this one where it has ``release`` installed, else
    ``python`` (the user's, which must have it)."""
    import sys
    from importlib.metadata import PackageNotFoundError, version

    try:
        installed = version("vllm")
    except PackageNotFoundError:
        return "python"
    return sys.executable if installed == release else "python"
