"""The project's outcome and status words, defined once (issue #10, item 3).

Every enum that names an outcome or a state lives here, and nowhere else:

* :class:`LookupResult` - what the offload manager answers for one chunk key;
* :class:`RequestStatus` - where a request is when its store job is built;
* :class:`GroupKind` - the attention type of a KV-cache group;
* :class:`Verdict` - the outcome of one theorem (or fuzzed clause), with whether it
  passes, its exit code, its labels, and the exit-code policy for a list of verdicts;
* :class:`Outcome` - how a verdict counts in a test report (pass, fail, error);
* :class:`Impact` - what a finding does to a serving system, most severe first.

The exit codes (``EXIT_*``) and the policy that folds verdicts into one exit code
(:func:`exit_code_for`, :func:`worst_exit_code`) are here too; commands call them.

The old import locations keep working: ``kvcontract.spec.lookup`` (``LookupResult``,
``HIT``...), ``kvcontract.spec.reachability`` (``RequestStatus``),
``kvcontract.spec.geometry`` (``GroupKind``) and ``kvcontract.proofs.verdicts``
(``Verdict``, ``EXIT_*``) re-export these objects. The module imports only the standard
library (no Z3, no torch), so reproducers, the reference implementation and the audit's
stand-ins can use it.

The ``str`` enums compare (and hash) equal to their values, so code that passes the
plain strings (``tracker.step("decoding", ...)``, a verdict read from a JSON report)
keeps working; ``str()``/f-strings of a member give ``Class.NAME``, so write ``.value``
when the bare word is wanted.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable

# -- exit codes -------------------------------------------------------------------------
VERSION = "0.1.0"
"""kvcontract's version (``kvcontract.__version__``; SARIF's tool version): defined here, at
the bottom layer, so that renderers read it without importing the package's API."""

EXIT_OK = 0
"""Everything checked holds (proved, proved for the domain, tested, passed)."""
EXIT_COUNTEREXAMPLE = 1
"""A counterexample (or another finding: a fuzz difference, an audit regression)."""
EXIT_FINDING = EXIT_COUNTEREXAMPLE
"""Alias of :data:`EXIT_COUNTEREXAMPLE` for commands whose findings are not proofs."""
EXIT_USAGE = 2
"""A usage or input error: unknown clause or target, impossible geometry, bad file."""
EXIT_UNKNOWN = 3
"""Undecided: an unknown or vacuous theorem (and no counterexample), or nothing checked."""
EXIT_INTERNAL = 4
"""An internal error of kvcontract itself (a bug, not a finding). Not used yet."""
EXIT_INTERRUPTED = 130
"""Interrupted by the user (SIGINT, ``128 + 2`` by shell convention). Not used yet."""

_EXIT_SEVERITY: tuple[int, ...] = (
    EXIT_OK,
    EXIT_UNKNOWN,
    EXIT_COUNTEREXAMPLE,
    EXIT_USAGE,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
)
"""Exit codes from mildest to most severe: a counterexample beats an undecided result
(a finding is a finding even if another theorem was not decided); an error of the run
(usage, internal, interrupt) beats any verdict, since the verdicts are then incomplete."""


def worst_exit_code(codes: Iterable[int], *, empty: int = EXIT_OK) -> int:
    """The most severe of ``codes`` (order :data:`_EXIT_SEVERITY`); ``empty`` if none.

    Raises ValueError for a code that is not one of the ``EXIT_*`` constants.
    """
    worst: int | None = None
    for code in codes:
        if code not in _EXIT_SEVERITY:
            raise ValueError(f"not a kvcontract exit code: {code!r}")
        if worst is None or _EXIT_SEVERITY.index(code) > _EXIT_SEVERITY.index(worst):
            worst = code
    return empty if worst is None else worst


# -- lookup results ---------------------------------------------------------------------
class LookupResult(enum.IntEnum):
    """What the offload manager answers for one chunk key (docs/CONTRACT.md 4.1).

    Small integers, so that a sequence of them can be a sequence of Z3 integer variables.
    """

    MISS = 0
    """The key is not in the offload store."""
    HIT = 1
    """The key is stored and ready to load."""
    HIT_PENDING = 2
    """The key is being stored (its transfer is in flight): present, not yet loadable."""
    RETRY = 3
    """The key's location is unknown (an asynchronous lookup is in flight): ask again."""


