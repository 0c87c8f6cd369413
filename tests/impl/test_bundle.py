"""kvcontract.impl.bundle: the Implementation bundle's shape."""

from __future__ import annotations

import dataclasses

import pytest

from kvcontract.impl.bundle import Implementation
from kvcontract.impl.variants import REFERENCE

FUNCTIONS = (
    "get_num_skipped_tokens", "retained_block_range", "load_chunk_range",
    "get_sliding_window_size_in_chunks", "load_window_size_in_chunks",
    "sliding_window_lookup", "prefix_lookup", "is_block_reachable", "store_final_segment_end",
    "store_replay_boundaries",
)
STORE_STEP = ("get_num_offloadable_tokens", "store_step_bounds", "store_chunk_offered")
"""The store step's decisions: optional, the reference's by default."""
DEADLINE = ("deferral_clock", "deferral_expired")
"""The deferral deadline's rule (C13): optional, the reference's by default."""
FAILED_TRANSFER = ("store_job_published",)
"""What a failed store job publishes (C14): optional, the reference's by default."""
HASH_MODE = ("lookup_drops_eagle_block", "store_drops_eagle_block", "keyed_tokens")
"""Whether the lookup and the store path drop an EAGLE group's trailing block per hash
mode, and the tokens a request's keys cover (docs/CONTRACT.md 2.1): optional, the
reference's by default."""
PLACEMENT = ("store_block_slot",)
"""Where a stored block lands in its CPU chunk (C10): optional, the reference's."""
MAMBA_RETENTION = ("mamba_first_live_block",)
"""The first block a Mamba group keeps (C1): optional, the reference's."""
JUNCTION = ("shared_prefix_junction",)
"""The shared-prefix junction a cut request registers (C12, docs/CONTRACT.md 9.3):
optional, the reference's."""
OPTIONAL = (*STORE_STEP, "multigroup_lookup_step", "initial_lookup_cap", *DEADLINE,
            *FAILED_TRANSFER, *PLACEMENT, *HASH_MODE, *MAMBA_RETENTION, *JUNCTION)
"""Every function with a default (the reference's): the store step's decisions, one
group's turn of the multi-group lookup, the deferral deadline and what a failed store
publishes."""


def _bundle(**change: object) -> Implementation:
    functions = {name: (lambda *a, name=name: name) for name in FUNCTIONS}
    return Implementation(name="toy", description="toy bundle",
                          **{**functions, **change})  # type: ignore[arg-type]


def test_fields() -> None:
    names = [f.name for f in dataclasses.fields(Implementation)]
    assert names == ["name", "description", *FUNCTIONS, "violates", "notes", *OPTIONAL]


def test_defaults() -> None:
    first, second = _bundle(), _bundle()
    assert first.violates == () and first.notes == {}
    assert first.notes is not second.notes  # no shared mutable default
    assert first.load_chunk_range() == "load_chunk_range"
    assert all(getattr(first, name) is getattr(REFERENCE, name) for name in OPTIONAL)


def test_frozen_and_replaced() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        REFERENCE.name = "other"  # type: ignore[misc]
    changed = dataclasses.replace(REFERENCE, name="x", prefix_lookup=len)
    assert changed.prefix_lookup is len
    assert changed.load_chunk_range is REFERENCE.load_chunk_range
    assert REFERENCE.name == "reference"


def test_every_function_is_required() -> None:
    with pytest.raises(TypeError):
        Implementation(name="x", description="y")  # type: ignore[call-arg]
