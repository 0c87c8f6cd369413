"""kvcontract.spec.geometry: validation (each error names its field and rule), derived
sizes with DCP, alignment, descriptions and the dict round trip (docs/CONTRACT.md 2).

The six validation cases of tests/spec/test_formulas.py are not repeated here."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from kvcontract.errors import GeometryError, KvContractError
from kvcontract.spec.geometry import (
    Geometry,
    GroupKind,
    GroupSpec,
    fa,
    mamba,
    require_tokens,
    swa,
)


@pytest.mark.parametrize(
    ("build", "field", "value", "rule"),
    [
        (lambda: GroupSpec("linear", 4), "kind", "linear",
         "must be one of ['full', 'sliding_window', 'mamba']"),
        (lambda: fa(0), "block_size", 0, "must be >= 1"),
        (lambda: fa(True), "block_size", True, "must be an integer"),
        (lambda: fa(4.0), "block_size", 4.0, "must be an integer"),
        (lambda: GroupSpec(GroupKind.SLIDING_WINDOW, 4), "sliding_window", None,
         "a sliding-window group needs a window size"),
        (lambda: swa(4, 1), "sliding_window", 1, "must be >= 2"),
        (lambda: GroupSpec(GroupKind.FULL, 4, sliding_window=8), "sliding_window", 8,
         "only sliding-window groups have a window (this group is full)"),
        (lambda: GroupSpec(GroupKind.MAMBA, 4, sliding_window=8), "sliding_window", 8,
         "only sliding-window groups have a window (this group is mamba)"),
        (lambda: GroupSpec(GroupKind.FULL, 4, extra_retained_tokens=2),
         "extra_retained_tokens", 2, "only sliding-window groups retain extra tokens"),
        (lambda: Geometry((fa(4),), dcp=0), "dcp", 0, "must be >= 1"),
        (lambda: Geometry((fa(4),), blocks_per_chunk=False), "blocks_per_chunk", False,
         "must be an integer"),
        (lambda: Geometry((fa(16), swa(4, 8)), retention_interval=-16), "retention_interval",
         -16, "must be >= 0"),
        (lambda: Geometry((fa(16), swa(4, 8)), hash_block_size=0), "hash_block_size", 0,
         "must be >= 1"),
        (lambda: Geometry((fa(16), swa(4, 8)), hash_block_size=8), "groups[1].block_size", 4,
         "must be a multiple of the hash block size 8"),
    ],
)
def test_validation_names_field_value_and_rule(
    build: Callable[[], Any], field: str, value: object, rule: str
) -> None:
    with pytest.raises(GeometryError) as info:
        build()
    error = info.value
    assert (error.field, error.rule) == (field, rule)
    assert error.value == value and type(error.value) is type(value)
    assert str(error) == f"invalid geometry: {field}={value!r}: {rule}"
    assert isinstance(error, KvContractError)


def test_accepted_edge_cases() -> None:
    assert swa(4, 2).sliding_window == 2  # the smallest window
    assert Geometry((fa(16), swa(4, 8)), retention_interval=0).retention_interval == 0
    assert Geometry((fa(16), swa(4, 8)), retention_interval=48).retention_interval == 48
    # FA groups disagree: no alignment, so any interval is accepted.
    assert Geometry((fa(16), fa(32), swa(4, 8)), retention_interval=24).alignment_tokens is None
    assert GroupSpec("sliding_window", 4, 8).kind is GroupKind.SLIDING_WINDOW


def test_retention_must_be_a_multiple_of_the_scaled_alignment() -> None:
    # With bpc 2 the alignment is 32, so an interval of 48 is rejected.
    with pytest.raises(GeometryError, match="multiple of the store alignment A=32"):
        Geometry((fa(16), swa(4, 8)), blocks_per_chunk=2, retention_interval=48)


def test_hash_block_size_defaults_to_the_gcd() -> None:
    assert Geometry((fa(12), swa(8, 9))).hash_block_size == 4
    assert Geometry((fa(528), swa(32, 2))).hash_block_size == 16
    assert Geometry((swa(4, 8),)).hash_block_size == 4


def test_sizes_scale_with_dcp_and_bpc() -> None:
    geometry = Geometry((fa(16), swa(4, 8), mamba(8)), blocks_per_chunk=2, dcp=2)
    _, swa_group, mamba_group = geometry.groups
    assert geometry.block_tokens(swa_group) == 8
    assert geometry.chunk_tokens(swa_group) == 16
    assert geometry.chunk_tokens(mamba_group) == 32
    assert geometry.alignment_tokens == 64  # the FA tpc: 16 * 2 (dcp) * 2 (bpc)
    assert geometry.has_swa


def test_alignment_without_full_attention() -> None:
    assert Geometry((mamba(8), swa(4, 8)), blocks_per_chunk=2).alignment_tokens == 16
    assert Geometry((fa(16), fa(8, eagle=True), swa(4, 8))).alignment_tokens is None
    assert Geometry((fa(16), fa(16, eagle=True))).alignment_tokens == 16
    assert not Geometry((fa(16), mamba(8))).has_swa


def test_groups_become_a_tuple() -> None:
    geometry = Geometry([fa(4), swa(4, 8)])  # type: ignore[arg-type]
    assert geometry.groups == (fa(4), swa(4, 8))
    assert hash(geometry) == hash(Geometry((fa(4), swa(4, 8))))


def test_describe() -> None:
    assert swa(4, 8, 3, eagle=True).describe() == "SWA(bs=4, sw=8, e=3, eagle)"
    assert swa(4, 8).describe() == "SWA(bs=4, sw=8)"
    assert fa(16, eagle=True).describe() == "FA(bs=16, eagle)"
    assert mamba(8).describe() == "Mamba(bs=8)"
    assert Geometry((fa(16), swa(4, 8))).describe() == "FA(bs=16) + SWA(bs=4, sw=8); bpc=1"
    described = Geometry((fa(16), swa(4, 8)), blocks_per_chunk=2, retention_interval=0,
                         dcp=2).describe()
    assert described == "FA(bs=16) + SWA(bs=4, sw=8); bpc=2; retention=0; dcp=2"


def test_shorthands() -> None:
    assert fa(16) == GroupSpec(GroupKind.FULL, 16)
    assert swa(4, 8, 3, eagle=True) == GroupSpec(GroupKind.SLIDING_WINDOW, 4, 8, 3, True)
    assert mamba(8) == GroupSpec(GroupKind.MAMBA, 8)
    assert swa(4, 8).is_swa and not fa(4).is_swa and not mamba(4).is_swa


def test_dict_round_trip() -> None:
    geometry = Geometry((fa(16), swa(4, 8, 3, eagle=True), mamba(8)), blocks_per_chunk=2,
                        retention_interval=64, dcp=2)
    data = geometry.to_dict()
    assert data["groups"][1] == {"kind": "sliding_window", "block_size": 4,
                                 "sliding_window": 8, "extra_retained_tokens": 3,
                                 "eagle": True}
    assert data["hash_block_size"] == 4 and data["retention_interval"] == 64
    assert Geometry.from_dict(data) == geometry
    assert Geometry.from_dict(data).to_dict() == data


@pytest.mark.parametrize(
    "data",
    [
        {},
        {"groups": [{"kind": "full"}]},
        {"groups": [{"kind": "full", "block_size": 4, "color": "red"}]},
        {"groups": [{"kind": "full", "block_size": 4}], "speed": 3},
        {"groups": 4},
    ],
)
def test_from_dict_rejects_malformed_descriptions(data: dict[str, Any]) -> None:
    with pytest.raises(GeometryError) as info:
        Geometry.from_dict(data)
    assert info.value.field == "geometry"
    assert info.value.rule.startswith("malformed geometry description (")


def test_from_dict_validates_the_geometry() -> None:
    with pytest.raises(GeometryError) as info:
        Geometry.from_dict({"groups": [{"kind": "sliding_window", "block_size": 4,
                                        "sliding_window": 1}]})
    assert info.value.field == "sliding_window"


def test_require_tokens() -> None:
    assert require_tokens("tokens", 0) == 0
    assert require_tokens("tokens", 4353) == 4353
    with pytest.raises(GeometryError) as info:
        require_tokens("hit", -1)
    assert (info.value.field, info.value.rule) == ("hit", "token counts cannot be negative")
    for bad in (True, 3.5, "12"):
        with pytest.raises(GeometryError, match="must be an integer number of tokens"):
            require_tokens("tokens", bad)
