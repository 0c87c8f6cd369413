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
    Under legacy block hashes an unverified EAGLE group needs W + 1 ready chunks; the
    peek chunk is looked up but not loaded; pops happen once per boundary. Under
    lookahead block hashes an EAGLE group drops nothing: W ready chunks, no peek, no pop.
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

C13 bounded deferral
    Every deferral of a lookup names its cause (a RETRY, a pending chunk in the window it
    would use, a chunk another request is loading, the request's own transfers); once
    the stores it waited on have ended the next lookup does not wait on them; a request
    first deferred at step ``s`` is decided (recompute, or the hit its ready chunks
    serve) by step ``s + D`` (``spec.lifecycle.DEFAULT_DEFERRAL_BOUND``).
C14 lifecycle safety
    Abort at every point, preemption, re-admission and prefix-cache reset raise
    nothing; requests move only as ``spec.lifecycle.TRANSITIONS`` allows; every job
    ends exactly once; no chunk stays pending, no request or key loading; nothing is
    stored from a freed or reused block or past the tokens an ended request computed; a
    failed transfer raises nothing and a failed store publishes nothing (no later hit
    reads its chunks unless a later store of them completed).
C15 load-failure recovery
    A failed or cancelled load leaves the request resuming at a boundary whose needed
    KV is on the GPU in every group (an SWA group: the whole window of the new
    boundary), with no reference or loading count left for the failed chunks and no
    later hit loading them again unchanged: a failed load is never retried (no later
    lookup of the request loads the failed chunks again or waits on them).

Reachable boundaries (C7, C8): the A-aligned boundaries up to the store horizon, the
replay boundaries of a retention interval, and the final horizon of a finished or
aborted request. This is the set upstream's mask is built for; docs/CONTRACT.md section 13
states it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from kvcontract.errors import KvContractError, UnknownClauseError
from kvcontract.vocabulary import Impact

CHECKERS = ("prover", "system")
"""What may check a clause (``Clause.proved_by``)."""


class CatalogueError(KvContractError):
    """A catalogue entry (a clause, or a property of :mod:`kvcontract.spec.properties`)
    that breaks a rule of the catalogue: raised when the catalogue is built, naming the
    entry and what it lacks, so a clause cannot be added half-declared."""


@dataclass(frozen=True)
class Clause:
    """One clause: everything the tools need about it is declared here, once."""

    id: str
    """``C<n>``, numbered in catalogue order from C1."""
    title: str
    statement: str
    """One line; the docstring above and docs/CONTRACT.md section 9 state it in full."""
    proved_by: str
    """``prover`` (theorems of the property catalogue decide it) or ``system`` (checked by
    executing the tensor-backed system, as C11)."""
    impact: Impact
    """What a violation of the clause costs a user, unless the finding says more precisely
    (a property may give each violation its own impact)."""

    def __post_init__(self) -> None:
        if not re.fullmatch(r"C[1-9][0-9]*", str(self.id)):
            raise CatalogueError(f"clause id {self.id!r} is not of the form C<n> (C1, C2, ...)")
        if not self.title or not self.statement:
            raise CatalogueError(f"clause {self.id} needs a title and a one-line statement")
        if self.proved_by not in CHECKERS:
            raise CatalogueError(
                f"clause {self.id}: proved_by={self.proved_by!r}; say what checks it: "
                + " or ".join(CHECKERS))
        if not isinstance(self.impact, Impact):
            raise CatalogueError(
                f"clause {self.id}: impact={self.impact!r} is not a "
                "kvcontract.vocabulary.Impact (what a violation costs a user)")


def validated(clauses: Iterable[Clause]) -> tuple[Clause, ...]:
    """The clauses, checked to be numbered C1, C2, ... in order (``get_clause`` and the
    documents' stated range rely on it); a gap or a duplicate names the entry."""
    checked = tuple(clauses)
    for position, clause in enumerate(checked, start=1):
        if clause.id != f"C{position}":
            raise CatalogueError(
                f"clause {clause.id} is entry {position} of CLAUSES: the clauses are "
                f"numbered C1, C2, ... in order (expected C{position})")
    return checked


# Each entry's impact: what a violation costs a user (the comment says why).
CLAUSES: tuple[Clause, ...] = validated((
    Clause("C1", "retention", "live SWA blocks after allocating N after L are Ret(N)", "prover",
           Impact.CORRUPTION),  # a position the model attends is not retained
    Clause("C2", "load safety", "every chunk of every load set was answered HIT", "prover",
           Impact.CRASH),  # "not found in cache" / "not ready for reading" at load
    Clause("C3", "readiness scope", "defer only for RETRY or pending inside the used window",
           "prover", Impact.DELAY),  # the request waits for a store it does not need
    Clause("C4", "maximality", "the accepted hit is the largest boundary whose windows are ready",
           "prover", Impact.LOST_HIT),  # a servable prefix is recomputed
    Clause("C5", "EAGLE", "legacy hashes: W + 1 ready chunks; peek looked up, not loaded; one "
           "pop per boundary; lookahead hashes: no peek, no pop",
           "prover", Impact.LOST_HIT),  # an EAGLE hit one chunk short, or a chunk popped twice
    Clause("C6", "convergence", "final N satisfies C2 at N; maxhit never grows; terminates",
           "prover", Impact.CRASH),  # the final hit reads a chunk only an earlier candidate checked
    Clause("C7", "supply covers demand", "every chunk a reachable boundary demands is offered",
           "prover", Impact.LOST_HIT),  # a demanded chunk was never stored
    Clause("C8", "store economy",
           "nothing stored that no reachable boundary demands; no double offer",
           "prover", Impact.WASTE),  # stored, never demanded (CPU memory, PCIe bandwidth)
    Clause("C9", "store horizon",
           "no final tail at intermediate frontiers; finish/abort recompute it",
           "prover", Impact.WASTE),  # intermediate tails (a missing final tail is a lost hit)
    Clause("C10", "well-formed stores",
           "no null/stale block, no uncommitted slot in a stored chunk",
           "prover", Impact.CORRUPTION),  # a stored chunk holds freed or uncommitted slots
    Clause("C11", "data integrity",
           "loaded bytes equal the producer's; decode step matches recompute",
           "system", Impact.CORRUPTION),  # loaded bytes differ from the producer's
    Clause("C12", "no lost hits",
           "a consumer of an ended producer gets the promised hit, end to end",
           "prover", Impact.LOST_HIT),  # a consumer recomputes a prefix the producer owed it
    Clause("C13", "bounded deferral",
           "a deferral names its cause and is decided within D steps of the first",
           "prover", Impact.STALL),  # the request waits until the client gives up
    Clause("C14", "lifecycle safety",
           "abort, preemption, reset at any point: no crash, jobs end once, no leak",
           "prover", Impact.CRASH),  # an engine-fatal assertion, or a chunk pending forever
    Clause("C15", "load-failure recovery",
           "a failed load resumes where every needed chunk is on the GPU",
           "prover", Impact.CORRUPTION),  # the request runs on missing KV
))


CLAUSE_IMPACT: dict[str, Impact] = {c.id: c.impact for c in CLAUSES}
"""The default impact of each clause's findings (``Clause.impact``, by id)."""


def clause_ids() -> list[str]:
    return [c.id for c in CLAUSES]


def clause_range() -> str:
    """The catalogue's range as the documents state it: the first and the last id joined
    by a hyphen (tests/test_docs.py holds every document to it)."""
    return f"{CLAUSES[0].id}-{CLAUSES[-1].id}"


def get_clause(clause_id: str) -> Clause:
    normalized = clause_id.strip().upper()
    for clause in CLAUSES:
        if clause.id == normalized:
            return clause
    raise UnknownClauseError(clause_id, clause_ids())
