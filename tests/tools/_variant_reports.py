"""Prove reports of the historic variants for the report, reproducer and picture tests.

Proving a whole clause for a variant takes up to a minute on two cores, so the reports
are built once per session from the few theorems each historic variant violates (plus
one that it passes), through the same
:func:`~kvcontract.proofs.theorem.run_property` the prover uses.
"""

from __future__ import annotations

from typing import Any

from kvcontract.impl.variants import get_implementation
from kvcontract.proofs.runner import ProveReport, catalog
from kvcontract.proofs.theorem import run_property

VARIANT_THEOREMS: dict[str, tuple[str, ...]] = {
    "stale-pending": ("C3/scan-defers-only-in-scope", "C3/lookup-defers-only-in-scope"),
    "unaligned-hit": ("C2/first-run-covers-load", "C2/later-run-covers-load"),
    "mtp-extra-retained": (
        "C2/first-run-covers-load", "C2/later-run-covers-load", "C2/lookup-loads-only-hit",
        "C7/segment-boundaries-supplied[plain-none]", "C7/final-boundary-supplied[none]",
        "C7/replay-boundary-supplied[plain-zero]",
    ),
    "prefill-horizon": ("C8/stores-only-demanded", "C9/store-horizon", "C10/stores-well-formed"),
    "upstream-current": ("C4/load-window-exact", "C4/window-exact"),
}
"""Theorems per variant: each variant fails at least one (see impl/variants.py)."""

SLOW_THEOREMS: dict[str, tuple[str, ...]] = {
    "upstream-current": ("C4/lookup-is-maximal",),
}
"""Counterexamples that take tens of seconds to find (used by slow tests only)."""


def build_report(target: str, theorem_ids: tuple[str, ...]) -> dict[str, Any]:
    """A versioned prove report for a few theorems (what `prove --json` writes)."""
    impl = get_implementation(target)
    by_id = {t.theorem_id: t for t in catalog()}
    results = [run_property(by_id[tid], impl) for tid in theorem_ids]
    clauses = sorted({r.clause for r in results}, key=lambda c: int(c[1:]))
    report = ProveReport(target=target, results=results, seconds=0.0, clauses=clauses)
    return dict(report.to_json())
