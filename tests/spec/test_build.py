"""The geometry builder follows vLLM 0.33.0's KV-cache planning (issue #9, item 1)."""

from __future__ import annotations

import pytest

from kvcontract.errors import GeometryError
from kvcontract.spec.build import (
    CacheLayers,
    ModelSpec,
    Speculator,
    blocks_per_chunk_for,
    build_geometry,
    buildable,
    draft_groups,
    extra_retained_tokens,
    hybrid_base_block_size,
    sliding_window_block_size,
    split_into_groups,
)
from kvcontract.spec.geometry import Geometry, GroupKind, fa, mamba, swa
from kvcontract.spec.models import get_preset, list_presets


def _model(*layers: CacheLayers) -> ModelSpec:
    return ModelSpec("test", layers)


SWA_FA = _model(
    CacheLayers("sliding", GroupKind.SLIDING_WINDOW, 12, sliding_window=128),
    CacheLayers("full", GroupKind.FULL, 12),
)
EAGLE3 = Speculator("EAGLE-3", "eagle3", {"full": 1})


# -- the rules one by one -------------------------------------------------------------------
def test_extra_retained_tokens_only_for_multi_module_mtp() -> None:
    assert extra_retained_tokens(None, 0, 1) == 0
    assert extra_retained_tokens("eagle3", 3, 1) == 0  # lookahead 1: e = 0
    assert extra_retained_tokens("mtp", 3, 1) == 0  # one module: not multi-module
    assert extra_retained_tokens("mtp", 1, 4) == 0
    assert extra_retained_tokens("mtp", 4, 4) == 3
    assert extra_retained_tokens("mtp", 3, 2) == 2  # min(modules, k) > 1 is enough


def test_hybrid_base_block_size() -> None:
    # Qwen3-Next at TP 1: Mamba page 1097728 B, attention 2048 B/token.
    assert hybrid_base_block_size(16, 16, 2048, 1097728, None) == 544
    assert hybrid_base_block_size(16, 16, 2048, 1097728, 64) == 576
    # A larger --block-size is kept when it already covers the Mamba page.
    assert hybrid_base_block_size(1024, 16, 2048, 1097728, None) == 1024


def test_sliding_window_block_is_the_base_block() -> None:
    assert sliding_window_block_size(16, 16) == 16
    assert sliding_window_block_size(64, 16) == 64
    assert sliding_window_block_size(8, 16) == 16


def test_group_split_and_eagle_groups() -> None:
    assert split_into_groups([12, 13]) == [1, 1]  # gpt-oss-20b + EAGLE: (13 sw, 13 full)
    assert split_into_groups([40, 8]) == [5, 1]  # Gemma 3 12B
    assert split_into_groups([24, 8]) == [3, 1]  # Command R7B
    assert draft_groups(12, 1, 1) == [True]
    assert draft_groups(40, 1, 5) == [True, False, False, False, False]  # layer 40 -> group 0
    assert draft_groups(8, 0, 1) == [False]


def test_offloaded_block_size() -> None:
    assert blocks_per_chunk_for([16, 16], 64) == 4
    with pytest.raises(GeometryError, match="multiple of the GPU block size 16"):
        blocks_per_chunk_for([16], 40)
    with pytest.raises(GeometryError, match="different block sizes"):
        blocks_per_chunk_for([16, 64], 64)


# -- whole builds ---------------------------------------------------------------------------
def test_swa_fa_model_uses_the_base_block() -> None:
    g = build_geometry(SWA_FA, blocks_per_chunk=4)
    assert g == Geometry((swa(16, 128), fa(16)), blocks_per_chunk=4, retention_interval=0)
    g = build_geometry(SWA_FA, base_block_size=32)
    assert [x.block_size for x in g.groups] == [32, 32]


