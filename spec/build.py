"""Build a :class:`~kvcontract.spec.geometry.Geometry` the way vLLM plans its KV cache.

docs/CONTRACT.md section 11. Every rule below was read in vLLM 0.33.0's own code (the
released wheel); each function's docstring names the file and function it restates.
Facts and formulas are carried over, code is not.

A model is described by its *cache layer kinds* (:class:`CacheLayers`): how many layers
of the target model carry one kind of KV-cache spec (full attention, a sliding window,
a Mamba state), with the numbers vLLM reads from the HF config. A speculator
(:class:`Speculator`: an EAGLE drafter or the model's own MTP modules) adds draft layers
to existing kinds. :func:`build_geometry` then follows vLLM's planning:

1. the base block size (``cache_config.block_size``), raised for hybrid Mamba models;
2. each kind's initial block size and page size;
3. page-size unification (integer block ratios, or padding);
4. the split of the layers into KV-cache groups, and which groups are EAGLE groups;
5. ``extra_retained_tokens`` for multi-module MTP;
6. the offloading connector's ``blocks_per_chunk`` and the retention interval checks.

Identical groups (vLLM splits a kind with many layers into several groups with the same
spec) are folded into one :class:`~kvcontract.spec.geometry.GroupSpec`: each group is
looked up and stored independently under its own key, so copies add nothing to the
contract. How many vLLM groups each folded group stands for is kept in
``Geometry.extra["group_counts"]``.

:func:`buildable` is the converse: whether a given geometry can come out of vLLM's
planning at all (e.g. FA ``bs 528`` with SWA ``bs 32`` cannot).

Scope: CUDA attention backends whose kernel block sizes are ``MultipleOf(k)``
(FlashAttention, Triton: ``k = 16``), Mamba in ``align`` cache mode (prefix caching on,
which offloading needs), the hybrid KV-cache manager enabled (``OffloadingConnector``
supports it), tensor parallelism 1 for the page sizes of the presets.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from kvcontract.errors import GeometryError
from kvcontract.releases import PLANNING_RELEASE
from kvcontract.spec.geometry import Geometry, GroupKind, GroupSpec, group_kind

DEFAULT_BASE_BLOCK_SIZE = 16
"""``CacheConfig.DEFAULT_BLOCK_SIZE`` (vllm/config/cache.py, 0.33.0)."""

EAGLE_METHODS = ("eagle", "eagle3", "mtp")
"""Speculative methods whose drafter layers make EAGLE groups: ``use_eagle()`` minus
DFlash/DSpark (``SpeculativeConfig.needs_eagle_block_drop``, vllm/config/speculative.py,
0.33.0)."""


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _require(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise GeometryError(name, value, "must be an integer")
    if value < minimum:
        raise GeometryError(name, value, f"must be >= {minimum}")
    return value


# -- the model description ---------------------------------------------------------------
@dataclass(frozen=True)
class CacheLayers:
    """The layers of a model that share one KV-cache spec.

    ``sliding_window`` is the HF config's value; ``window_offset`` is what the vLLM model
    class adds before handing it to the attention layer (Cohere2: ``+1``).
    ``block_size`` is set only for caches whose layer fixes its own block size (DeepSeek
    V4's SWA and compressor caches); they take no part in page unification.
    ``bytes_per_token`` is the attention page per token and layer (``None``: every kind
    of the model has the same page, e.g. sliding and full layers with the same heads);
    ``state_bytes`` is a Mamba layer's state page. ``count`` is ``None`` when the layer
    count is not known; the group split is then not derived (one group per kind).
    """

    name: str
    kind: GroupKind
    count: int | None
    sliding_window: int | None = None
    window_offset: int = 0
    block_size: int | None = None
    bytes_per_token: int | None = None
    state_bytes: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", group_kind(f"layers[{self.name}].kind", self.kind))
        where = f"layers[{self.name}]"
        if self.count is not None:
            _require(f"{where}.count", self.count, 1)
        for attr in ("block_size", "bytes_per_token", "state_bytes"):
            value = getattr(self, attr)
            if value is not None:
                _require(f"{where}.{attr}", value, 1)
        if self.kind is GroupKind.SLIDING_WINDOW:
            if self.sliding_window is None:
                raise GeometryError(f"{where}.sliding_window", None,
                                    "a sliding-window kind needs the HF config's window")
            _require(f"{where}.sliding_window", self.sliding_window, 1)
        elif self.sliding_window is not None or self.window_offset:
            raise GeometryError(f"{where}.sliding_window", self.sliding_window,
                                f"only sliding-window kinds have a window ({self.kind.value})")
        if self.kind is GroupKind.MAMBA:
            if self.state_bytes is None:
                raise GeometryError(f"{where}.state_bytes", None,
                                    "a Mamba kind needs its state page size in bytes")
            if self.block_size is not None:
                raise GeometryError(f"{where}.block_size", self.block_size,
                                    "a Mamba block size is the base block size (align mode)")

    @property
    def vllm_sliding_window(self) -> int | None:
        """The window vLLM's attention layer gets (``per_layer_sliding_window``)."""
        if self.sliding_window is None:
            return None
        return self.sliding_window + self.window_offset


@dataclass(frozen=True)
class Speculator:
    """An EAGLE drafter, or a model's own MTP modules.

    ``joins`` maps a cache-layer kind of the target to the number of draft layers whose
    KV-cache spec equals that kind's (vLLM excludes ``is_draft`` from spec equality, so
    such layers land in the same groups). ``modules`` is ``num_nextn_predict_layers``
    (MTP only).
    """

    name: str
    method: str
    joins: Mapping[str, int] = field(default_factory=dict)
    modules: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "joins", dict(self.joins))
        if self.method not in EAGLE_METHODS:
            raise GeometryError(
                "drafter.method", self.method,
                f"the builder models the EAGLE-style methods {list(EAGLE_METHODS)} "
                "(SpeculativeConfig.needs_eagle_block_drop, vLLM 0.33.0)",
            )
        _require("drafter.modules", self.modules, 1)
        for kind, count in self.joins.items():
            _require(f"drafter.joins[{kind}]", count, 1)


