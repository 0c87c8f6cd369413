"""Verdicts and result types of the prover (small, serializable dataclasses)."""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field
from typing import Any


class Verdict(str, enum.Enum):
    """The honest outcome of one theorem."""

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
    UNKNOWN = "UNKNOWN"
    """The solver gave up within its budget. Never a pass."""
    VACUOUS = "VACUOUS"
    """The hypotheses are unsatisfiable, so the theorem says nothing. A failure."""

    @property
    def passed(self) -> bool:
        return self in (Verdict.PROVED, Verdict.PROVED_FOR_DOMAIN, Verdict.TESTED)


@dataclass
class TheoremResult:
    """One row of the proof table and of the JSON report."""

    clause: str
    theorem: str
    verdict: Verdict
    domain: str
    seconds: float
    rlimit_used: int = 0
    """Z3's deterministic resource count summed over the theorem's queries."""
    queries: int = 0
    witness: dict[str, Any] | None = None
    """For a COUNTEREXAMPLE: the concrete values (geometry, tokens, lookup states)."""
    message: str = ""
    """What the witness violates, or why the verdict is UNKNOWN/VACUOUS."""
    description: str = ""
    details: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["verdict"] = self.verdict.value
        data["seconds"] = round(self.seconds, 4)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TheoremResult:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        known["verdict"] = Verdict(known["verdict"])
        return cls(**known)


def exit_code_for(results: list[TheoremResult]) -> int:
    """0 all proved; 1 a counterexample; 3 unknown or vacuous (and no counterexample)."""
    verdicts = {r.verdict for r in results}
    if Verdict.COUNTEREXAMPLE in verdicts:
        return 1
    if verdicts & {Verdict.UNKNOWN, Verdict.VACUOUS}:
        return 3
    return 0


EXIT_OK = 0
EXIT_COUNTEREXAMPLE = 1
EXIT_USAGE = 2
EXIT_UNKNOWN = 3
