"""Result types of the prover (small, serializable dataclasses).

:class:`Verdict`, the exit codes and the exit-code policy are defined in
:mod:`kvcontract.vocabulary` and re-exported here (their historic location).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from kvcontract.vocabulary import EXIT_COUNTEREXAMPLE as EXIT_COUNTEREXAMPLE
from kvcontract.vocabulary import EXIT_FINDING as EXIT_FINDING
from kvcontract.vocabulary import EXIT_INTERNAL as EXIT_INTERNAL
from kvcontract.vocabulary import EXIT_INTERRUPTED as EXIT_INTERRUPTED
from kvcontract.vocabulary import EXIT_OK as EXIT_OK
from kvcontract.vocabulary import EXIT_UNKNOWN as EXIT_UNKNOWN
from kvcontract.vocabulary import EXIT_USAGE as EXIT_USAGE
from kvcontract.vocabulary import Verdict as Verdict
from kvcontract.vocabulary import exit_code_for as verdicts_exit_code


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
    impact: str | None = None
    """For a COUNTEREXAMPLE: what it costs a user (:class:`kvcontract.vocabulary.Impact`)."""
    latent: str | None = None
    """For a ``latent`` COUNTEREXAMPLE: why vLLM does not build the witness's geometry."""

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


def exit_code_for(results: Iterable[TheoremResult]) -> int:
    """The exit code of a list of results (:func:`kvcontract.vocabulary.exit_code_for`):
    0 all hold (or no result); 1 a counterexample; 3 unknown or vacuous (and no
    counterexample)."""
    return verdicts_exit_code(r.verdict for r in results)
