"""``--shard I/N``: a deterministic partition of a run's work list across machines.

A GitHub Actions matrix runs ``kvcontract prove --shard 1/3`` ... ``3/3`` on three
runners and ``kvcontract merge`` joins their reports into the unsharded run's report.
Every shard must compute the same partition without talking to the others, so the
partition depends only on the work list and a static cost per unit (formula
configurations, family cases, scenario sizes), never on timings, which differ per
machine and per run. ``prove``, ``fuzz`` and ``audit`` use it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kvcontract.errors import UsageError

MAX_SHARDS = 1024
"""The most shards a run may be split into (a typo guard: the catalogue has fewer
theorems, and an empty shard is allowed but pointless)."""


@dataclass(frozen=True)
class Shard:
    """Shard ``index`` (1-based) of ``count``."""

    index: int
    count: int

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


def parse_shard(text: str | None, option: str = "--shard") -> Shard | None:
    """``I/N`` with ``1 <= I <= N <= MAX_SHARDS``; None when not given."""
    if text is None:
        return None
    parts = str(text).strip().split("/")
    if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
        raise UsageError(f"{option} takes I/N (this machine's shard I of N, 1-based), "
                         f"for example {option} 2/3; not {text!r}")
    index, count = (int(p) for p in parts)
    if count < 1 or count > MAX_SHARDS:
        raise UsageError(f"{option} {text}: N must be between 1 and {MAX_SHARDS}")
    if index < 1 or index > count:
        raise UsageError(f"{option} {text}: I must be between 1 and N={count} (shards "
                         "are numbered from 1)")
    return Shard(index, count)


def partition(costs: Sequence[float], count: int) -> list[list[int]]:
    """Indices of ``costs`` in ``count`` groups of similar total cost (greedy: the
    costliest unit first, each to the lightest group, ties by position), each group
    in ascending index order. Deterministic: the same costs give the same groups."""
    groups: list[list[int]] = [[] for _ in range(count)]
    totals = [0.0] * count
    for unit in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        lightest = min(range(count), key=lambda g: (totals[g], g))
        groups[lightest].append(unit)
        totals[lightest] += costs[unit]
    return [sorted(group) for group in groups]


def selection_digest(ids: Sequence[str], extra: Any = None) -> str:
    """Identifies the unsharded work list (and whatever else must agree, ``extra``):
    ``kvcontract merge`` refuses shards cut from different lists."""
    text = json.dumps([list(ids), extra], sort_keys=True, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def shard_section(shard: Shard, positions: Sequence[int], total: int, selection: str,
                  **extra: Any) -> dict[str, Any]:
    """The report's ``shard`` object: which shard, which positions of the unsharded
    work list it ran (what :mod:`kvcontract.tools.reports.merge` puts back in order)."""
    import importlib.metadata

    try:
        version = importlib.metadata.version("kvcontract")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    return {"index": shard.index, "count": shard.count, "total": total,
            "positions": list(positions), "selection": selection,
            "kvcontract_version": version, **extra}