# -- request status ---------------------------------------------------------------------
class RequestStatus(str, enum.Enum):
    """Where a request is when its store job is built (docs/CONTRACT.md section 5).

    The values are the strings the store path (``impl/scheduler.StoreTracker.step``,
    ``impl/reference.get_num_offloadable_tokens``) has always been called with; a member
    compares and hashes equal to its string.
    """

    PREFILLING = "prefilling"
    """Its prompt is being computed (possibly over several chunked-prefill steps)."""
    DECODING = "decoding"
    """Its prompt is computed; it generates one token per step."""
    FINISHED = "finished"
    """It stopped by sampling (its final sampled slot has no KV)."""
    ABORTED = "aborted"
    """It was cancelled; only what it computed exists."""

    @property
    def ended(self) -> bool:
        """Finished or aborted: the real horizon closes the final segment (C9)."""
        return self in ENDED_STATUSES


ENDED_STATUSES: frozenset[RequestStatus] = frozenset(
    {RequestStatus.FINISHED, RequestStatus.ABORTED}
)
"""The statuses after which a request computes nothing more; ``"finished" in
ENDED_STATUSES`` holds for the plain string too."""


# -- group kinds ------------------------------------------------------------------------
class GroupKind(str, enum.Enum):
    """The attention type of a KV-cache group."""

    FULL = "full"
    """Full attention: every block of the prefix is kept and loaded."""
    SLIDING_WINDOW = "sliding_window"
    """Sliding-window attention: only the window's blocks are retained (docs/CONTRACT.md 3)."""
    MAMBA = "mamba"
    """A state-space group: one state per chunk end, kept in the chunk ending there."""


# -- report outcomes --------------------------------------------------------------------
class Outcome(str, enum.Enum):
    """How a verdict counts in a test report (JUnit, Markdown, the exit code)."""

    PASS = "pass"
    """It holds (exit 0)."""
    FAIL = "fail"
    """A finding (exit 1): a JUnit failure."""
    ERROR = "error"
    """Undecided (exit 3): a JUnit error, never a pass."""


# -- verdicts ---------------------------------------------------------------------------
class Verdict(str, enum.Enum):
    """The honest outcome of one theorem (or, for ``PASSED``, of one fuzzed clause)."""

    PROVED = "PROVED"
    """Holds for all values of the theorem's variables (sizes symbolic too)."""
    PROVED_FOR_DOMAIN = "PROVED-FOR-DOMAIN"
    """Holds on the stated domain (case split over sizes, bounded lengths, exhaustion)."""
    COUNTEREXAMPLE = "COUNTEREXAMPLE"
    """A concrete witness that violates the clause, re-executed on plain Python."""
    TESTED = "TESTED"
    """No counterexample in a bounded search that is not exhaustive (sampled cases, one
    scenario): evidence, not a proof. It passes, and says so. Only the audit, which
    cannot lift every upstream function, reports it."""
    PASSED = "PASSED"
    """A clause the differential fuzzer checked without a difference (the fuzz report
    folded into per-clause results). Like ``TESTED`` it is evidence, not a proof, and
    passes; it is a member of its own (not mapped to ``TESTED``) because fuzz reports
    have always carried the word ``PASSED`` and the README documents it."""
    UNKNOWN = "UNKNOWN"
    """The solver gave up within its budget. Never a pass."""
    VACUOUS = "VACUOUS"
    """The hypotheses are unsatisfiable, so the theorem says nothing. A failure."""

    @property
    def passed(self) -> bool:
        """Whether the verdict counts as holding (exit code 0)."""
        return self.exit_code == EXIT_OK

    @property
    def exit_code(self) -> int:
        """The exit code of a run whose only verdict is this one."""
        return _VERDICT_EXIT[self]

    @property
    def outcome(self) -> Outcome:
        """Pass, fail (a counterexample) or error (undecided), for test reports."""
        return _OUTCOME_OF_EXIT[self.exit_code]

    @property
    def display(self) -> str:
        """The full label, as printed in tables and written in JSON reports."""
        return self.value

    @property
    def short(self) -> str:
        """A label of at most 7 characters, for narrow terminals."""
        return _VERDICT_SHORT[self]

    @classmethod
    def exit_code_for(cls, verdicts: Iterable[Verdict | str], *, empty: int = EXIT_OK) -> int:
        """The exit-code policy for a list of verdicts (see :func:`exit_code_for`)."""
        return exit_code_for(verdicts, empty=empty)


_VERDICT_EXIT: dict[Verdict, int] = {
    Verdict.PROVED: EXIT_OK,
    Verdict.PROVED_FOR_DOMAIN: EXIT_OK,
    Verdict.COUNTEREXAMPLE: EXIT_COUNTEREXAMPLE,
    Verdict.TESTED: EXIT_OK,
    Verdict.PASSED: EXIT_OK,
    Verdict.UNKNOWN: EXIT_UNKNOWN,
    Verdict.VACUOUS: EXIT_UNKNOWN,
}

