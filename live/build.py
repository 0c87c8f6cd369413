"""A kvcontract :class:`~kvcontract.spec.geometry.Geometry` as real vLLM objects.

The wheel has no CPU kernels, so no model is built: a tiny Llama ``config.json`` (no
weights, ``skip_tokenizer_init``) gives vLLM a real :class:`VllmConfig`, the per-layer KV
cache specs are declared by hand as ``get_kv_cache_specs`` would return them (a
``FullAttentionSpec``, ``SlidingWindowSpec`` or ``MambaSpec`` per layer, the drafter's
layer with ``is_draft=True``, page sizes equal through the head counts), and vLLM's own
planning functions then run in ``EngineCore._initialize_kv_caches``' order
(``get_global_kv_cache_groups``, ``get_kv_cache_configs``,
``generate_scheduler_kv_cache_config``, the block-size and alignment resolution) before
the real ``Scheduler`` (with its ``OffloadingConnector``) is constructed. A geometry vLLM
refuses is returned as :class:`Refused` with vLLM's message; so is one vLLM plans
otherwise than the geometry says (a block size, an EAGLE group on either side, a
sliding window's ``e``).

Geometry groups map to vLLM groups through the layers: group ``g`` of the geometry
declares ``group_counts[g]`` (``geometry.extra``, a preset's) groups' worth of layers, as
the model would, so a preset plans into the same number of vLLM groups.

What the build adapts to the installed release, found by introspection
(:mod:`kvcontract.live.capabilities`), never by its version:

* **Triton on x86 CPUs** (``cpu-requires-triton``): 0.34.0's ``CpuPlatform.
  check_and_update_config`` raises ``RuntimeError("vLLM on x86 CPUs requires Triton
  (triton-cpu).")`` when ``vllm.triton_utils.HAS_TRITON`` is false (it reads the flag
  when called). The live backend runs no kernel, so the build sets ``HAS_TRITON`` true
  around the config construction alone and restores it afterwards (only where that
  check exists); every engine says so in :attr:`LiveEngine.adaptations`.
* **Extra retained tokens** (``e > 0``): vLLM tags every ``SlidingWindowSpec`` with
  ``max(0, num_prefill_lookahead_tokens - 1)`` (``get_global_kv_cache_groups``), and
  ``num_prefill_lookahead_tokens`` is ``k`` for multi-module MTP (method ``mtp`` with
  ``min(num_nextn_predict_layers, k) > 1``, ``use_multi_module_mtp``), 1 for the other
  EAGLE-style drafters. So ``e`` is built from ``SpeculativeConfig(method="mtp",
  num_speculative_tokens=e + 1)`` over a local drafter ``config.json`` (a tiny
  DeepSeek-V3 one with ``num_nextn_predict_layers = e + 1``, no weights, which vLLM
  rewrites into ``deepseek_mtp``); 0.33.0 and 0.34.0 accept it on CPU. The EAGLE group
  (the MTP layer's group) is the one holding the declared ``is_draft`` layer; a geometry
  with ``e > 0`` and no EAGLE group is built with ``disable_eagle_block_drop=True``
  (else vLLM's GPU cache drops the trailing block of every group when no group is
  marked), and is refused where the release lacks that switch.
* **Lookahead block hashes** (``lookahead-block-hashes``): 0.34.0's connector hashes each
  block with the drafter's lookahead tokens by default, and then neither the GPU cache
  nor the connector drops an EAGLE group's trailing block (docs/CONTRACT.md 2.1). The
  build follows the geometry's ``hash_lookahead``: 0 asks for the legacy hashes
  (``disable_lookahead_block_hashes=True``), unless
  :attr:`BuildOptions.lookahead_block_hashes`, which builds the release's default and
  refuses the geometry as another plan (or builds it anyway with ``accept_other_plan``);
  ``k > 0`` keeps the release's default and is refused where the release has none.
  :attr:`LiveEngine.hash_lookahead_tokens` says how far the hashes reach.
* **Decode context parallelism** (``dcp > 1``): vLLM requires
  ``tensor_parallel_size % decode_context_parallel_size == 0``
  (``ParallelConfig``), so DCP needs at least ``dcp`` ranks; the live backend drives one
  rank (one host worker that reports each job once, a scheduler of one worker's KV-cache
  specs), so such a geometry is refused by :func:`unsupported`, saying so.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from kvcontract.live.capabilities import field_names, has, vllm_names
from kvcontract.live.env import require
from kvcontract.spec.geometry import Geometry, GroupKind, GroupSpec

LAYERS_PER_GROUP = 2
"""Layers declared per vLLM group (so an EAGLE group holds a target and a draft layer)."""
HEAD_SIZE = 8
VOCAB_SIZE = 1 << 20
"""Token ids of the traces stay below it."""
_PLAN_MEMORY = 1 << 34
"""Memory offered to the GPU cache before ``gpu_blocks`` caps it (bytes)."""


@dataclass(frozen=True)
class BuildOptions:
    """Settings of the engine around the geometry."""

    max_num_batched_tokens: int = 8192
    """The chunked-prefill budget per step (tokens)."""
    max_model_len: int = 32768
    max_num_seqs: int = 16
    gpu_blocks: int | None = None
    """GPU blocks per group (``num_gpu_blocks_override``); None: plenty."""
    cpu_chunks: int | None = None
    """Capacity of the CPU tier in chunks; None: plenty (no eviction)."""
    async_scheduling: bool = False
    """vLLM's ``AsyncScheduler`` (the CPU platform turns it off; turned back on here)."""
    offload_prompt_only: bool = True
    accept_other_plan: bool = False
    """Run even when vLLM plans other block sizes or EAGLE groups than the geometry's
    (by default that is :class:`Refused`: the run would not be about the geometry)."""
    lookahead_block_hashes: bool = False
    """Leave a drafter's block hashes at the release's default, where the release has
    lookahead block hashes (0.34.0: on with the OffloadingConnector; an EAGLE group then
    drops no block, so an EAGLE geometry is another plan). False: the legacy hashes the
    geometry's EAGLE groups state (``disable_lookahead_block_hashes``)."""


