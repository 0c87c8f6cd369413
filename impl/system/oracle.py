"""Data oracles of the executable system (clause C11).

Contract: the KV bytes of one token are a pure function of ``(group, layer, position,
token id)`` (:func:`expected_kv`), so any block on the GPU or any chunk on the CPU can be
checked byte for byte against what the producer must have computed, without keeping a
second copy. :func:`window_decode_attention` is the attention oracle: one decode step of
sliding-window attention (``scaled_dot_product_attention`` with the window mask); a
restored cache passes when it yields exactly the output of a freshly computed cache;
:func:`attention_window_start` is the first position that step attends. The oracles
compute; they do not judge (the system reports the outcomes as events, a monitor judges).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class KVLayout:
    """Shape of one token's KV in one group: ``layers x {K, V} x kv_heads x head_dim``."""

    num_layers: int = 2
    num_kv_heads: int = 1
    head_dim: int = 4
    dtype: torch.dtype = torch.float32

    @property
    def token_shape(self) -> tuple[int, int, int, int]:
        return (self.num_layers, 2, self.num_kv_heads, self.head_dim)


# Mixing constants only need to be distinct odd numbers; the modulus keeps every
# intermediate exact in int64 and every value exactly representable after scaling.
_MODULUS = 4093


_LANE_OFFSETS: dict[tuple[tuple[int, int, int, int], str], torch.Tensor] = {}


def _lane_offsets(layout: KVLayout, device: torch.device | str) -> torch.Tensor:
    """The per-(layer, K/V, head, lane) part of the mix, ``[1, layers, 2, heads, dim]``.

    It does not depend on the token, so it is built once per layout and device; a call
    of :func:`expected_kv` then costs one broadcast add and one ``%`` per element.
    """
    key = (layout.token_shape, str(device))
    cached = _LANE_OFFSETS.get(key)
    if cached is None:
        layers, kv, heads, dim = layout.token_shape
        layer = torch.arange(layers, device=device, dtype=torch.int64).view(1, -1, 1, 1, 1)
        which = torch.arange(kv, device=device, dtype=torch.int64).view(1, 1, -1, 1, 1)
        head = torch.arange(heads, device=device, dtype=torch.int64).view(1, 1, 1, -1, 1)
        lane = torch.arange(dim, device=device, dtype=torch.int64).view(1, 1, 1, 1, -1)
        cached = layer * 977 + which * 389 + head * 131 + lane * 17
        _LANE_OFFSETS[key] = cached
    return cached


def expected_kv(
    layout: KVLayout,
    group: int,
    positions: torch.Tensor,
    token_ids: torch.Tensor,
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """KV of tokens ``(positions[i], token_ids[i])``: shape ``[n, layers, 2, heads, dim]``."""
    pos = positions.to(device=device, dtype=torch.int64).view(-1, 1, 1, 1, 1)
    tok = token_ids.to(device=device, dtype=torch.int64).view(-1, 1, 1, 1, 1)
    per_token = ((group + 1) * 7919 + pos * 104729 + tok * 15485) % _MODULUS
    mixed = (per_token + _lane_offsets(layout, device)) % _MODULUS
    return (mixed.to(torch.float32) / _MODULUS - 0.5).to(layout.dtype)


def expected_query(
    layout: KVLayout,
    group: int,
    positions: torch.Tensor,
    token_ids: torch.Tensor,
    device: torch.device | str,
) -> torch.Tensor:
    """Queries of the tokens (layer 0, one per KV head): ``[n, heads, dim]``.

    Derived like the KV but from a disjoint group id, so a query never equals a key.
    """
    return expected_kv(layout, group + 101, positions, token_ids, device)[:, 0, 0]


def attention_window_start(query_position: int, sliding_window: int | None) -> int:
    """The first key position a decode step at ``query_position`` attends: the window
    ``[query_position - sw + 1, query_position]`` clipped at 0 (0 for full attention).
    :func:`window_decode_attention` masks with the same bound."""
    if sliding_window is None:
        return 0
    return max(0, query_position - sliding_window + 1)


def window_decode_attention(
    query: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    key_positions: torch.Tensor,
    query_position: int,
    sliding_window: int | None,
) -> torch.Tensor:
    """One decode step: ``query [heads, dim]`` over ``keys/values [n, heads, dim]``.

    ``keys``/``values`` may carry a leading batch dimension (``[b, n, heads, dim]``,
    e.g. a restored and a fresh cache at once); the output is then ``[b, heads, dim]``.
    The mask admits key positions in ``[query_position - sw + 1, query_position]`` (all
    positions up to the query for full attention).
    """
    low = 0 if sliding_window is None else query_position - sliding_window + 1
    allowed = (key_positions >= low) & (key_positions <= query_position)
    batched = keys.dim() == 4
    k = (keys if batched else keys.unsqueeze(0)).to(torch.float32).permute(0, 2, 1, 3)
    v = (values if batched else values.unsqueeze(0)).to(torch.float32).permute(0, 2, 1, 3)
    q = query.to(torch.float32).unsqueeze(1).unsqueeze(0).expand(k.shape[0], -1, -1, -1)
    mask = allowed.to(q.device).view(1, 1, 1, -1)
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return out[:, :, 0, :] if batched else out[0, :, 0, :]