_VERDICT_SHORT: dict[Verdict, str] = {
    Verdict.PROVED: "PROVED",
    Verdict.PROVED_FOR_DOMAIN: "DOMAIN",
    Verdict.COUNTEREXAMPLE: "CEX",
    Verdict.TESTED: "TESTED",
    Verdict.PASSED: "PASSED",
    Verdict.UNKNOWN: "UNKNOWN",
    Verdict.VACUOUS: "VACUOUS",
}

_OUTCOME_OF_EXIT: dict[int, Outcome] = {
    EXIT_OK: Outcome.PASS,
    EXIT_COUNTEREXAMPLE: Outcome.FAIL,
    EXIT_UNKNOWN: Outcome.ERROR,
}


def exit_code_for(verdicts: Iterable[Verdict | str], *, empty: int = EXIT_OK) -> int:
    """The exit code of a run with these verdicts: the policy, in one place.

    ``1`` if any is a counterexample; else ``3`` if any is unknown or vacuous; else
    ``0``. A run with no verdict at all gives ``empty``: ``0`` by default (``prove``
    with a selection that matched nothing has always exited 0); the audit passes
    ``empty=EXIT_UNKNOWN`` because an audit that checked nothing decided nothing.
    Verdicts may be given as their strings (a JSON report's ``"verdict"``); an unknown
    string raises ValueError.
    """
    return worst_exit_code((Verdict(v).exit_code for v in verdicts), empty=empty)


# -- impact of a finding ----------------------------------------------------------------
class Impact(str, enum.Enum):
    """What a finding does to a serving system, most severe first."""

    CRASH = "crash"
    """A load of an absent or still-pending chunk: the worker fails the request."""
    CORRUPTION = "corruption"
    """Wrong KV bytes are attended to: the output silently differs (C11)."""
    LOST_HIT = "lost-hit"
    """A prefix that is stored is not used: its tokens are recomputed."""
    STALL = "stall"
    """A request is deferred without end (a job it waits on never completes and no
    deadline decides it): it waits until the client gives up (C13)."""
    DELAY = "delay"
    """A request is deferred for a bounded time (e.g. behind a pending store)."""
    WASTE = "waste"
    """A chunk is stored (bandwidth, CPU memory) that no lookup ever demands."""
    LATENT = "latent"
    """The defect needs a geometry vLLM does not build today: no effect yet."""


DEFAULT_FAIL_ON: frozenset[Impact] = frozenset(i for i in Impact if i is not Impact.LATENT)
"""The impacts that fail a run unless ``--fail-on`` says otherwise: every finding on a
geometry vLLM builds (a regression of a historic delay or waste defect fails CI, as
every finding of mypy or ruff does); ``latent`` never fails by default."""

DEFAULT_FAIL_ON_TEXT = ",".join(i.value for i in Impact if i in DEFAULT_FAIL_ON)
""":data:`DEFAULT_FAIL_ON` as ``--fail-on`` spells it."""


def parse_impacts(text: str) -> frozenset[Impact]:
    """``--fail-on crash,lost-hit`` (``all`` names every impact); raises ValueError
    naming the unknown word and the known ones."""
    words = [w.strip().lower() for w in text.split(",") if w.strip()]
    if not words:
        raise ValueError("--fail-on needs at least one impact")
    if words == ["all"]:
        return frozenset(Impact)
    known = {i.value: i for i in Impact}
    unknown = [w for w in words if w not in known]
    if unknown:
        raise ValueError(f"unknown impact {unknown[0]!r} in --fail-on; choose from "
                         f"{', '.join(known)} (or all)")
    return frozenset(known[w] for w in words)


def finding_exit_code(
    findings: Iterable[tuple[Verdict | str, Impact | str | None]],
    fail_on: frozenset[Impact] = DEFAULT_FAIL_ON,
    *,
    empty: int = EXIT_OK,
) -> int:
    """The exit-code policy with impacts: a counterexample fails the run only when its
    impact is in ``fail_on`` (one without an impact always fails); otherwise it is
    reported and passes. Unknown and vacuous stay 3 whatever ``fail_on`` says."""
    codes = []
    for verdict, impact in findings:
        code = Verdict(verdict).exit_code
        if code == EXIT_COUNTEREXAMPLE and impact is not None and Impact(impact) not in fail_on:
            code = EXIT_OK
        codes.append(code)
    return worst_exit_code(codes, empty=empty)


__all__ = [
    "DEFAULT_FAIL_ON",
    "DEFAULT_FAIL_ON_TEXT",
    "ENDED_STATUSES",
    "EXIT_COUNTEREXAMPLE",
    "EXIT_FINDING",
    "EXIT_INTERNAL",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_UNKNOWN",
    "EXIT_USAGE",
    "GroupKind",
    "Impact",
    "LookupResult",
    "Outcome",
    "RequestStatus",
    "Verdict",
    "exit_code_for",
    "finding_exit_code",
    "parse_impacts",
    "worst_exit_code",
]