@dataclass(frozen=True)
class ModelSpec:
    """A model as vLLM's KV-cache planning sees it.

    ``kernel_block_alignment`` is ``k`` of the attention backend's ``MultipleOf(k)``
    kernel block sizes; ``mamba_checkpoint_alignment`` is the Mamba layers' prefill
    checkpoint alignment in align mode (``None`` when they declare none); ``mtp`` are
    the model's own MTP modules, used when ``build_geometry(mtp_tokens=k)`` asks for them.
    """

    name: str
    layers: tuple[CacheLayers, ...]
    kernel_block_alignment: int = 16
    mamba_checkpoint_alignment: int | None = None
    mtp: Speculator | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "layers", tuple(self.layers))
        if not self.layers:
            raise GeometryError("layers", (), "a model needs at least one cache layer kind")
        names = [kind.name for kind in self.layers]
        if len(set(names)) != len(names):
            raise GeometryError("layers", names, "layer kind names must be unique")
        _require("kernel_block_alignment", self.kernel_block_alignment, 1)
        if self.mamba_checkpoint_alignment is not None:
            _require("mamba_checkpoint_alignment", self.mamba_checkpoint_alignment, 1)
        if self.mtp is not None and self.mtp.method != "mtp":
            raise GeometryError("mtp.method", self.mtp.method, "a model's own modules are 'mtp'")

    @property
    def is_hybrid(self) -> bool:
        return any(k.kind is GroupKind.MAMBA for k in self.layers)


