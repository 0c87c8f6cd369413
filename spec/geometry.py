"""Geometry: KV-cache groups, chunking, alignment, retention interval, DCP.

docs/CONTRACT.md section 2. A :class:`Geometry` is validated when it is built: an impossible
configuration raises :class:`~kvcontract.errors.GeometryError` naming the field and the
rule, so no theorem or simulation ever runs on nonsense.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from kvcontract.errors import GeometryError
from kvcontract.vocabulary import GroupKind as GroupKind  # defined in vocabulary


@dataclass(frozen=True)
class GroupSpec:
    """One KV-cache group.

    ``block_size`` is the per-rank GPU block size in tokens; with decode context
    parallelism the logical block is ``block_size * dcp`` (see :meth:`Geometry.block_tokens`).
    ``sliding_window`` and ``extra_retained_tokens`` only apply to sliding-window groups.
    """

    kind: GroupKind
    block_size: int
    sliding_window: int | None = None
    extra_retained_tokens: int = 0
    eagle: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", group_kind("kind", self.kind))
        _require_int("block_size", self.block_size, minimum=1)
        _require_int("extra_retained_tokens", self.extra_retained_tokens, minimum=0)
        if self.kind is GroupKind.SLIDING_WINDOW:
            if self.sliding_window is None:
                raise GeometryError(
                    "sliding_window", None, "a sliding-window group needs a window size"
                )
            # A window of 1 attends no history: nothing would ever be loaded, and the
            # lookup window would be empty (docs/CONTRACT.md section 13, "Narrowed domains").
            _require_int("sliding_window", self.sliding_window, minimum=2)
        else:
            if self.sliding_window is not None:
                raise GeometryError(
                    "sliding_window",
                    self.sliding_window,
                    f"only sliding-window groups have a window (this group is {self.kind.value})",
                )
            if self.extra_retained_tokens:
                raise GeometryError(
                    "extra_retained_tokens",
                    self.extra_retained_tokens,
                    "only sliding-window groups retain extra tokens",
                )

    @property
    def is_swa(self) -> bool:
        return self.kind is GroupKind.SLIDING_WINDOW

    def describe(self) -> str:
        if self.kind is GroupKind.SLIDING_WINDOW:
            text = f"SWA(bs={self.block_size}, sw={self.sliding_window}"
            if self.extra_retained_tokens:
                text += f", e={self.extra_retained_tokens}"
            return text + (", eagle)" if self.eagle else ")")
        name = "FA" if self.kind is GroupKind.FULL else "Mamba"
        return f"{name}(bs={self.block_size}{', eagle' if self.eagle else ''})"


def group_kind(field: str, value: object) -> GroupKind:
    """``value`` as a :class:`GroupKind` (its string accepted); a GeometryError naming
    ``field`` otherwise."""
    if isinstance(value, GroupKind):
        return value
    try:
        return GroupKind(value)
    except ValueError:
        raise GeometryError(
            field, value, f"must be one of {[k.value for k in GroupKind]}"
        ) from None


def _require_int(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise GeometryError(name, value, "must be an integer")
    if value < minimum:
        raise GeometryError(name, value, f"must be >= {minimum}")


@dataclass(frozen=True)
class Geometry:
    """All groups of a model plus the offloading settings that shape the contract."""

    groups: tuple[GroupSpec, ...]
    blocks_per_chunk: int = 1
    hash_block_size: int | None = None
    retention_interval: int | None = None
    dcp: int = 1
    hash_lookahead: int = 0
    """Tokens past each block that its hash covers (vLLM's
    ``VllmConfig.num_hash_lookahead_tokens``; docs/CONTRACT.md 2.1). 0: legacy block
    hashes, and an EAGLE group drops its trailing block (its draft KV depends on the next
    token, which the hash does not prove). ``k > 0``: lookahead block hashes (vLLM
    0.34.0's default with an EAGLE/MTP drafter and the offloading connector): a block is
    keyed only once ``k`` tokens past it exist, so its hash proves them and no group
    drops a block (the keyed tokens: ``spec.lookup.hashed_tokens``)."""
    extra: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "groups", tuple(self.groups))
        if not self.groups:
            raise GeometryError("groups", (), "a geometry needs at least one KV-cache group")
        _require_int("blocks_per_chunk", self.blocks_per_chunk, minimum=1)
        _require_int("dcp", self.dcp, minimum=1)
        _require_int("hash_lookahead", self.hash_lookahead, minimum=0)
        if self.hash_lookahead and not any(g.eagle for g in self.groups):
            raise GeometryError(
                "hash_lookahead", self.hash_lookahead,
                "lookahead block hashes need an EAGLE group: vLLM keys blocks with the "
                "drafter's lookahead tokens only when a drafter's KV depends on the next "
                "token (an EAGLE-style drafter that drops blocks)",
            )
        if self.retention_interval is not None:
            _require_int("retention_interval", self.retention_interval, minimum=0)
        tph = self.hash_block_size
        if tph is None:
            tph = math.gcd(*[g.block_size for g in self.groups])
            object.__setattr__(self, "hash_block_size", tph)
        _require_int("hash_block_size", tph, minimum=1)
        for index, group in enumerate(self.groups):
            if group.block_size % tph:
                raise GeometryError(
                    f"groups[{index}].block_size",
                    group.block_size,
                    f"must be a multiple of the hash block size {tph}",
                )
        align = self.alignment_tokens
        if self.retention_interval and align is not None and self.retention_interval % align:
            raise GeometryError(
                "retention_interval",
                self.retention_interval,
                f"must be a multiple of the store alignment A={align}",
            )

    # -- derived sizes -------------------------------------------------------------
    def block_tokens(self, group: GroupSpec) -> int:
        """Logical block size: the per-rank block size scaled by DCP."""
        return group.block_size * self.dcp

    def chunk_tokens(self, group: GroupSpec) -> int:
        """``tpc``: tokens per offload chunk of a group."""
        return self.block_tokens(group) * self.blocks_per_chunk

    @property
    def alignment_tokens(self) -> int | None:
        """``A``: the offload store alignment (docs/CONTRACT.md section 2).

        The FA group's tpc if exactly one distinct FA tpc exists; None if FA groups
        disagree; the largest tpc if there is no FA group.
        """
        fa_sizes = {self.chunk_tokens(g) for g in self.groups if g.kind is GroupKind.FULL}
        if len(fa_sizes) == 1:
            return next(iter(fa_sizes))
        if len(fa_sizes) > 1:
            return None
        return max(self.chunk_tokens(g) for g in self.groups)

    @property
    def tokens_per_hash(self) -> int:
        """``tph``: the hash block (set when the geometry is built)."""
        assert self.hash_block_size is not None
        return self.hash_block_size

    def drops_eagle_block(self, group: GroupSpec) -> bool:
        """Whether ``group`` drops its trailing block as EAGLE (docs/CONTRACT.md 2.1): an
        EAGLE group under legacy block hashes. Its lookup then peeks one chunk past the
        boundary and pops it, and its store mask and decode horizon keep that chunk. With
        lookahead hashes an EAGLE group is read and stored like any other group."""
        return group.eagle and not self.hash_lookahead

    @property
    def has_swa(self) -> bool:
        return any(g.is_swa for g in self.groups)

    @property
    def recomputes_last_token(self) -> bool:
        """Whether a lookup caps its hit at ``num_tokens - 1`` (the last prompt token is
        recomputed for its logits). vLLM's offloading lookup does so for every windowed
        group, and a Mamba group is one: its window is the single chunk holding the
        state (vLLM 0.33.0 ``offloading/config.py:get_sliding_window_size_in_chunks``
        gives it one chunk, and ``_lookup_complete_chunks`` lowers the cap by one when any
        group has a window). Only full attention alone serves the whole prompt."""
        return any(g.kind is not GroupKind.FULL for g in self.groups)

    def describe(self) -> str:
        parts = " + ".join(g.describe() for g in self.groups)
        text = f"{parts}; bpc={self.blocks_per_chunk}"
        if self.retention_interval is not None:
            text += f"; retention={self.retention_interval}"
        if self.dcp != 1:
            text += f"; dcp={self.dcp}"
        if self.hash_lookahead:
            text += f"; lookahead hashes={self.hash_lookahead}"
        return text

    def to_dict(self) -> dict[str, Any]:
        described = {
            "groups": [
                {
                    "kind": g.kind.value,
                    "block_size": g.block_size,
                    "sliding_window": g.sliding_window,
                    "extra_retained_tokens": g.extra_retained_tokens,
                    "eagle": g.eagle,
                }
                for g in self.groups
            ],
            "blocks_per_chunk": self.blocks_per_chunk,
            "hash_block_size": self.hash_block_size,
            "retention_interval": self.retention_interval,
            "dcp": self.dcp,
        }
        if self.hash_lookahead:  # absent under legacy hashes: older reports stay as they were
            described["hash_lookahead"] = self.hash_lookahead
        return described

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Geometry:
        try:
            groups = tuple(GroupSpec(**g) for g in data["groups"])
            rest = {k: v for k, v in data.items() if k != "groups"}
            return cls(groups=groups, **rest)
        except (KeyError, TypeError) as exc:
            raise GeometryError(
                "geometry", data, f"malformed geometry description ({exc})"
            ) from None


def fa(block_size: int, *, eagle: bool = False) -> GroupSpec:
    """Shorthand for a full-attention group."""
    return GroupSpec(GroupKind.FULL, block_size, eagle=eagle)


def swa(block_size: int, sliding_window: int, extra: int = 0, *, eagle: bool = False) -> GroupSpec:
    """Shorthand for a sliding-window group."""
    return GroupSpec(GroupKind.SLIDING_WINDOW, block_size, sliding_window, extra, eagle)


def mamba(block_size: int) -> GroupSpec:
    """Shorthand for a Mamba group."""
    return GroupSpec(GroupKind.MAMBA, block_size)


def require_tokens(name: str, value: object) -> int:
    """Validate a token count given by a user (non-negative integer)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise GeometryError(name, value, "must be an integer number of tokens")
    if value < 0:
        raise GeometryError(name, value, "token counts cannot be negative")
    return value
