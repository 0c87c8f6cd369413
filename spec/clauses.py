"""The coverage contract, clause by clause (docs/CONTRACT.md section 9).

C1 retention
    After allocating a hit N after local L, the live SWA blocks are ``Ret(N)``.
C2 load safety
    If the lookup accepts N > L, every chunk of every group's load set was answered HIT
    in that lookup (never absent, never pending): no "not found", no "not ready".
C3 readiness scope
    The lookup defers only for a RETRY or for a pending chunk inside the window it
    would use; a pending chunk outside every usable window never defers.
C4 maximality
    The accepted hit is the largest boundary whose windows are all ready.
C5 EAGLE
    An unverified EAGLE group needs W + 1 ready chunks; the peek chunk is looked up but
    not loaded; pops happen once per boundary.
C6 convergence
    The final N satisfies C2 for every group at that N; maxhit never grows; the loop
    terminates.
C7 supply covers demand
    For every boundary a consumer can reach, every chunk its lookup demands was offered
    to ``prepare_store`` by the producer.
C8 store economy
    No chunk is stored that no reachable boundary can demand, and no chunk is offered
    twice for one horizon.
C9 store horizon
    Intermediate prefill frontiers never create a final tail; finish and abort
    recompute it at the real horizon.
C10 well-formed stores
    No stored chunk contains a null/stale block or an uncommitted (final sampled) slot.
C11 data integrity
    After a load, every attended and retained position holds the producer's bytes; a
    decode step over the restored cache equals one over a recomputed cache. (Checked by
    the executable system, not by the prover.)
C12 no lost hits
    Once a producer finished or aborted and its stores completed, a consumer that
    resends its prompt, continues it or shares a prefix gets exactly the hit vLLM's GPU
    prefix-cache rule serves from the chunks the producer owes by contract
    (``spec/properties/end_to_end.promised_hit``).

Reachable boundaries (C7, C8): the A-aligned boundaries up to the store horizon, the
replay boundaries of a retention interval, and the final horizon of a finished or
aborted request. This is the set upstream's mask is built for; ARCHITECTURE.md states it.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvcontract.errors import UnknownClauseError
from kvcontract.vocabulary import Impact


@dataclass(frozen=True)
class Clause:
    id: str
    title: str
    statement: str
    proved_by: str
    """``prover`` or ``system`` (C11 is checked by executing the tensor-backed system)."""

    @property
    def impact(self) -> Impact:
        """What a violation of the clause costs a user, unless the finding says more
        precisely (a property may give each violation its own impact)."""
        return CLAUSE_IMPACT[self.id]


CLAUSES: tuple[Clause, ...] = (
    Clause("C1", "retention", "live SWA blocks after allocating N after L are Ret(N)", "prover"),
    Clause("C2", "load safety", "every chunk of every load set was answered HIT", "prover"),
    Clause(
        "C3", "readiness scope", "defer only for RETRY or pending inside the used window", "prover"
    ),
    Clause(
        "C4",
        "maximality",
        "the accepted hit is the largest boundary whose windows are ready",
        "prover",
    ),
    Clause(
        "C5",
        "EAGLE",
        "W + 1 ready chunks; peek looked up, not loaded; one pop per boundary",
        "prover",
    ),
    Clause(
        "C6", "convergence", "final N satisfies C2 at N; maxhit never grows; terminates", "prover"
    ),
    Clause(
        "C7",
        "supply covers demand",
        "every chunk a reachable boundary demands is offered",
        "prover",
    ),
    Clause(
        "C8",
        "store economy",
        "nothing stored that no reachable boundary demands; no double offer",
        "prover",
    ),
    Clause(
        "C9",
        "store horizon",
        "no final tail at intermediate frontiers; finish/abort recompute it",
        "prover",
    ),
    Clause(
        "C10",
        "well-formed stores",
        "no null/stale block, no uncommitted slot in a stored chunk",
        "prover",
    ),
    Clause(
        "C11",
        "data integrity",
        "loaded bytes equal the producer's; decode step matches recompute",
        "system",
    ),
    Clause(
        "C12",
        "no lost hits",
        "a consumer of an ended producer gets the promised hit, end to end",
        "prover",
    ),
)


CLAUSE_IMPACT: dict[str, Impact] = {
    "C1": Impact.CORRUPTION,  # a position the model attends is not retained
    "C2": Impact.CRASH,  # "not found in cache" / "not ready for reading" at load
    "C3": Impact.DELAY,  # the request waits for a store it does not need
    "C4": Impact.LOST_HIT,  # a servable prefix is recomputed
    "C5": Impact.LOST_HIT,  # an EAGLE hit one chunk short, or a chunk popped twice
    "C6": Impact.CRASH,  # the final hit reads a chunk only an earlier candidate checked
    "C7": Impact.LOST_HIT,  # a demanded chunk was never stored
    "C8": Impact.WASTE,  # stored, never demanded (CPU memory, PCIe bandwidth)
    "C9": Impact.WASTE,  # intermediate tails (a missing final tail is a lost hit)
    "C10": Impact.CORRUPTION,  # a stored chunk holds freed or uncommitted slots
    "C11": Impact.CORRUPTION,  # loaded bytes differ from the producer's
    "C12": Impact.LOST_HIT,  # a consumer recomputes a prefix the producer owed it
}
"""The default impact of each clause's findings."""


def clause_ids() -> list[str]:
    return [c.id for c in CLAUSES]


def get_clause(clause_id: str) -> Clause:
    normalized = clause_id.strip().upper()
    for clause in CLAUSES:
        if clause.id == normalized:
            return clause
    raise UnknownClauseError(clause_id, clause_ids())