@dataclass
class LiveEngine:
    """The real objects: the config, the scheduler's KV-cache config, the scheduler (its
    ``connector`` is the ``OffloadingConnector``) and the request block hasher."""

    geometry: Geometry
    options: BuildOptions
    vllm_config: Any
    kv_cache_config: Any
    scheduler: Any
    block_hasher: Callable[[Any], list[Any]]
    group_of: tuple[int, ...]
    """Per vLLM KV-cache group, the geometry group it plans (index into ``groups``)."""
    tokens_per_chunk: tuple[int, ...]
    """Per vLLM group, its offload chunk in tokens."""
    scheduler_block_size: int
    hash_block_size: int
    cpu_chunks: int | None
    notes: tuple[str, ...] = ()
    """Where vLLM planned otherwise than the geometry (a refusal, unless
    ``accept_other_plan``)."""
    hash_lookahead_tokens: int = 0
    """Tokens past each block its hash covers (``VllmConfig.num_hash_lookahead_tokens``;
    0: the legacy hashes)."""
    adaptations: tuple[str, ...] = ()
    """What the build did to fit the installed release (see the module docstring)."""

    @property
    def connector_scheduler(self) -> Any:
        return self.scheduler.connector.connector_scheduler


@dataclass(frozen=True)
class Refused:
    """vLLM (or the live backend) would not build the geometry."""

    geometry: Geometry
    reason: str
    by_vllm: bool = True
    """False when the live backend itself cannot declare it (not a vLLM verdict)."""


@dataclass
class _Scratch:
    folder: str = field(default_factory=lambda: tempfile.mkdtemp(prefix="kvcontract-live-"))

    def config(self, name: str, data: dict[str, Any]) -> str:
        path = os.path.join(self.folder, name)
        os.makedirs(path, exist_ok=True)
        with open(os.path.join(path, "config.json"), "w", encoding="utf-8") as handle:
            json.dump(data, handle)
        return path


_SCRATCH: _Scratch | None = None


def _scratch() -> _Scratch:
    global _SCRATCH
    if _SCRATCH is None:
        _SCRATCH = _Scratch()
    return _SCRATCH


def tiny_llama_config(max_model_len: int, *, architecture: str = "LlamaForCausalLM",
                      layers: int = 2) -> dict[str, Any]:
    """A tiny Llama ``config.json`` (no weights): what ``ModelConfig`` inspects."""
    return {
        "architectures": [architecture], "model_type": "llama", "hidden_size": 64,
        "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 4,
        "num_hidden_layers": layers, "vocab_size": VOCAB_SIZE,
        "max_position_embeddings": max_model_len, "torch_dtype": "float32",
        "rms_norm_eps": 1e-5,
    }


