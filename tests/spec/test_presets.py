"""Model presets: data files with sources, geometries at bpc 1/4/16, `list --models`
(issue #9, item 2)."""

from __future__ import annotations

import json
from importlib import resources

import pytest
from click.testing import CliRunner

from kvcontract.errors import UsageError
from kvcontract.spec.build import buildable
from kvcontract.spec.geometry import Geometry, GroupKind
from kvcontract.spec.models import (
    PRESET_BLOCKS_PER_CHUNK,
    get_preset,
    list_presets,
    preset_geometries,
)
from kvcontract.tools.commands.list import list_command

PRESETS = list_presets()

REQUIRED = {
    "gpt-oss-20b", "gpt-oss-20b-eagle3", "gpt-oss-120b", "gpt-oss-120b-eagle3",
    "gemma-2-9b", "gemma-3-12b", "command-r7b", "mistral-7b-v0.1", "phi-3-mini-4k",
    "qwen3-next-80b", "deepseek-v4-like", "deepseek-v4-like-mtp",
}


def test_the_issue_presets_exist() -> None:
    assert set(PRESETS) >= REQUIRED


@pytest.mark.parametrize("name", PRESETS)
def test_preset_file_parses_and_cites_sources(name: str) -> None:
    entry = resources.files("kvcontract.spec").joinpath("presets", f"{name}.json")
    data = json.loads(entry.read_text(encoding="utf-8"))
    assert data["name"] == name
    preset = get_preset(name)
    assert preset.sources and all(isinstance(s, str) and s for s in preset.sources)
    # Every preset cites vLLM's code (with the version read) and the HF config.
    assert any("vLLM 0.33.0" in s and "vllm/" in s for s in preset.sources)
    assert any("HF config" in s or "config field" in s for s in preset.sources)


@pytest.mark.parametrize("name", PRESETS)
def test_preset_geometries_at_each_bpc_are_buildable(name: str) -> None:
    geometries = preset_geometries(name)
    assert [label for label, _ in geometries] == [
        f"{name} bpc={bpc}" for bpc in PRESET_BLOCKS_PER_CHUNK
    ]
    for (_, geometry), bpc in zip(geometries, PRESET_BLOCKS_PER_CHUNK, strict=True):
        assert isinstance(geometry, Geometry)
        assert geometry.blocks_per_chunk == bpc
        assert geometry.retention_interval == 0
        assert geometry.has_swa or any(g.kind is GroupKind.MAMBA for g in geometry.groups)
        ok, reason = buildable(geometry)
        assert ok, reason
        # A round trip through the geometry's JSON keeps it.
        assert Geometry.from_dict(geometry.to_dict()) == geometry


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("gpt-oss-20b", "SWA(bs=16, sw=128) + FA(bs=16); bpc=1; retention=0"),
        ("gpt-oss-120b-eagle3", "SWA(bs=16, sw=128) + FA(bs=16, eagle); bpc=1; retention=0"),
        ("gemma-2-9b", "SWA(bs=16, sw=4096) + FA(bs=16); bpc=1; retention=0"),
        ("gemma-3-12b", "SWA(bs=16, sw=1024) + FA(bs=16); bpc=1; retention=0"),
        ("command-r7b", "SWA(bs=16, sw=4097) + FA(bs=16); bpc=1; retention=0"),
        ("mistral-7b-v0.1", "SWA(bs=16, sw=4096); bpc=1; retention=0"),
        ("phi-3-mini-4k", "SWA(bs=16, sw=2047); bpc=1; retention=0"),
        ("qwen3-next-80b", "Mamba(bs=576) + FA(bs=576); bpc=1; retention=0"),
    ],
)
def test_preset_geometry_numbers(name: str, expected: str) -> None:
    assert preset_geometries(name)[0][1].describe() == expected


def test_gemma3_is_five_local_to_one_global() -> None:
    assert get_preset("gemma-3-12b").geometry().extra["group_counts"] == [5, 1]


def test_eagle3_variant_inherits_its_base() -> None:
    base, variant = get_preset("gpt-oss-20b"), get_preset("gpt-oss-20b-eagle3")
    assert variant.variant_of == "gpt-oss-20b"
    assert variant.model.layers == base.model.layers
    assert variant.drafter is not None and variant.drafter.method == "eagle3"
    assert set(base.sources) < set(variant.sources)


def test_unknown_preset_lists_the_names() -> None:
    with pytest.raises(UsageError, match="unknown model preset 'llama-9000'") as info:
        get_preset("llama-9000")
    for name in PRESETS:
        assert name in str(info.value)


def test_list_models_prints_every_preset() -> None:
    result = CliRunner().invoke(list_command, ["--models"], terminal_width=200)
    assert result.exit_code == 0, result.output
    out = result.output
    for name in PRESETS:
        assert name in out
    assert "4097" in out and "576" in out and "2047" in out
    assert "commandr.py" in out  # the sources are printed
    assert "clauses and theorems" not in out


def test_list_without_flag_is_unchanged() -> None:
    result = CliRunner().invoke(list_command, [], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert "clauses and theorems" in result.output
    assert "implementations (--impl)" in result.output
    assert "model presets" not in result.output
