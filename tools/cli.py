"""The ``kvcontract`` command line: the group, its global options, the registration of
the commands (one module each in :mod:`kvcontract.tools.commands`, the only modules
that parse arguments) and the mapping of errors to exit codes.

Exit codes (every verifying command):

    0  every theorem PROVED or PROVED-FOR-DOMAIN / the fuzzer found nothing
    1  a COUNTEREXAMPLE (or a fuzzing difference)
    2  usage or input error (unknown clause or target, bad file, impossible geometry)
    3  UNKNOWN or VACUOUS somewhere, and no counterexample
"""

from __future__ import annotations

import sys

import click
from kvcontract.proofs.verdicts import EXIT_USAGE
from kvcontract.tools.commands.audit import audit
from kvcontract.tools.commands.explain import explain
from kvcontract.tools.commands.fuzz import fuzz
from kvcontract.tools.commands.gen_tests import gen_tests
from kvcontract.tools.commands.list import list_command
from kvcontract.tools.commands.mutate import mutate
from kvcontract.tools.commands.prove import prove

from kvcontract.errors import KvContractError

COMMANDS: tuple[click.Command, ...] = (prove, fuzz, gen_tests, explain, audit, list_command,
                                       mutate)
"""Every command of the group, in registration order (help lists them by name)."""


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="kvcontract")
def cli() -> None:
    """Prove and test the KV-offloading coverage contract of sliding-window attention."""


for _command in COMMANDS:
    cli.add_command(_command)


def main(argv: list[str] | None = None) -> None:
    """Entry point: maps kvcontract errors to exit code 2 with a one-line message."""
    try:
        cli.main(args=argv, prog_name="kvcontract", standalone_mode=False)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        sys.exit(EXIT_USAGE)
    except click.exceptions.Abort:
        sys.exit(EXIT_USAGE)
    except KvContractError as exc:
        click.echo(f"kvcontract: error: {exc}", err=True)
        sys.exit(EXIT_USAGE)
    sys.exit(0)


if __name__ == "__main__":
    main()