def tiny_mtp_config(max_model_len: int, modules: int) -> dict[str, Any]:
    """A tiny DeepSeek-V3 ``config.json`` with ``modules`` MTP modules (no weights): the
    drafter vLLM's ``SpeculativeConfig(method="mtp")`` rewrites into ``deepseek_mtp``."""
    return {
        "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
        "hidden_size": 64, "intermediate_size": 128, "moe_intermediate_size": 32,
        "num_attention_heads": 4, "num_key_value_heads": 4, "num_hidden_layers": 1,
        "vocab_size": VOCAB_SIZE, "max_position_embeddings": max_model_len,
        "torch_dtype": "float32", "rms_norm_eps": 1e-5,
        "num_nextn_predict_layers": modules, "kv_lora_rank": 16, "q_lora_rank": None,
        "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 8,
        "n_routed_experts": 4, "n_shared_experts": 1, "num_experts_per_tok": 2,
        "first_k_dense_replace": 1, "moe_layer_freq": 1, "n_group": 1, "topk_group": 1,
    }


def extra_retained(geometry: Geometry) -> int:
    """The geometry's ``e`` (every sliding-window group's; 0 without one)."""
    return max((g.extra_retained_tokens for g in geometry.groups
                if g.kind is GroupKind.SLIDING_WINDOW), default=0)


def unsupported(geometry: Geometry) -> str | None:
    """Why the live backend cannot declare ``geometry`` (None when it can)."""
    if geometry.dcp != 1:
        return (f"decode context parallelism (dcp {geometry.dcp}) needs at least {geometry.dcp} "
                "ranks: vLLM requires tensor_parallel_size % decode_context_parallel_size "
                "== 0 (ParallelConfig), and the live backend drives one rank (one host "
                "worker, one worker's KV-cache specs)")
    if sum(g.eagle for g in geometry.groups) > 1:
        return "more than one EAGLE group: the live backend declares one drafter layer"
    if any(g.extra_retained_tokens for g in geometry.groups
           if g.kind is not GroupKind.SLIDING_WINDOW):
        return ("extra retained tokens on a group that is not a sliding window: vLLM "
                "tags sliding-window specs alone (get_global_kv_cache_groups)")
    return None


def _speculator_method(geometry: Geometry) -> str:
    name = str(geometry.extra.get("speculator") or "")
    return "eagle3" if "3" in name else "eagle"


def layer_specs(geometry: Geometry, dtype: Any = None) -> tuple[dict[str, Any], list[int]]:
    """The per-layer KV-cache specs of ``geometry`` as vLLM's ``get_kv_cache_specs``
    would return them, and per layer the geometry group it belongs to. Page sizes are
    equal across groups (head counts ``lcm(block sizes) / bs``), as page-size unification
    would make them, so vLLM keeps every block size."""
    import torch
    (FullAttentionSpec, MambaSpec, SlidingWindowSpec) = vllm_names(
        "vllm.v1.kv_cache_interface", "FullAttentionSpec", "MambaSpec", "SlidingWindowSpec")

    dtype = dtype or torch.float32
    unit = math.lcm(*(g.block_size for g in geometry.groups))
    page_bytes = 2 * unit * HEAD_SIZE * 4
    counts = list(geometry.extra.get("group_counts") or [1] * len(geometry.groups))
    if len(counts) != len(geometry.groups):
        counts = [1] * len(geometry.groups)
    specs: dict[str, Any] = {}
    owners: list[int] = []
    index = 0
    for g, group in enumerate(geometry.groups):
        layers = max(1, int(counts[g])) * LAYERS_PER_GROUP
        for n in range(layers):
            draft = group.eagle and n == layers - 1
            specs[f"model.layers.{index}.self_attn.attn"] = _spec(
                group, unit, page_bytes, dtype, draft,
                FullAttentionSpec, SlidingWindowSpec, MambaSpec)
            owners.append(g)
            index += 1
    return specs, owners


