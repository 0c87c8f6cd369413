"""kvcontract's model of upstream and the live engine in lockstep on end-to-end cases.

For each case the model's observation (the end-to-end family's own ``observe``: an
implementation's store path, then its lookup, e.g. ``upstream-current``, the stand-in
for vLLM) and the live one (:func:`~kvcontract.live.confirm.confirm_case`) are compared
on the accepted hit. A difference is a finding about kvcontract's model of vLLM, not
about vLLM. :func:`agreement` gives the rate. A case whose live run stopped on a gap of
kvcontract's driver (:mod:`kvcontract.live.gaps`) is not compared (``not_replayable``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from kvcontract.live.confirm import JUNCTION_NOT_CONFIRMED, Confirmation, confirm_case
from kvcontract.live.gaps import DriverGapError
from kvcontract.spec.properties.end_to_end import EndToEndCase, run_end_to_end


@dataclass(frozen=True)
class Disagreement:
    case: dict[str, Any]
    model_hit: int | None
    live_hit: int | None
    live_verdict: str


@dataclass
class LockstepReport:
    implementation: str
    agreed: int = 0
    refused: int = 0
    """Cases whose geometry the live backend or vLLM would not build (not compared)."""
    not_replayable: list[str] = field(default_factory=list)
    """Why each case whose live run stopped on a driver gap was not compared."""
    disagreements: list[Disagreement] = field(default_factory=list)
    verdicts: dict[str, int] = field(default_factory=dict)
    """Live verdicts (``lost-hit``, ``as-promised``, ...) of the compared cases."""
    lost_hits: list[tuple[str, int, str, int | None, int]] = field(default_factory=list)
    """``(geometry name, prompt, consumer kind, live hit, GPU floor)`` of every live
    lost hit."""

    @property
    def compared(self) -> int:
        return self.agreed + len(self.disagreements)

    @property
    def agreement(self) -> float:
        return self.agreed / self.compared if self.compared else 1.0

    def to_json(self) -> dict[str, Any]:
        return {"implementation": self.implementation, "compared": self.compared,
                "agreed": self.agreed, "agreement": self.agreement, "refused": self.refused,
                "not_replayable": list(self.not_replayable),
                "verdicts": self.verdicts, "lost_hits": self.lost_hits,
                "disagreements": [vars(d) for d in self.disagreements]}


def lockstep(cases: Iterable[EndToEndCase], implementation: str = "upstream-current",
             ) -> LockstepReport:
    """Run every case on the model (``implementation``, a registered name) and live."""
    from kvcontract.impl.variants import get_implementation

    impl = get_implementation(implementation)
    report = LockstepReport(implementation)
    for case in cases:
        if case.consumer.kind == "junction":
            report.not_replayable.append(f"{case.geometry_name} P={case.producer.prompt_len}"
                                         f" junction: {JUNCTION_NOT_CONFIRMED}")
            continue
        try:
            live: Confirmation = confirm_case(case, keep_observation=False)
        except DriverGapError as exc:
            report.not_replayable.append(f"{case.geometry_name} P={case.producer.prompt_len}"
                                         f" {case.consumer.kind}: {exc}")
            continue
        if live.verdict == "refused":
            report.refused += 1
            continue
        report.verdicts[live.verdict] = report.verdicts.get(live.verdict, 0) + 1
        if live.verdict == "lost-hit":
            report.lost_hits.append((case.geometry_name, case.producer.prompt_len,
                                     case.consumer.kind, live.observed_hit, live.gpu_promise))
        model = run_end_to_end(case, impl)
        if model.hit_tokens == live.observed_hit and live.raised is None:
            report.agreed += 1
        else:
            report.disagreements.append(Disagreement(case.to_json(), model.hit_tokens,
                                                     live.observed_hit, live.verdict))
    return report
