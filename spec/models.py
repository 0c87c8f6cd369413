"""Model presets: realistic geometries from the KV-cache layout of real models.

Each preset is one JSON file in ``spec/presets/`` (package data). It describes the
model's cache layer kinds as vLLM sees them (:class:`~kvcontract.spec.build.ModelSpec`),
an optional EAGLE drafter, the build settings, and ``sources``: the HF config fields
and the vLLM code each number comes from (and any assumption, marked ``ASSUMPTION``).
A file with ``variant_of`` takes every field of the named preset and replaces the ones
it gives (its ``sources`` are appended).

:func:`preset_geometries` builds each preset with :func:`~kvcontract.spec.build.build_geometry`
at ``bpc`` 1, 4 and 16 and the default retention interval 0. docs/CONTRACT.md section 11.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any

from kvcontract.errors import InputFileError, KvContractError, UsageError
from kvcontract.spec.build import CacheLayers, ModelSpec, Speculator, build_geometry
from kvcontract.spec.geometry import Geometry

PRESET_BLOCKS_PER_CHUNK = (1, 4, 16)
"""The ``bpc`` values every preset is built at."""

_BUILD_OPTIONS = ("base_block_size", "mtp_tokens")
_LAYER_FIELDS = (
    "name", "kind", "count", "sliding_window", "window_offset", "block_size",
    "bytes_per_token", "state_bytes",
)


@dataclass(frozen=True)
class Preset:
    """One model preset: the model, its drafter, the build settings, the sources."""

    name: str
    title: str
    hf_model: str
    architecture: str
    model: ModelSpec
    drafter: Speculator | None
    build: dict[str, int] = field(default_factory=dict)
    sources: tuple[str, ...] = ()
    variant_of: str | None = None
    lookahead_block_hashes: bool = False
    """Whether vLLM's default for this model keys blocks with the drafter's lookahead
    (docs/CONTRACT.md 2.1: 0.34.0 with an EAGLE-style drafter and the offloading
    connector); :meth:`geometry` builds the legacy mode unless asked."""

    def geometry(self, blocks_per_chunk: int = 1, **overrides: Any) -> Geometry:
        """The preset's geometry at ``blocks_per_chunk`` (other build settings overridable)."""
        options: dict[str, Any] = {**self.build, **overrides}
        geometry = build_geometry(
            self.model, blocks_per_chunk=blocks_per_chunk, drafter=self.drafter, **options
        )
        geometry.extra["preset"] = self.name
        return geometry


def _preset_files() -> dict[str, Any]:
    folder = resources.files("kvcontract.spec").joinpath("presets")
    return {
        entry.name[: -len(".json")]: entry
        for entry in folder.iterdir()
        if entry.name.endswith(".json")
    }


@cache
def _raw_presets() -> dict[str, dict[str, Any]]:
    raw: dict[str, dict[str, Any]] = {}
    for stem, entry in sorted(_preset_files().items()):
        path = f"spec/presets/{entry.name}"
        try:
            data = json.loads(entry.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise InputFileError(path, f"not a JSON preset ({exc})") from None
        if not isinstance(data, dict) or data.get("name") != stem:
            raise InputFileError(path, f"a preset object whose name is {stem!r}")
        raw[stem] = data
    return raw


def _resolved(name: str, raw: dict[str, dict[str, Any]]) -> dict[str, Any]:
    data = raw[name]
    base_name = data.get("variant_of")
    if base_name is None:
        return dict(data)
    if base_name not in raw or raw[base_name].get("variant_of"):
        raise InputFileError(f"spec/presets/{name}.json",
                             f"variant_of {base_name!r} names no base preset")
    merged = dict(raw[base_name])
    for key, value in data.items():
        if key == "sources":
            merged[key] = list(merged.get("sources", [])) + list(value)
        else:
            merged[key] = value
    return merged


def _layers(entries: list[dict[str, Any]]) -> tuple[CacheLayers, ...]:
    layers = []
    for entry in entries:
        unknown = set(entry) - set(_LAYER_FIELDS)
        if unknown:
            raise ValueError(f"unknown layer fields {sorted(unknown)}")
        layers.append(CacheLayers(**entry))
    return tuple(layers)


def _speculator(data: dict[str, Any] | None) -> Speculator | None:
    if data is None:
        return None
    return Speculator(
        name=data["name"], method=data["method"], joins=data.get("joins", {}),
        modules=data.get("modules", 1),
    )


def _parse(name: str, data: dict[str, Any]) -> Preset:
    path = f"spec/presets/{name}.json"
    try:
        sources = data["sources"]
        if not isinstance(sources, list) or not sources or not all(
            isinstance(s, str) and s for s in sources
        ):
            raise ValueError("'sources' must be a non-empty list of strings")
        model_data = data["model"]
        model = ModelSpec(
            name=name,
            layers=_layers(model_data["layers"]),
            kernel_block_alignment=model_data.get("kernel_block_alignment", 16),
            mamba_checkpoint_alignment=model_data.get("mamba_checkpoint_alignment"),
            mtp=_speculator(model_data.get("mtp")),
        )
        lookahead = data.get("lookahead_block_hashes", False)
        if not isinstance(lookahead, bool):
            raise ValueError("'lookahead_block_hashes' must be true or false")
        build = dict(data.get("build", {}))
        unknown = set(build) - set(_BUILD_OPTIONS)
        if unknown:
            raise ValueError(f"unknown build options {sorted(unknown)}")
        return Preset(
            name=name,
            title=data["title"],
            hf_model=data["hf_model"],
            architecture=data["architecture"],
            model=model,
            drafter=_speculator(data.get("drafter")),
            build=build,
            sources=tuple(sources),
            variant_of=data.get("variant_of"),
            lookahead_block_hashes=lookahead,
        )
    except KeyError as exc:
        raise InputFileError(path, f"missing field {exc}") from None
    except (TypeError, ValueError, KvContractError) as exc:
        raise InputFileError(path, str(exc)) from None


@cache
def _presets() -> dict[str, Preset]:
    raw = _raw_presets()
    return {name: _parse(name, _resolved(name, raw)) for name in raw}


def list_presets() -> list[str]:
    """The preset names, sorted."""
    return sorted(_presets())


def get_preset(name: str) -> Preset:
    """The preset called ``name``; an unknown name is a :class:`UsageError` listing them."""
    presets = _presets()
    if name not in presets:
        known = ", ".join(sorted(presets))
        raise UsageError(f"unknown model preset {name!r}; known presets: {known}")
    return presets[name]


def preset_geometries(name: str) -> list[tuple[str, Geometry]]:
    """``(label, geometry)`` of a preset at each ``bpc`` of :data:`PRESET_BLOCKS_PER_CHUNK`."""
    preset = get_preset(name)
    return [
        (f"{name} bpc={bpc}", preset.geometry(blocks_per_chunk=bpc))
        for bpc in PRESET_BLOCKS_PER_CHUNK
    ]