# -- the planning rules -----------------------------------------------------------------
def extra_retained_tokens(method: str | None, num_speculative_tokens: int, modules: int) -> int:
    """``e`` of every sliding-window spec.

    vllm/v1/core/kv_cache_planning.py ``get_global_kv_cache_groups`` (0.33.0) tags every
    ``SlidingWindowSpec`` with ``max(0, num_prefill_lookahead_tokens - 1)``;
    vllm/config/vllm.py ``num_prefill_lookahead_tokens`` is ``k`` for multi-module MTP
    (``use_multi_module_mtp``: method ``mtp`` and ``min(num_nextn_predict_layers, k) > 1``),
    1 for the other EAGLE-style methods and 0 without speculation. So ``e = k - 1`` only
    for multi-module MTP.
    """
    if method is None or num_speculative_tokens == 0:
        return 0
    if method == "mtp" and min(modules, num_speculative_tokens) > 1:
        return num_speculative_tokens - 1
    return 0


def hybrid_base_block_size(
    base_block_size: int,
    kernel_block_alignment: int,
    attention_bytes_per_token: int,
    mamba_state_bytes: int,
    checkpoint_alignment: int | None,
) -> int:
    """The base block size of a hybrid attention/Mamba model in align mode.

    vllm/platforms/interface.py ``Platform._align_hybrid_block_size`` (0.33.0): with
    ``a = max(k, block_size)``, made ``lcm(a, checkpoint alignment)`` in align mode, the
    attention block is ``a * cdiv(mamba_page, a * attention_page_per_token)`` rounded up
    to a multiple of ``k``; ``cache_config.block_size`` is raised to it if smaller, and the
    Mamba page is padded to the attention page.
    """
    align = max(kernel_block_alignment, base_block_size)
    if checkpoint_alignment:
        align = math.lcm(align, checkpoint_alignment)
    block = align * _cdiv(mamba_state_bytes, align * attention_bytes_per_token)
    block = kernel_block_alignment * _cdiv(block, kernel_block_alignment)
    return max(base_block_size, block)


