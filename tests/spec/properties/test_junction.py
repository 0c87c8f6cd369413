"""Shared-prefix junctions (docs/CONTRACT.md 9.3): a first consumer whose hit a sparse
group cut below the full-attention boundary stores for that boundary, and a later
consumer sharing the prefix through it is owed it (C12)."""

from __future__ import annotations

from kvcontract.impl.variants import REFERENCE, VARIANTS
from kvcontract.spec.geometry import Geometry, fa, swa
from kvcontract.spec.properties.end_to_end import (
    Consumer,
    EndToEndCase,
    consumers,
    first_consumer,
    junction_registered,
    no_lost_hit,
    promise,
    run_end_to_end,
    spec_junction,
)
from kvcontract.spec.properties.store import StoreCase
from kvcontract.vocabulary import Impact

RETENTION0 = Geometry((fa(16), swa(4, 8)), retention_interval=0)
VARIANT = VARIANTS["no-shared-prefix-junction"]


def _case(geometry: Geometry, prompt: int = 53, shared: int = 40) -> EndToEndCase:
    producer = StoreCase("test", geometry, prompt, (prompt,), "finished", decode=3)
    return EndToEndCase(producer, Consumer("junction", shared + 3, shared))


def test_the_cut_first_consumer_registers_the_full_attention_boundary() -> None:
    case = _case(RETENTION0)
    first = first_consumer(case)
    assert (first.num_tokens, first.shared_tokens) == (59, 40)
    # the producer's window is stored at its replay boundary 48 only: the first
    # consumer's hit is cut to 0 below the full-attention boundary 32
    assert spec_junction(case.geometry, case.producer, first) == 32
    assert promise(case) == 32


def test_the_reference_serves_the_junction_and_the_variant_loses_it() -> None:
    case = _case(RETENTION0)
    assert run_end_to_end(case, REFERENCE).hit_tokens == 32
    assert no_lost_hit(case, run_end_to_end(case, REFERENCE)) is None
    observation = run_end_to_end(case, VARIANT)
    assert observation.hit_tokens == 0
    assert "32 tokens lost" in str(no_lost_hit(case, observation))


def test_no_junction_without_a_retention_interval() -> None:
    dense = Geometry((fa(16), swa(4, 8)))
    case = _case(dense)
    assert spec_junction(dense, case.producer, first_consumer(case)) == 0
    assert not any(c.kind == "junction" for c in consumers(case.producer))
    assert REFERENCE.shared_prefix_junction(32, 0, 0, None) == 0


def test_no_junction_when_the_hit_reaches_the_full_attention_boundary() -> None:
    assert REFERENCE.shared_prefix_junction(32, 0, 32, 0) == 0
    assert REFERENCE.shared_prefix_junction(32, 16, 0, 32) == 32


def test_junction_consumers_are_enumerated_where_the_spec_cuts() -> None:
    producer = StoreCase("test", RETENTION0, 53, (53,), "finished", decode=3)
    found = [c for c in consumers(producer) if c.kind == "junction"]
    # One token past a multiple of A, and one sparse chunk past it (the sparse keys
    # reach past the full-attention boundary there).
    assert {c.shared_tokens % 16 for c in found} == {1, 4}
    for consumer in found:
        case = EndToEndCase(producer, consumer)
        assert spec_junction(RETENTION0, producer, first_consumer(case)) > 0
        observed = run_end_to_end(case, REFERENCE)
        assert no_lost_hit(case, observed) is None
        assert observed.junction == spec_junction(RETENTION0, producer, first_consumer(case))
        assert junction_registered(case, observed) is None


def test_a_junction_taken_from_the_sparse_keys_is_refuted() -> None:
    """The first consumer shares 20 tokens: its full-attention group (16-token chunks)
    serves 16, its SWA keys reach 20. A junction at 20 holds and stores sparse history
    for a boundary no full-attention chunk serves (waste); none loses the later hit."""
    import dataclasses

    producer = StoreCase("test", RETENTION0, 53, (53,), "finished", decode=3)
    case = next(EndToEndCase(producer, c) for c in consumers(producer)
                if c.kind == "junction" and c.shared_tokens == 20)
    observed = run_end_to_end(case, REFERENCE)
    assert observed.junction == 16
    wider = junction_registered(case, dataclasses.replace(observed, junction=20))
    assert wider is not None and wider.impact is Impact.WASTE and "junction 20" in wider
    none = junction_registered(case, dataclasses.replace(observed, junction=0))
    assert none is not None and none.impact is Impact.LOST_HIT
