"""The ``kvcontract`` command line: the group, its global options, the registration of
the commands (one module each in :mod:`kvcontract.tools.commands`, the only modules
that parse arguments) and the mapping of errors to exit codes.

Exit codes (every command; ``kvcontract.vocabulary.EXIT_*``):

    0    every theorem PROVED or PROVED-FOR-DOMAIN / the fuzzer found nothing / the
         files were written
    1    a COUNTEREXAMPLE (or a fuzzing difference, an audit regression)
    2    usage or input error (unknown clause or target, bad file, impossible geometry,
         unwritable output): ``kvcontract: error: <message>``, and click's own usage errors
    3    UNKNOWN or VACUOUS somewhere and no counterexample, or nothing was checked
    4    internal error of kvcontract (a bug, a killed worker process): one line
         ``kvcontract: internal error: <Type>: <message>``; ``--debug`` adds the traceback
    130  interrupted (Ctrl-C): ``kvcontract: interrupted``

A closed pipe (``kvcontract list | head -1``) is not an error: what follows is discarded
quietly (no traceback, no "Broken pipe" line) and the run ends with the exit code it
would have had (:class:`_PipeSafe`); unlike ``git``, the process is not killed by
SIGPIPE (status 141), so a ``prove | head`` in CI still exits with its verdict.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import traceback
from collections.abc import Iterator, Sequence
from concurrent.futures.process import BrokenProcessPool
from typing import IO, Any

import click

from kvcontract.errors import KvContractError
from kvcontract.tools.commands._common import SESSION, internal_error
from kvcontract.tools.commands.audit import audit
from kvcontract.tools.commands.explain import explain
from kvcontract.tools.commands.fuzz import fuzz
from kvcontract.tools.commands.gen_tests import gen_tests
from kvcontract.tools.commands.list import list_command
from kvcontract.tools.commands.live import live
from kvcontract.tools.commands.merge import merge
from kvcontract.tools.commands.mutate import mutate
from kvcontract.tools.commands.prove import prove
from kvcontract.tools.commands.vllm_tests import vllm_tests
from kvcontract.tools.interrupts import SIGNALS, install_signal_handling
from kvcontract.vocabulary import EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE

COMMANDS: tuple[click.Command, ...] = (prove, fuzz, gen_tests, explain, audit, list_command,
                                       mutate, merge, live, vllm_tests)
"""Every command of the group, in registration order (help lists them by name)."""

DEBUG_ENV = "KVCONTRACT_DEBUG"
"""Environment variable that turns ``--debug`` on (``1``)."""


class KvContractGroup(click.Group):
    """The group; its :meth:`main` maps every outcome to one exit code (also under
    ``click.testing.CliRunner``, which calls ``main``)."""

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None,
             complete_var: str | None = None, standalone_mode: bool = True,
             windows_expand_args: bool = True, **extra: Any) -> Any:
        code = run(self, args, prog_name, complete_var, windows_expand_args, **extra)
        if standalone_mode:
            sys.exit(code)
        return code

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            raise _Interrupted() from None  # past click's Abort (and its blank line)


class _Interrupted(BaseException):
    """Ctrl-C inside a command, carried past click's own handling to :func:`run`."""