def sliding_window_block_size(base_block_size: int, kernel_block_alignment: int) -> int:
    """The initial block size of a generic sliding-window layer.

    vllm/model_executor/layers/attention/attention.py ``Attention.get_kv_cache_spec`` and
    ``_largest_kernel_block_within`` (0.33.0): the largest kernel block whose page fits the
    page of one base block; for ``MultipleOf(k)`` that is ``max(k, block_size // k * k)``,
    i.e. the base block size itself when it is a multiple of ``k``.
    """
    k = kernel_block_alignment
    return max(k, base_block_size // k * k)


@dataclass
class _Kind:
    """One cache layer kind during planning (mutable: unification changes the block)."""

    spec: CacheLayers
    block: int
    page: int | None  # None: fixed by the model, not unified
    draft_layers: int = 0


def unify_page_sizes(kinds: list[_Kind]) -> None:
    """Make every page the largest page.

    vllm/v1/core/kv_cache_planning.py ``unify_kv_cache_spec_page_size`` (0.33.0): a layer
    whose page divides the largest page gets ``block_size * ratio``; a Mamba page, or a
    non-MLA attention page that does not divide it, is padded (block size unchanged).
    Attention block sizes therefore only grow, by integer ratios.
    """
    pages = [k.page for k in kinds if k.page is not None]
    if len(set(pages)) <= 1:
        return
    largest = max(pages)
    for k in kinds:
        if k.page is None or k.page == largest:
            continue
        if k.spec.kind is not GroupKind.MAMBA and largest % k.page == 0:
            k.block *= largest // k.page
        k.page = largest


def split_into_groups(sizes: list[int]) -> list[int]:
    """How many KV-cache groups each same-spec bucket of ``sizes[i]`` layers becomes.

    vllm/v1/core/kv_cache_planning.py ``_get_kv_cache_groups_uniform_page_size`` (0.33.0):
    the group size is the smallest bucket, or the largest one when that is under 1.5
    times the smallest (the gpt-oss-20b + EAGLE case: 12 sliding + 13 full layers give
    two groups of 13); each bucket becomes ``cdiv(n, group size)`` groups, group ``i``
    taking layers ``i, i + groups, ...``.
    """
    smallest, largest = min(sizes), max(sizes)
    group_size = largest if largest < smallest * 1.5 else smallest
    return [_cdiv(n, group_size) for n in sizes]


def draft_groups(target_layers: int, draft_layers: int, groups: int) -> list[bool]:
    """Which of a bucket's groups hold a draft layer (and are EAGLE groups).

    vllm/v1/core/kv_cache_planning.py ``get_global_kv_cache_groups`` (0.33.0) sets
    ``is_eagle_group`` on every group holding a layer whose spec has ``is_draft`` when
    ``use_eagle_block_drop()``; draft layers come after the target's in the layer order,
    and group ``i`` takes layers ``i::groups``.
    """
    total = target_layers + draft_layers
    return [any(j >= target_layers for j in range(i, total, groups)) for i in range(groups)]


def blocks_per_chunk_for(tokens_per_block: list[int], offloaded_block_size: int) -> int:
    """``bpc`` from the offloading connector's ``block_size`` option.

    vllm/distributed/kv_transfer/kv_connector/v1/offloading/config.py
    ``build_offloading_config`` (0.33.0): ``block_size`` (tokens per offloaded chunk)
    needs every offloaded group to have one block size (DCP-scaled) and must be a multiple
    of it; ``bpc = block_size // tokens_per_block``. (``blocks_per_chunk`` sets ``bpc``
    directly; the two options exclude each other.)
    """
    sizes = set(tokens_per_block)
    if len(sizes) != 1:
        raise GeometryError(
            "offloaded_block_size", offloaded_block_size,
            f"the groups have different block sizes {sorted(sizes)}; vLLM {PLANNING_RELEASE} "
            "accepts an offloaded block_size only when all groups share one "
            "(offloading/config.py build_offloading_config); use blocks_per_chunk",
        )
    tpb = sizes.pop()
    if offloaded_block_size % tpb:
        raise GeometryError(
            "offloaded_block_size", offloaded_block_size,
            f"must be a multiple of the GPU block size {tpb} "
            f"(offloading/config.py build_offloading_config, vLLM {PLANNING_RELEASE})",
        )
    return offloaded_block_size // tpb


def check_retention_interval(
    retention_interval: int | None,
    groups: list[GroupSpec],
    tokens_per_block: list[int],
    blocks_per_chunk: int,
) -> None:
    """vLLM's checks of ``prefix_cache_retention_interval`` (default 0 in 0.30-0.33).

    vllm/v1/core/kv_cache_coordinator.py ``_validate_prefix_cache_retention_interval``
    (0.33.0): ``None`` (dense) and 0 (replay boundaries only) always pass; a positive
    interval needs a sliding-window or Mamba group and must be a multiple of the
    scheduler block size (the LCM of the groups' DCP-scaled block sizes,
    kv_cache_utils.py ``resolve_kv_cache_block_sizes``). The offloading scheduler
    (offloading/scheduler.py ``SchedulerOffloadConfig.from_spec``) also needs it to be a
    multiple of every sliding-window or Mamba group's ``tpc``.
    """
    if not retention_interval:
        return
    if not any(g.kind is not GroupKind.FULL for g in groups):
        raise GeometryError(
            "retention_interval", retention_interval,
            "a positive interval needs a sliding-window or Mamba group (vLLM "
            f"{PLANNING_RELEASE} kv_cache_coordinator._validate_prefix_cache_retention_interval)",
        )
    scheduler_block = math.lcm(*tokens_per_block)
    if retention_interval % scheduler_block:
        raise GeometryError(
            "retention_interval", retention_interval,
            f"must be a multiple of the scheduler block size {scheduler_block} (LCM of the "
            f"group block sizes; vLLM {PLANNING_RELEASE} "
            "kv_cache_coordinator._validate_prefix_cache_retention_interval)",
        )
    for g, tpb in zip(groups, tokens_per_block, strict=True):
        tpc = tpb * blocks_per_chunk
        if g.kind is not GroupKind.FULL and retention_interval % tpc:
            raise GeometryError(
                "retention_interval", retention_interval,
                f"must be a multiple of the {g.describe()} group's tpc {tpc} (vLLM "
                f"{PLANNING_RELEASE} offloading/scheduler.py SchedulerOffloadConfig.from_spec)",
            )


# -- the builder ----------------------------------------------------------------------
def build_geometry(
    model: ModelSpec,
    *,
    base_block_size: int = DEFAULT_BASE_BLOCK_SIZE,
    blocks_per_chunk: int = 1,
    dcp: int = 1,
    retention_interval: int | None = 0,
    mtp_tokens: int = 0,
    drafter: Speculator | None = None,
    offloaded_block_size: int | None = None,
    lookahead_block_hashes: bool = False,
) -> Geometry:
    """The geometry vLLM 0.33.0 plans for ``model`` with these settings.

    ``base_block_size`` is ``--block-size`` (``cache_config.block_size``, default 16);
    ``blocks_per_chunk`` or ``offloaded_block_size`` the offloading connector's
    ``blocks_per_chunk`` / ``block_size``; ``dcp`` the decode-context-parallel size;
    ``retention_interval`` ``prefix_cache_retention_interval`` (``None``, 0 or positive);
    ``mtp_tokens`` the speculative tokens of the model's own MTP modules; ``drafter`` an
    EAGLE drafter. ``lookahead_block_hashes``: the offloading connector's block hashes
    cover the drafter's prefill lookahead (vLLM 0.34.0's default,
    ``VllmConfig.num_hash_lookahead_tokens``: ``num_prefill_lookahead_tokens`` when the
    speculator drops EAGLE blocks and the connector supports it, ``e + 1``); the geometry's
    ``hash_lookahead`` (docs/CONTRACT.md 2.1), 0 without an EAGLE group. Raises
    :class:`~kvcontract.errors.GeometryError` naming the field and the vLLM rule for a
    request vLLM would refuse.
    """
    _require("base_block_size", base_block_size, 1)
    _require("blocks_per_chunk", blocks_per_chunk, 1)
    _require("dcp", dcp, 1)
    _require("mtp_tokens", mtp_tokens, 0)
    if retention_interval is not None:
        _require("retention_interval", retention_interval, 0)
    if offloaded_block_size is not None:
        _require("offloaded_block_size", offloaded_block_size, 1)
        if blocks_per_chunk != 1:
            raise GeometryError(
                "offloaded_block_size", offloaded_block_size,
                "give blocks_per_chunk or offloaded_block_size, not both (vLLM "
                f"{PLANNING_RELEASE} offloading/config.py build_offloading_config)",
            )
    speculator = _speculator(model, mtp_tokens, drafter)
    k = model.kernel_block_alignment
    if base_block_size % k:
        raise GeometryError(
            "base_block_size", base_block_size,
            f"must be a multiple of the attention backend's kernel block alignment {k} "
            f"(MultipleOf({k}); Attention.get_kv_cache_spec and the backend's "
            f"supports_block_size, vLLM {PLANNING_RELEASE})",
        )
    if model.is_hybrid and dcp > 1:
        raise GeometryError(
            "dcp", dcp,
            "vLLM does not scale Mamba blocks by DCP (kv_cache_utils.py "
            f"resolve_dcp_kv_block_size: MambaSpec.dcp_sharded is False, vLLM {PLANNING_RELEASE}), "
            "while Geometry.block_tokens scales every group",
        )

    base = _base_block_size(model, base_block_size)
    kinds = _initial_kinds(model, base)
    if speculator is not None:
        for name, count in speculator.joins.items():
            kind = next((x for x in kinds if x.spec.name == name), None)
            if kind is None:
                raise GeometryError(
                    "drafter.joins", name,
                    f"no cache layer kind of that name in {[x.spec.name for x in kinds]}",
                )
            kind.draft_layers += count
    unify_page_sizes(kinds)
    e = extra_retained_tokens(
        speculator.method if speculator else None,
        mtp_tokens,
        speculator.modules if speculator else 1,
    )

    folded: dict[GroupSpec, int] = {}
    for kind, eagle_flags in zip(kinds, _group_split(kinds), strict=True):
        for eagle in eagle_flags:
            group = GroupSpec(
                kind.spec.kind, kind.block, kind.spec.vllm_sliding_window,
                e if kind.spec.kind is GroupKind.SLIDING_WINDOW else 0,
                eagle and speculator is not None,
            )
            folded[group] = folded.get(group, 0) + 1
    groups = list(folded)
    tokens_per_block = [
        g.block_size * (1 if g.kind is GroupKind.MAMBA else dcp) for g in groups
    ]
    if offloaded_block_size is not None:
        blocks_per_chunk = blocks_per_chunk_for(tokens_per_block, offloaded_block_size)
    check_retention_interval(retention_interval, groups, tokens_per_block, blocks_per_chunk)
    lookahead = e + 1 if lookahead_block_hashes and any(g.eagle for g in groups) else 0
    return Geometry(
        tuple(groups),
        blocks_per_chunk=blocks_per_chunk,
        retention_interval=retention_interval,
        dcp=dcp,
        hash_lookahead=lookahead,
        extra={
            "model": model.name,
            "vllm_version": PLANNING_RELEASE,
            "base_block_size": base,
            "group_counts": list(folded.values()),
            "speculator": speculator.name if speculator else None,
        },
    )


def _speculator(
    model: ModelSpec, mtp_tokens: int, drafter: Speculator | None
) -> Speculator | None:
    if drafter is not None and mtp_tokens:
        raise GeometryError(
            "mtp_tokens", mtp_tokens,
            "vLLM takes one speculative config: an EAGLE drafter or the model's MTP, not both",
        )
    if drafter is not None and drafter.method == "mtp":
        raise GeometryError(
            "drafter.method", drafter.method,
            "MTP modules belong to the model (ModelSpec.mtp); ask for them with mtp_tokens",
        )
    if mtp_tokens:
        if model.mtp is None:
            raise GeometryError("mtp_tokens", mtp_tokens, f"model {model.name} has no MTP modules")
        return model.mtp
    return drafter


def _base_block_size(model: ModelSpec, base_block_size: int) -> int:
    if not model.is_hybrid:
        return base_block_size
    attention = [k for k in model.layers if k.kind is not GroupKind.MAMBA and k.block_size is None]
    if not attention or attention[0].bytes_per_token is None:
        raise GeometryError(
            "layers", [k.name for k in model.layers],
            "a hybrid Mamba model needs an attention kind with bytes_per_token to size the "
            f"base block (Platform._align_hybrid_block_size, vLLM {PLANNING_RELEASE})",
        )
    mamba_page = max(k.state_bytes or 0 for k in model.layers if k.kind is GroupKind.MAMBA)
    return hybrid_base_block_size(
        base_block_size, model.kernel_block_alignment, attention[0].bytes_per_token,
        mamba_page, model.mamba_checkpoint_alignment,
    )


def _initial_kinds(model: ModelSpec, base: int) -> list[_Kind]:
    unified = [k for k in model.layers if k.block_size is None and k.kind is not GroupKind.MAMBA]
    with_bytes = [k for k in unified if k.bytes_per_token is not None]
    if with_bytes and len(with_bytes) != len(unified):
        raise GeometryError(
            "layers", [k.name for k in unified],
            "give bytes_per_token for every attention kind or for none (none: equal pages)",
        )
    kinds = []
    for spec in model.layers:
        if spec.block_size is not None:
            kinds.append(_Kind(spec, spec.block_size, None))
        elif spec.kind is GroupKind.MAMBA:
            # Padded to the attention page by _align_hybrid_block_size.
            per_token = with_bytes[0].bytes_per_token if with_bytes else 1
            kinds.append(_Kind(spec, base, base * (per_token or 1)))
        else:
            block = base
            if spec.kind is GroupKind.SLIDING_WINDOW:
                block = sliding_window_block_size(base, model.kernel_block_alignment)
            kinds.append(_Kind(spec, block, block * (spec.bytes_per_token or 1)))
    return kinds


def _group_split(kinds: list[_Kind]) -> list[list[bool]]:
    """Per kind, the EAGLE flag of each vLLM group it becomes (one entry per group)."""
    if len(kinds) == 1 or any(k.spec.count is None for k in kinds):
        # One kind: one group with every layer (the uniform-spec path of
        # get_kv_cache_groups). Unknown layer counts: the split is not derived.
        return [[k.draft_layers > 0] for k in kinds]
    sizes = [(k.spec.count or 0) + k.draft_layers for k in kinds]
    return [
        draft_groups(k.spec.count or 0, k.draft_layers, n)
        for k, n in zip(kinds, split_into_groups(sizes), strict=True)
    ]


# -- the converse -------------------------------------------------------------------------
def buildable(geometry: Geometry) -> tuple[bool, str]:
    """Whether vLLM 0.33.0's KV-cache planning can produce ``geometry``, and why not.

    Necessary conditions, each read in vLLM 0.33.0 (``True`` means no rule below rules
    the geometry out, not that a model with exactly these numbers exists):

    * attention block sizes are the base block size times integer page ratios
      (``unify_kv_cache_spec_page_size`` only multiplies a smaller page's block size,
      or pads): every block is a multiple of the smallest one, which is the base;
    * a Mamba group in align mode has the base block size itself
      (``_align_hybrid_block_size``: ``mamba_block_size = cache_config.block_size``);
    * vLLM does not scale Mamba blocks by DCP (``resolve_dcp_kv_block_size``), so a
      geometry with a Mamba group and ``dcp > 1`` does not describe vLLM;
    * every sliding-window group has the same ``e`` (``get_global_kv_cache_groups``);
    * with one group the hash block is the block (``resolve_kv_cache_block_sizes``);
    * a positive retention interval needs a sliding-window or Mamba group and is a
      multiple of the scheduler block size and of every such group's ``tpc``.

    Not checked: the backend's kernel block alignment (backend- and platform-specific).
    """
    groups = list(geometry.groups)
    smallest = min(g.block_size for g in groups)
    for g in groups:
        if g.block_size % smallest:
            return False, (
                f"{g.describe()}: block size {g.block_size} is not an integer multiple of the "
                f"smallest block size {smallest}; vLLM {PLANNING_RELEASE} derives every block size "
                "from the base block size by integer page ratios "
                "(kv_cache_planning.py unify_kv_cache_spec_page_size)"
            )
        if g.kind is GroupKind.MAMBA and g.block_size != smallest:
            return False, (
                f"{g.describe()}: a Mamba group in align mode has the base block size, and no "
                f"attention group is smaller; here an attention block is {smallest} "
                f"(platforms/interface.py _align_hybrid_block_size, vLLM {PLANNING_RELEASE})"
            )
    if geometry.dcp > 1 and any(g.kind is GroupKind.MAMBA for g in groups):
        return False, (
            f"dcp={geometry.dcp} with a Mamba group: vLLM does not scale Mamba blocks by DCP "
            f"(kv_cache_utils.py resolve_dcp_kv_block_size, vLLM {PLANNING_RELEASE})"
        )
    extras = {g.extra_retained_tokens for g in groups if g.is_swa}
    if len(extras) > 1:
        return False, (
            f"sliding-window groups with different e {sorted(extras)}: vLLM tags every "
            "sliding-window spec with one extra_retained_tokens "
            f"(kv_cache_planning.py get_global_kv_cache_groups, vLLM {PLANNING_RELEASE})"
        )
    if len(groups) == 1 and geometry.hash_block_size != groups[0].block_size:
        return False, (
            f"hash block {geometry.hash_block_size} with a single group of block size "
            f"{groups[0].block_size}: vLLM hashes single-group models by the block "
            f"(kv_cache_utils.py resolve_kv_cache_block_sizes, vLLM {PLANNING_RELEASE})"
        )
    try:
        check_retention_interval(
            geometry.retention_interval, groups,
            [geometry.block_tokens(g) for g in groups], geometry.blocks_per_chunk,
        )
    except GeometryError as exc:
        return False, f"retention_interval={geometry.retention_interval}: {exc.rule}"
    return True, f"consistent with vLLM {PLANNING_RELEASE}'s KV-cache planning"