def test_unequal_pages_scale_by_integer_ratios_or_pad() -> None:
    model = _model(
        CacheLayers("sliding", GroupKind.SLIDING_WINDOW, 4, sliding_window=64,
                    bytes_per_token=512),
        CacheLayers("full", GroupKind.FULL, 4, bytes_per_token=2048),
    )
    g = build_geometry(model)
    assert [x.block_size for x in g.groups] == [64, 16]  # SWA page x4 -> block x4
    padded = _model(
        CacheLayers("sliding", GroupKind.SLIDING_WINDOW, 4, sliding_window=64,
                    bytes_per_token=768),
        CacheLayers("full", GroupKind.FULL, 4, bytes_per_token=2048),
    )
    assert [x.block_size for x in build_geometry(padded).groups] == [16, 16]


def test_eagle_drafter_marks_the_group_holding_its_layer() -> None:
    g = build_geometry(SWA_FA, drafter=EAGLE3)
    assert [(x.kind, x.eagle, x.extra_retained_tokens) for x in g.groups] == [
        (GroupKind.SLIDING_WINDOW, False, 0),
        (GroupKind.FULL, True, 0),
    ]
    assert g.extra["group_counts"] == [1, 1]


def test_split_bucket_has_one_eagle_group() -> None:
    model = _model(
        CacheLayers("sliding", GroupKind.SLIDING_WINDOW, 40, sliding_window=1024),
        CacheLayers("full", GroupKind.FULL, 8),
    )
    g = build_geometry(model, drafter=Speculator("d", "eagle", {"sliding": 1}))
    # 41 sliding layers: cdiv(41, 8) = 6 groups; the draft layer (index 40) lands in
    # group 40 % 6 = 4, the only EAGLE one.
    assert [(x.kind, x.eagle) for x in g.groups] == [
        (GroupKind.SLIDING_WINDOW, False),
        (GroupKind.SLIDING_WINDOW, True),
        (GroupKind.FULL, False),
    ]
    assert g.extra["group_counts"] == [5, 1, 1]


def test_mamba_align_mode() -> None:
    g = get_preset("qwen3-next-80b").geometry()
    assert [(x.kind, x.block_size) for x in g.groups] == [
        (GroupKind.MAMBA, 576), (GroupKind.FULL, 576),
    ]
    assert g.extra["base_block_size"] == 576
    assert g.extra["group_counts"] == [3, 1]
    assert buildable(g)[0]


def test_cohere2_window_is_4097() -> None:
    g = get_preset("command-r7b").geometry()
    assert [x.sliding_window for x in g.groups if x.is_swa] == [4097]
    assert g.extra["group_counts"] == [3, 1]


def test_mtp_sets_e_and_eagle() -> None:
    preset = get_preset("deepseek-v4-like-mtp")
    g = preset.geometry()
    swa_groups = [x for x in g.groups if x.is_swa]
    assert {x.extra_retained_tokens for x in swa_groups} == {3}
    assert [x.block_size for x in swa_groups if x.eagle] == [64]
    assert not any(x.eagle for x in g.groups if not x.is_swa)
    plain = get_preset("deepseek-v4-like").geometry()
    assert not any(x.eagle or x.extra_retained_tokens for x in plain.groups)


@pytest.mark.parametrize("name", list_presets())
def test_every_preset_block_is_a_multiple_of_the_base(name: str) -> None:
    preset = get_preset(name)
    g = preset.geometry()
    base = g.extra["base_block_size"]
    fixed = {k.block_size for k in preset.model.layers if k.block_size is not None}
    for group in g.groups:
        if group.block_size not in fixed:
            assert group.block_size % base == 0, (name, group.describe())


def test_dcp_and_retention() -> None:
    g = build_geometry(SWA_FA, dcp=2, retention_interval=64, blocks_per_chunk=2)
    assert (g.dcp, g.retention_interval) == (2, 64)
    assert buildable(g)[0]
    assert build_geometry(SWA_FA, retention_interval=None).retention_interval is None