def _set_debug(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    SESSION.debug = SESSION.debug or bool(value)


@click.group(cls=KvContractGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="kvcontract")
@click.option("--debug", is_flag=True, expose_value=False, is_eager=True, envvar=DEBUG_ENV,
              callback=_set_debug,
              help=f"print the traceback of an internal error (or set {DEBUG_ENV}=1)")
def cli() -> None:
    """Prove and test the KV-offloading coverage contract of sliding-window attention."""


for _command in COMMANDS:
    cli.add_command(_command)


class _PipeSafe:
    """A text stream whose reader may go away (``kvcontract list | head -1``): the first
    ``BrokenPipeError`` points the file descriptor at ``/dev/null`` (so nothing, not even
    the interpreter's last flush, fails on it again) and every later write is dropped.
    Everything else is the wrapped stream's (rich and click read ``isatty``, ``fileno``,
    ``encoding`` through it)."""

    def __init__(self, stream: IO[str]) -> None:
        self._stream = stream
        self.broken = False

    def _broke(self) -> None:
        self.broken = True
        with contextlib.suppress(OSError, ValueError, AttributeError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self._stream.fileno())
            os.close(devnull)

    def write(self, text: str) -> int:
        if self.broken:
            return len(text)
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._broke()
            return len(text)

    def flush(self) -> None:
        if self.broken:
            with contextlib.suppress(OSError, ValueError):
                self._stream.flush()  # the buffer drains into /dev/null
            return
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._broke()
            with contextlib.suppress(OSError, ValueError):
                self._stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextlib.contextmanager
def _pipe_safe_output() -> Iterator[None]:
    """stdout and stderr as :class:`_PipeSafe` streams for one run (restored after it,
    with a last flush that cannot fail)."""
    saved = sys.stdout, sys.stderr
    wrapped = [None if s is None or isinstance(s, _PipeSafe) else _PipeSafe(s) for s in saved]
    if wrapped[0] is not None:
        sys.stdout = wrapped[0]
    if wrapped[1] is not None:
        sys.stderr = wrapped[1]
    try:
        yield
    finally:
        for stream in wrapped:
            if stream is not None:
                with contextlib.suppress(OSError, ValueError):
                    stream.flush()
        sys.stdout, sys.stderr = saved


def run(group: click.Group, args: Sequence[str] | None, prog_name: str | None,
        complete_var: str | None = None, windows_expand_args: bool = True,
        **extra: Any) -> int:
    """Run the group once; the exit code of what happened (see the module docstring)."""
    with _pipe_safe_output():
        return _run(group, args, prog_name, complete_var, windows_expand_args, **extra)


def _run(group: click.Group, args: Sequence[str] | None, prog_name: str | None,
         complete_var: str | None = None, windows_expand_args: bool = True,
         **extra: Any) -> int:
    SESSION.debug = os.environ.get(DEBUG_ENV, "") not in ("", "0")
    SIGNALS.interrupted = False
    previous = install_signal_handling()
    try:
        result = click.Group.main(
            group, args=list(args) if args is not None else None, prog_name=prog_name,
            complete_var=complete_var, standalone_mode=False,
            windows_expand_args=windows_expand_args, **extra,
        )
    except SystemExit as exc:  # the commands exit with their verdict's code
        code = exc.code
        if code is None:
            return EXIT_OK
        if isinstance(code, int):
            return code
        click.echo(str(code), err=True)
        return EXIT_USAGE
    except click.ClickException as exc:
        exc.show()
        return EXIT_USAGE
    except (click.exceptions.Abort, KeyboardInterrupt, _Interrupted):
        return _interrupted()
    except KvContractError as exc:
        if SESSION.debug:
            click.echo(traceback.format_exc().rstrip(), err=True)
        click.echo(f"kvcontract: error: {exc}", err=True)
        code = getattr(exc, "exit_code", EXIT_USAGE)
        return code if isinstance(code, int) and not isinstance(code, bool) else EXIT_USAGE
    except Exception as exc:  # a bug, a killed worker, a pickling error: never a verdict
        if SIGNALS.interrupted and isinstance(exc, BrokenProcessPool):
            return _interrupted()  # the workers died of the same Ctrl-C
        return int(internal_error(exc))
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
    return int(result) if isinstance(result, int) and not isinstance(result, bool) else EXIT_OK


def _interrupted() -> int:
    click.echo("kvcontract: interrupted", err=True)
    return EXIT_INTERRUPTED


def main(argv: list[str] | None = None) -> None:
    """Entry point (``kvcontract``, ``python -m kvcontract``): exits with the code of
    :func:`run`."""
    cli.main(args=argv, prog_name="kvcontract")


if __name__ == "__main__":
    main()