def _spec(group: GroupSpec, unit: int, page_bytes: int, dtype: Any, draft: bool,
          full: Any, sliding: Any, mamba: Any) -> Any:
    heads = unit // group.block_size
    if group.kind is GroupKind.FULL:
        cls, kwargs = full, {"num_kv_heads": heads, "head_size": HEAD_SIZE, "dtype": dtype}
    elif group.kind is GroupKind.SLIDING_WINDOW:
        cls, kwargs = sliding, {"num_kv_heads": heads, "head_size": HEAD_SIZE,
                                "dtype": dtype, "sliding_window": group.sliding_window}
    else:
        cls, kwargs = mamba, {"shapes": ((page_bytes // 4,),), "dtypes": (dtype,),
                              "mamba_cache_mode": "align"}
    # 0.33 marks drafter layers (KVCacheSpec.is_draft); 0.31 has no such field and finds
    # EAGLE groups by other rules (a spec marker, the trailing MTP layer).
    if "is_draft" in {f.name for f in dataclasses.fields(cls)}:
        kwargs["is_draft"] = draft
    return cls(block_size=group.block_size, **kwargs)


def build(geometry: Geometry, options: BuildOptions | None = None) -> LiveEngine | Refused:
    """The real vLLM engine pieces for ``geometry``, or why they cannot be built."""
    require()
    options = options or BuildOptions()
    reason = unsupported(geometry)
    if reason is not None:
        return Refused(geometry, reason, by_vllm=False)
    try:
        engine = _build(geometry, options)
    except _Unsupported as exc:
        return Refused(geometry, str(exc), by_vllm=False)
    except _NotInRelease as exc:
        return Refused(geometry, str(exc))  # the release has no such configuration
    except (ValueError, AssertionError, TypeError, NotImplementedError) as exc:
        return Refused(geometry, f"{type(exc).__name__}: {exc}".strip())
    except Exception as exc:  # pydantic's ValidationError and vLLM's own errors
        if type(exc).__name__ in ("ValidationError", "VLLMValidationError"):
            return Refused(geometry, f"{type(exc).__name__}: {exc}".strip())
        raise
    differs = [note for note in engine.notes if not note.startswith("vLLM hashes")]
    if differs and not options.accept_other_plan:
        # vLLM planned another geometry (a block size, an EAGLE group, merged groups):
        # what runs would not be the geometry asked about.
        engine.scheduler.shutdown()
        return Refused(geometry, "vLLM plans another geometry: " + "; ".join(differs))
    return engine


def gpu_blocks(geometry: Geometry, options: BuildOptions) -> int:
    """GPU blocks of the pool: ``options.gpu_blocks``, else room for two requests of the
    model length per vLLM group in the smallest block size (a pool of millions of blocks
    costs seconds to build and nothing in behaviour)."""
    if options.gpu_blocks is not None:
        return options.gpu_blocks
    smallest = min(g.block_size for g in geometry.groups)
    counts = geometry.extra.get("group_counts") or [1] * len(geometry.groups)
    groups = sum(max(1, int(c)) for c in counts)
    return 2 * groups * -(-options.max_model_len // smallest) + 64


@contextlib.contextmanager
def _triton_for_config() -> Iterator[list[str]]:
    """``vllm.triton_utils.HAS_TRITON`` true while the config is built, where the
    installed release's CPU platform refuses to build one without Triton (capability
    ``cpu-requires-triton``); restored afterwards. Yields the adaptations made."""
    if not has("cpu-requires-triton"):
        yield []
        return
    triton_utils = vllm_names("vllm", "triton_utils")
    before = triton_utils.HAS_TRITON
    triton_utils.HAS_TRITON = True
    try:
        yield ["vllm.triton_utils.HAS_TRITON set true while the VllmConfig was built "
               "(CpuPlatform.check_and_update_config requires Triton on x86; no kernel "
               "runs here)"]
    finally:
        triton_utils.HAS_TRITON = before


def _speculative_config(geometry: Geometry, options: BuildOptions, model: Any,
                        adaptations: list[str]) -> Any:
    """The speculative config that plans the geometry's EAGLE group and ``e``, or None
    (see the module docstring)."""
    config = vllm_names("vllm", "config")

    e = extra_retained(geometry)
    eagle = any(g.eagle for g in geometry.groups)
    if not e and not eagle:
        return None
    scratch = _scratch()
    switches = field_names(config.SpeculativeConfig)
    kwargs: dict[str, Any] = {}
    if e:
        method, tokens = "mtp", e + 1
        drafter = scratch.config(f"drafter-mtp{tokens}-{options.max_model_len}",
                                 tiny_mtp_config(options.max_model_len, tokens))
        if not eagle:
            if "disable_eagle_block_drop" not in switches:
                raise _Unsupported(
                    "e > 0 without an EAGLE group: vLLM's MTP drafter drops the trailing "
                    "block of every group when none holds a draft layer, and this release "
                    "has no SpeculativeConfig.disable_eagle_block_drop to turn that off")
            kwargs["disable_eagle_block_drop"] = True
            adaptations.append("disable_eagle_block_drop=True: an MTP drafter without an "
                               "EAGLE group (the geometry's e > 0, no EAGLE group)")
    else:
        method, tokens = _speculator_method(geometry), 1
        architecture = ("Eagle3LlamaForCausalLM" if method == "eagle3"
                        else "EagleLlamaForCausalLM")
        drafter = scratch.config(f"drafter-{method}-{options.max_model_len}",
                                 tiny_llama_config(options.max_model_len, layers=1,
                                                   architecture=architecture))
    if geometry.hash_lookahead and not has("lookahead-block-hashes"):
        raise _NotInRelease(
            f"the geometry asks for lookahead block hashes ({geometry.hash_lookahead} "
            "token(s)), and this release's OffloadingConnector has none "
            "(supports_lookahead_block_hashes)")
    if (not geometry.hash_lookahead and not options.lookahead_block_hashes
            and has("lookahead-block-hashes")
            and "disable_lookahead_block_hashes" in switches):
        kwargs["disable_lookahead_block_hashes"] = True
        adaptations.append("disable_lookahead_block_hashes=True: the legacy block hashes "
                           "(the connector's default hashes each block with the drafter's "
                           "lookahead tokens, and an EAGLE group then drops no block)")
    return config.SpeculativeConfig(
        method=method, model=drafter, num_speculative_tokens=tokens,
        target_model_config=model, target_parallel_config=config.ParallelConfig(),
        **kwargs)


class _NotInRelease(Exception):
    """The geometry asks for a configuration the release does not have (vLLM's verdict:
    no such engine exists in it, not a gap of the driver)."""


class _Unsupported(Exception):
    """The live backend cannot declare the geometry on the installed release."""


def _vllm_config(geometry: Geometry, options: BuildOptions, cpu_bytes: int,
                 adaptations: list[str]) -> Any:
    config = vllm_names("vllm", "config")

    scratch = _scratch()
    target = scratch.config(f"target-{options.max_model_len}",
                            tiny_llama_config(options.max_model_len))
    base = int(geometry.extra.get("base_block_size")
               or min(g.block_size for g in geometry.groups))
    has_mamba = any(g.kind is GroupKind.MAMBA for g in geometry.groups)
    cache_kwargs: dict[str, Any] = {}
    if has_mamba:
        cache_kwargs["mamba_cache_mode"] = "align"
    if geometry.hash_block_size != math.gcd(*(g.block_size for g in geometry.groups)):
        # A hash block finer than the blocks (partial tails need one): vLLM's
        # prefix_match_unit, which resolve_kv_cache_block_sizes takes as the hash block.
        cache_kwargs["prefix_match_unit"] = geometry.hash_block_size
    extra: dict[str, Any] = {"cpu_bytes_to_use": cpu_bytes,
                             "blocks_per_chunk": geometry.blocks_per_chunk}
    if not options.offload_prompt_only:
        extra["offload_prompt_only"] = False
    with _triton_for_config() as triton:
        model = config.ModelConfig(model=target, skip_tokenizer_init=True,
                                   max_model_len=options.max_model_len, dtype="float32")
        cache = config.CacheConfig(block_size=base, enable_prefix_caching=True,
                                   prefix_cache_retention_interval=geometry.retention_interval,
                                   num_gpu_blocks_override=gpu_blocks(geometry, options),
                                   **cache_kwargs)
        transfer = config.KVTransferConfig(kv_connector="OffloadingConnector",
                                           kv_role="kv_both", kv_connector_extra_config=extra)
        scheduler = config.SchedulerConfig(
            max_num_batched_tokens=options.max_num_batched_tokens,
            # vLLM asks for a budget of at least one token per sequence
            max_num_seqs=max(1, min(options.max_num_seqs, options.max_num_batched_tokens)),
            max_model_len=options.max_model_len, enable_chunked_prefill=True,
            is_encoder_decoder=False)
        speculative = _speculative_config(geometry, options, model, adaptations)
        built = config.VllmConfig(model_config=model, cache_config=cache,
                                  kv_transfer_config=transfer, scheduler_config=scheduler,
                                  speculative_config=speculative)
    adaptations += triton
    if options.async_scheduling:
        built.scheduler_config.async_scheduling = True
    return built


def _build(geometry: Geometry, options: BuildOptions, *, cpu_bytes: int = 1 << 32,
           ) -> LiveEngine:
    connector = vllm_names(
        "vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector",
        "OffloadingConnector")
    get_hash_fn_by_name = vllm_names("vllm.utils.hashing", "get_hash_fn_by_name")
    resolve_kv_cache_layout = vllm_names("vllm.v1.attention.backends.utils",
                                         "resolve_kv_cache_layout")
    planning = _optional_module("vllm.v1.core.kv_cache_planning")
    utils = vllm_names("vllm.v1.core", "kv_cache_utils")
    register_all_kvcache_specs = vllm_names("vllm.v1.core.single_type_kv_cache_manager",
                                            "register_all_kvcache_specs")
    structured_output_manager = vllm_names("vllm.v1.structured_output",
                                           "StructuredOutputManager")

    adaptations: list[str] = []
    config = _vllm_config(geometry, options, cpu_bytes, adaptations)
    register_all_kvcache_specs(config)
    specs, owners = layer_specs(geometry)
    owner_of = dict(zip(specs, owners, strict=True))
    # The layout the connector requires, as the engine resolves it before planning.
    config.cache_config.kv_cache_layout = connector.get_required_kvcache_layout(
        config)
    resolve_kv_cache_layout(config, [[config.cache_config.kv_cache_layout]],
                            list(specs.values()))
    memory = _PLAN_MEMORY
    if planning is not None:  # 0.33: the whole model's groups first, then the configs
        global_groups = planning.get_global_kv_cache_groups(config, [specs])
        config.adjust_dcp_kv_cache_interleave_size(global_groups)
        configs = planning.get_kv_cache_configs(config, [specs], [memory], global_groups)
    else:  # 0.31: one call groups and sizes
        configs = utils.get_kv_cache_configs(config, [specs], [memory])
    for kv_config in configs:
        kv_config.kv_cache_layout = config.cache_config.kv_cache_layout
    scheduler_config = utils.generate_scheduler_kv_cache_config(configs)
    config.cache_config.num_gpu_blocks = scheduler_config.num_blocks
    groups = scheduler_config.kv_cache_groups
    participating = [g.kv_cache_spec.block_size for g in groups
                     if g.kv_cache_spec.prefix_cacheable]
    config.cache_config.block_size = min(participating or
                                         [g.kv_cache_spec.block_size for g in groups])
    utils.update_kv_cache_capacity(config, scheduler_config)
    config.validate_block_size()
    block_size, hash_block_size = utils.resolve_kv_cache_block_sizes(scheduler_config, config)
    if hasattr(utils, "resolve_cache_hit_alignment_tokens"):  # 0.33
        alignment = utils.resolve_cache_hit_alignment_tokens(scheduler_config, config,
                                                             block_size, hash_block_size)
        for kv_config in (*configs, scheduler_config):
            kv_config.hash_block_size = hash_block_size
            kv_config.cache_hit_alignment_tokens = alignment
    Scheduler = vllm_names("vllm.v1.core.sched.scheduler", "Scheduler")
    scheduler_cls: Any = Scheduler
    if config.scheduler_config.async_scheduling:
        AsyncScheduler = vllm_names("vllm.v1.core.sched.async_scheduler", "AsyncScheduler")
        scheduler_cls = AsyncScheduler
    scheduler = scheduler_cls(
        vllm_config=config, kv_cache_config=scheduler_config,
        structured_output_manager=structured_output_manager(config),
        block_size=block_size, hash_block_size=hash_block_size)
    hash_fn = get_hash_fn_by_name(config.cache_config.prefix_caching_hash_algo)
    utils.init_none_hash(hash_fn)
    lookahead = getattr(config, "num_hash_lookahead_tokens", None)
    hasher = (utils.get_request_block_hasher(hash_block_size, hash_fn) if lookahead is None
              else utils.get_request_block_hasher(hash_block_size, hash_fn, lookahead))
    group_of = tuple(owner_of[g.layer_names[0]] for g in groups)
    bpc = geometry.blocks_per_chunk
    tpc = tuple(g.kv_cache_spec.block_size * bpc for g in groups)
    notes = _notes(geometry, groups, group_of, hash_block_size,
                   _gpu_eagle_groups(scheduler), int(lookahead or 0))
    engine = LiveEngine(geometry, options, config, scheduler_config, scheduler, hasher,
                        group_of, tpc, block_size, hash_block_size, None, notes,
                        int(lookahead or 0), tuple(adaptations))
    capacity = _cpu_capacity(engine)
    engine.cpu_chunks = capacity
    if options.cpu_chunks is not None and capacity:
        # The CPU tier is sized in bytes (cpu_bytes_to_use): the bytes of one chunk, as
        # the spec computes them, times the chunks asked for.
        per_chunk = cpu_bytes // capacity
        engine.scheduler.shutdown()
        engine = _build(geometry, replace(options, cpu_chunks=None),
                        cpu_bytes=options.cpu_chunks * per_chunk)
        engine.options = options
    return engine


def _optional_module(name: str) -> Any:
    """The module ``name`` of the installed vLLM, None when the release has none."""
    try:
        return vllm_names(*name.rsplit(".", 1))
    except (ImportError, AttributeError):
        return None


def _cpu_capacity(engine: LiveEngine) -> int | None:
    manager = engine.connector_scheduler.manager
    value = getattr(manager, "_num_chunks", None)
    return int(value) if isinstance(value, int) else None


def _gpu_eagle_groups(scheduler: Any) -> set[int] | None:
    """The vLLM groups whose trailing block the GPU prefix cache drops (EAGLE), None
    where the coordinator does not say."""
    coordinator = getattr(getattr(scheduler, "kv_cache_manager", None), "coordinator", None)
    dropped = getattr(coordinator, "drop_eagle_group_ids", None)
    return None if dropped is None else {int(g) for g in dropped}


def _notes(geometry: Geometry, groups: Any, group_of: tuple[int, ...],
           hash_block_size: int, gpu_eagle: set[int] | None = None,
           hash_lookahead: int = 0) -> tuple[str, ...]:
    notes: list[str] = []
    for v, g in enumerate(group_of):
        declared = geometry.groups[g]
        spec = groups[v].kv_cache_spec
        if spec.block_size != declared.block_size:
            notes.append(f"vLLM group {v} (geometry group {g}) has block size "
                         f"{spec.block_size}, the geometry {declared.block_size}")
        # The contract's EAGLE drop (docs/CONTRACT.md 2.1): an EAGLE group under legacy
        # hashes; under lookahead hashes the group is EAGLE but drops nothing.
        drops = bool(groups[v].is_eagle_group) and not hash_lookahead
        declared_drops = geometry.drops_eagle_block(declared)
        if bool(groups[v].is_eagle_group) != declared.eagle or drops != declared_drops:
            why = (f" (its block hashes reach {hash_lookahead} lookahead token(s): no "
                   "block is dropped)" if groups[v].is_eagle_group and hash_lookahead else "")
            notes.append(f"vLLM group {v} (geometry group {g}) is "
                         f"{'' if groups[v].is_eagle_group else 'not '}an EAGLE group{why}, "
                         f"the geometry's {'drops' if declared_drops else 'keeps'} its "
                         "trailing block")
        elif gpu_eagle is not None and (v in gpu_eagle) != declared_drops:
            notes.append(f"vLLM's GPU prefix cache {'drops' if v in gpu_eagle else 'keeps'}"
                         f" the trailing block of vLLM group {v} (geometry group {g}), "
                         f"which the geometry {'does not' if v in gpu_eagle else 'does'} "
                         "make an EAGLE group")
        retained = int(getattr(spec, "extra_retained_tokens", 0) or 0)
        if declared.kind is GroupKind.SLIDING_WINDOW and retained != \
                declared.extra_retained_tokens:
            notes.append(f"vLLM group {v} (geometry group {g}) retains e = {retained} "
                         f"extra tokens, the geometry {declared.extra_retained_tokens}")
    if set(group_of) != set(range(len(geometry.groups))):
        notes.append("some geometry groups share one vLLM group (identical specs)")
    if hash_block_size != geometry.hash_block_size:
        notes.append(f"vLLM hashes in blocks of {hash_block_size}, the geometry "
                     f"{geometry.hash_block_size}")
    if hash_lookahead != geometry.hash_lookahead:
        notes.append(f"vLLM's block hashes reach {hash_lookahead} lookahead token(s), the "
                     f"geometry's {geometry.hash_lookahead}")
    return tuple(notes)
