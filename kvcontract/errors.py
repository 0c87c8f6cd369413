"""The exception hierarchy of kvcontract.

Every error a user can trigger derives from :class:`KvContractError` and carries a
message that says what is wrong and what to do. The command line maps them to exit
code 2 (usage or input error) with one line ``kvcontract: error: <message>``; any other
exception is an internal error (a bug: exit 4, one line, the traceback under
``--debug``) and Ctrl-C exits 130; see ``tools/cli.py``.

    KvContractError
    +-- UsageError            bad command-line arguments or API arguments
    |   +-- UnknownClauseError    a clause id that the catalogue does not define
    |   +-- UnknownTargetError    an implementation/variant name that is not registered
    |   +-- UnknownPropertyError  a theorem id that names no property
    +-- GeometryError         an impossible configuration (names the field and the rule)
    +-- InputFileError        a file that cannot be read or parsed
    +-- WitnessError          a witness a property cannot replay (malformed, or outside
    |                         its domain)
    +-- ProofError            the prover itself failed (not a verdict: a bug or a limit)
    +-- EngineUnavailableError  vLLM's engine was required (``audit --judge engine``) and
                              cannot run here (exit 3: undecided, not a usage error)
"""

from __future__ import annotations


class KvContractError(Exception):
    """Base class of every error kvcontract raises on purpose."""


class UsageError(KvContractError):
    """Arguments that cannot be acted on."""


class UnknownClauseError(UsageError):
    """A clause id that is not in the catalogue."""

    def __init__(self, clause: str, known: list[str]) -> None:
        self.clause = clause
        self.known = known
        super().__init__(
            f"unknown clause {clause!r}; known clauses: {', '.join(known)}"
        )


class UnknownTargetError(UsageError):
    """An implementation name that is not registered."""

    def __init__(self, target: str, known: list[str]) -> None:
        self.target = target
        self.known = known
        super().__init__(
            f"unknown implementation {target!r}; choose one of: {', '.join(known)}"
        )


class UnknownPropertyError(UsageError):
    """A theorem id that names no property of the catalogue."""


class GeometryError(KvContractError):
    """An impossible geometry: names the offending field and the rule it breaks."""

    def __init__(self, field: str, value: object, rule: str) -> None:
        self.field = field
        self.value = value
        self.rule = rule
        super().__init__(f"invalid geometry: {field}={value!r}: {rule}")


class InputFileError(KvContractError):
    """A file given by the user that cannot be read or parsed."""

    def __init__(self, path: str, problem: str) -> None:
        self.path = path
        self.problem = problem
        super().__init__(f"cannot use {path}: {problem}")


class WitnessError(KvContractError):
    """A witness (a report's counterexample) that a property cannot replay: malformed,
    of the wrong kind, or outside the property's domain (then it proves nothing)."""


class ProofError(KvContractError):
    """The prover could not run a theorem at all (distinct from an UNKNOWN verdict)."""


class EngineUnavailableError(KvContractError):
    """``audit --judge engine``: the target's vLLM cannot be imported and run here (the
    message names what to install, or the import error: kvcontract's gap). The command
    line exits 3 (undecided), not 2."""

    exit_code = 3