# -- impossible requests ----------------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "field", "words"),
    [
        ({"base_block_size": 0}, "base_block_size", ">= 1"),
        ({"base_block_size": 24}, "base_block_size", "kernel block alignment 16"),
        ({"blocks_per_chunk": 0}, "blocks_per_chunk", ">= 1"),
        ({"dcp": 0}, "dcp", ">= 1"),
        ({"retention_interval": -16}, "retention_interval", ">= 0"),
        ({"retention_interval": 24}, "retention_interval", "scheduler block size 16"),
        ({"retention_interval": 16, "blocks_per_chunk": 2}, "retention_interval", "tpc 32"),
        ({"mtp_tokens": 2}, "mtp_tokens", "no MTP modules"),
        ({"mtp_tokens": 1, "drafter": EAGLE3}, "mtp_tokens", "one speculative config"),
        ({"offloaded_block_size": 40}, "offloaded_block_size", "multiple of the GPU block"),
        ({"offloaded_block_size": 64, "blocks_per_chunk": 2}, "offloaded_block_size", "not both"),
        ({"drafter": Speculator("d", "eagle", {"nope": 1})}, "drafter.joins", "no cache layer"),
    ],
)
def test_impossible_requests_name_field_and_rule(
    kwargs: dict[str, object], field: str, words: str
) -> None:
    with pytest.raises(GeometryError, match=words) as info:
        build_geometry(SWA_FA, **kwargs)
    assert info.value.field == field
    assert "invalid geometry" in str(info.value)


def test_impossible_model_requests() -> None:
    full_only = _model(CacheLayers("full", GroupKind.FULL, 4))
    with pytest.raises(GeometryError, match="sliding-window or Mamba group") as info:
        build_geometry(full_only, retention_interval=64)
    assert info.value.field == "retention_interval"
    with pytest.raises(GeometryError, match="Mamba blocks by DCP") as info:
        build_geometry(get_preset("qwen3-next-80b").model, dcp=2)
    assert info.value.field == "dcp"
    with pytest.raises(GeometryError, match="EAGLE-style methods"):
        Speculator("d", "draft_model")
    with pytest.raises(GeometryError, match="state page size"):
        CacheLayers("m", GroupKind.MAMBA, 4)
    with pytest.raises(GeometryError, match="needs the HF config's window"):
        CacheLayers("s", GroupKind.SLIDING_WINDOW, 4)


# -- buildable ------------------------------------------------------------------------------
def test_fa_528_with_swa_32_is_not_buildable() -> None:
    ok, reason = buildable(Geometry((fa(528), swa(32, 2)), blocks_per_chunk=2))
    assert not ok
    assert "528" in reason and "multiple of the smallest block size 32" in reason
    assert "unify_kv_cache_spec_page_size" in reason


@pytest.mark.parametrize(
    ("geometry", "words"),
    [
        (Geometry((fa(12), swa(8, 9))), "not an integer multiple"),
        (Geometry((fa(8), swa(4, 12, 2), mamba(8)), blocks_per_chunk=2), "Mamba group"),
        (Geometry((swa(16, 17, 1), mamba(16)), dcp=2), "DCP"),
        (Geometry((fa(16), swa(16, 32, 1), swa(16, 64, 0))), "different e"),
        (Geometry((swa(16, 32),), hash_block_size=8), "single group"),
        (Geometry((fa(16),), retention_interval=16), "sliding-window or Mamba"),
        (Geometry((fa(16), swa(32, 64)), retention_interval=32, blocks_per_chunk=2), "tpc 64"),
    ],
)
def test_not_buildable_reasons(geometry: Geometry, words: str) -> None:
    ok, reason = buildable(geometry)
    assert not ok
    assert words in reason


def test_buildable_examples() -> None:
    assert buildable(Geometry((fa(256), swa(64, 128), swa(8, 128)), blocks_per_chunk=4))[0]
    assert buildable(Geometry((fa(16), swa(16, 4097))))[0]
    assert buildable(Geometry((mamba(576), fa(576))))[0]
