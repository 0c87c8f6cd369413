"""What the installed vLLM offers that the live driver needs, found by introspection.

The live backend drives whatever vLLM is installed; it never asks which release that
is. Each :class:`Capability` is one API the driver reads or calls (a module, a class, a
dataclass field, a parameter, a method), looked up by ``importlib``, ``hasattr``,
:func:`inspect.signature` and :func:`dataclasses.fields`, or, for the few behaviours
that have no API of their own, by the shape of the release's own function (its AST):
never by a version string.

A capability is *required* when the driver cannot run without it
(:attr:`Capabilities.missing`: :func:`kvcontract.live.env.check` fails naming the API),
else it selects one of the driver's paths: what the driver does with it and without it
is its ``use``. :func:`capabilities` computes the record once per process (it imports
vLLM); ``kvcontract live --check`` prints it.

Releases known to work are listed in :data:`kvcontract.releases.LIVE_RELEASES` for the
README only.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import importlib
import inspect
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


def vllm_names(module: str, *names: str) -> Any:
    """``getattr(import_module(module), name)`` (or the submodule ``module.name``) for
    each of ``names`` (one value for one name, a tuple for several). The live backend
    reaches vLLM only through this: vLLM is typed ``Any`` here, so a type check never
    walks vLLM's sources (whether or not the wheel is installed) and reads the same
    either way."""
    loaded = importlib.import_module(module)
    values = tuple(getattr(loaded, name) if hasattr(loaded, name)
                   else importlib.import_module(f"{module}.{name}") for name in names)
    return values[0] if len(values) == 1 else values


OFFLOADING = "vllm.distributed.kv_transfer.kv_connector.v1.offloading"
CONNECTOR = "vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector"


@dataclass(frozen=True)
class Capability:
    """One API of the installed vLLM the driver depends on."""

    name: str
    api: str
    """The vLLM API looked up (module, qualified name, field or parameter)."""
    present: bool | None
    """None: it could not be told (the API it is read from is absent or reshaped)."""
    required: bool
    use: str
    """What the driver does with it, and without it."""

    @property
    def missing(self) -> bool:
        return self.required and not self.present

    def line(self) -> str:
        mark = {True: "yes", False: "no", None: "unknown"}[self.present]
        need = " (required)" if self.required else ""
        return f"{self.name}: {mark}{need} [{self.api}]"

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "api": self.api, "present": self.present,
                "required": self.required, "use": self.use}


@dataclass(frozen=True)
class Capabilities:
    """What the installed vLLM offers, by capability name."""

    found: tuple[Capability, ...]

    def get(self, name: str) -> Capability:
        for capability in self.found:
            if capability.name == name:
                return capability
        raise KeyError(f"no capability {name!r}; known: "
                       f"{', '.join(c.name for c in self.found)}")

    def has(self, name: str) -> bool:
        """Whether ``name`` is present (False when absent or unknown)."""
        return self.get(name).present is True

    @property
    def missing(self) -> tuple[Capability, ...]:
        """Required capabilities the installed vLLM lacks."""
        return tuple(c for c in self.found if c.missing)

    def lines(self) -> list[str]:
        return [c.line() for c in self.found]

    def to_json(self) -> dict[str, Any]:
        return {c.name: c.to_json() for c in self.found}


# -- introspection helpers ------------------------------------------------------------------
def _name(module: str, name: str) -> Any:
    """``module.name`` of the installed vLLM, None when the release has none."""
    try:
        return vllm_names(module, name)
    except (ImportError, AttributeError):
        return None


def field_names(cls: Any) -> set[str]:
    """The dataclass fields of ``cls`` (its annotations for a NamedTuple), empty if
    neither."""
    if cls is None:
        return set()
    if dataclasses.is_dataclass(cls):
        return {f.name for f in dataclasses.fields(cls)}
    return set(getattr(cls, "_fields", ()))


def init_field_names(cls: Any) -> set[str]:
    """The dataclass fields ``cls(...)`` accepts (``init=True``)."""
    if cls is None or not dataclasses.is_dataclass(cls):
        return set(getattr(cls, "_fields", ()))
    return {f.name for f in dataclasses.fields(cls) if f.init}


def parameters(function: Any) -> set[str]:
    """The parameter names of ``function`` (empty when it has no signature)."""
    if function is None:
        return set()
    try:
        return set(inspect.signature(function).parameters)
    except (TypeError, ValueError):
        return set()


def _function_tree(function: Any) -> ast.FunctionDef | None:
    """The AST of ``function``'s definition, None when its source cannot be read."""
    try:
        source = textwrap.dedent(inspect.getsource(function))
    except (OSError, TypeError):
        return None
    node = ast.parse(source).body[0]
    return node if isinstance(node, ast.FunctionDef) else None


def _raises_when_untrue(function: Any, flag: str) -> bool | None:
    """Whether ``function`` has an ``if ... not FLAG ...:`` whose body raises (None when
    its source cannot be read)."""
    tree = _function_tree(function)
    if tree is None:
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and flag in ast.unparse(node.test) and \
                any(isinstance(n, ast.Raise) for n in ast.walk(ast.Module(node.body, []))):
            return True
    return False


def _first_line(tree: ast.AST, match: Callable[[ast.AST], bool]) -> int | None:
    lines = [getattr(n, "lineno", 0) for n in ast.walk(tree) if match(n)]
    return min(lines) if lines else None


def swa_reserve_before_clamps(function: Any) -> bool | None:
    """Whether ``_lookup_complete_chunks`` takes the sliding-window groups' last prompt
    token off (``max_hit_size_tokens -= 1``) before the load-budget clamps
    (``max_num_new_tokens``): a clamped boundary is then kept as it is. None when the
    shape is not found."""
    tree = _function_tree(function)
    if tree is None:
        return None
    reserve = _first_line(tree, lambda n: isinstance(n, ast.AugAssign)
                          and isinstance(n.op, ast.Sub)
                          and ast.unparse(n.target) == "max_hit_size_tokens")
    clamp = _first_line(tree, lambda n: isinstance(n, ast.If)
                        and "max_num_new_tokens" in ast.unparse(n.test))
    if reserve is None or clamp is None:
        return None
    return reserve < clamp


def null_page_placeholders(function: Any) -> bool | None:
    """Whether ``_build_store_jobs`` hands a chunk's null GPU pages (block id 0) to the
    store job as placeholders (the source block appended before the null test) rather
    than leaving them out. None when the shape is not found."""
    tree = _function_tree(function)
    if tree is None:
        return None
    for node in ast.walk(tree):
        if not isinstance(node, ast.For):
            continue
        body = [ast.unparse(statement) for statement in node.body]
        append = next((i for i, s in enumerate(body)
                       if s.startswith("src_block_ids.append(block_id)")), None)
        skip = next((i for i, s in enumerate(body)
                     if s.startswith("if block_id == 0:") and "continue" in s), None)
        if append is not None and skip is not None:
            return append < skip
    return None


# -- the probes -----------------------------------------------------------------------------
@dataclass(frozen=True)
class _Probe:
    name: str
    api: str
    required: bool
    use: str
    find: Callable[[], bool | None]


def _has(module: str, name: str) -> Callable[[], bool]:
    return lambda: _name(module, name) is not None


def _has_attr(module: str, name: str, attribute: str) -> Callable[[], bool]:
    return lambda: hasattr(_name(module, name), attribute)


def _has_field(module: str, name: str, field_name: str) -> Callable[[], bool]:
    return lambda: field_name in field_names(_name(module, name))


def _has_api(name: str, api: str, required: bool, use: str,
             test: Callable[..., Callable[[], bool]] = _has) -> _Probe:
    """The probe ``name`` that ``api`` exists: ``test`` on the API's dotted parts (for
    :func:`_has` the module and the name in it; for :func:`_has_attr` and
    :func:`_has_field` the module, the class and its member)."""
    parts = api.rsplit(".", 1 if test is _has else 2)
    return _Probe(name, api, required, use, test(*parts))


def _all(*checks: Callable[[], bool | None]) -> Callable[[], bool]:
    return lambda: all(check() is True for check in checks)


def _cpu_requires_triton() -> bool | None:
    platform = _name("vllm.platforms.cpu", "CpuPlatform")
    if platform is None:
        return False
    return _raises_when_untrue(platform.check_and_update_config, "HAS_TRITON")


def _method(module: str, cls: str, method: str) -> Any:
    return getattr(_name(module, cls), method, None)


SCHEDULER_MODULE = f"{OFFLOADING}.scheduler"

PROBES: tuple[_Probe, ...] = (
    # -- required: the driver has no other path ----------------------------------------
    _Probe("scheduler", "vllm.v1.core.sched.scheduler.Scheduler(vllm_config, "
           "kv_cache_config, structured_output_manager, block_size, hash_block_size)", True,
           "the scheduler the driver steps (schedule, update_from_output)",
           lambda: {"vllm_config", "kv_cache_config", "structured_output_manager",
                    "block_size", "hash_block_size"} <= parameters(
               _name("vllm.v1.core.sched.scheduler", "Scheduler"))),
    _has_api("offloading-connector", f"{CONNECTOR}.OffloadingConnector", True,
             "the connector under test"),
    _Probe("model-runner-output", "vllm.v1.outputs.ModelRunnerOutput(req_ids, "
           "sampled_token_ids, kv_connector_output)", True,
           "the stand-in model output of each step",
           lambda: {"req_ids", "sampled_token_ids", "kv_connector_output"}
           <= init_field_names(_name("vllm.v1.outputs", "ModelRunnerOutput"))),
    _Probe("connector-output", "vllm.v1.outputs.KVConnectorOutput(finished_recving, "
           "kv_connector_worker_meta)", True, "how the host worker reports jobs",
           lambda: {"finished_recving", "kv_connector_worker_meta"}
           <= init_field_names(_name("vllm.v1.outputs", "KVConnectorOutput"))),
    _Probe("worker-metadata", f"{OFFLOADING}.common.OffloadingWorkerMetadata"
           "(completed_jobs)", True, "the completed jobs the host worker reports",
           _has_field(f"{OFFLOADING}.common", "OffloadingWorkerMetadata", "completed_jobs")),
    _has_api("offload-group-index", "vllm.v1.kv_offload.base.get_offload_group_idx", True,
             "names the vLLM group of an offload key"),
    _Probe("request-block-hasher", "vllm.v1.request.Request(..., block_hasher=)", True,
           "the driver's requests hash their blocks as the engine's do",
           lambda: "block_hasher" in parameters(_name("vllm.v1.request", "Request"))),
    _Probe("kv-cache-planning", "vllm.v1.core.kv_cache_planning.get_global_kv_cache_groups "
           "or vllm.v1.core.kv_cache_utils.get_kv_cache_configs", True,
           "plans the geometry's KV cache as EngineCore does",
           lambda: _name("vllm.v1.core.kv_cache_planning", "get_global_kv_cache_groups")
           is not None or _name("vllm.v1.core.kv_cache_utils", "get_kv_cache_configs")
           is not None),
    # -- planning -------------------------------------------------------------------------
    _Probe("planning-module", "vllm.v1.core.kv_cache_planning", False,
           "yes: the whole model's groups first (get_global_kv_cache_groups), then the "
           "configs; no: kv_cache_utils.get_kv_cache_configs in one call",
           _has("vllm.v1.core.kv_cache_planning", "get_global_kv_cache_groups")),
    _Probe("draft-specs", "vllm.v1.kv_cache_interface.KVCacheSpec.is_draft", False,
           "yes: the drafter's layer is declared is_draft (vLLM marks its group EAGLE); "
           "no: vLLM finds EAGLE groups by other rules (an EAGLE geometry may be refused)",
           _has_field("vllm.v1.kv_cache_interface", "FullAttentionSpec", "is_draft")),
    _has_api("cache-hit-alignment",
             "vllm.v1.core.kv_cache_utils.resolve_cache_hit_alignment_tokens", False,
             "yes: the hit alignment is resolved as EngineCore resolves it"),
    _has_api("prefix-match-unit", "vllm.config.CacheConfig.prefix_match_unit", False,
             "yes: a hash block finer than the blocks is asked for (partial tails); no: "
             "such a geometry is planned with vLLM's own hash block (refused if it differs)",
             _has_field),
    _Probe("cpu-requires-triton",
           "vllm.platforms.cpu.CpuPlatform.check_and_update_config (raises without "
           "vllm.triton_utils.HAS_TRITON)", False,
           "yes: the build sets HAS_TRITON true around the config construction alone "
           "(the live backend runs no kernel), restored afterwards",
           _cpu_requires_triton),
    _has_api("hash-lookahead-tokens", "vllm.config.VllmConfig.num_hash_lookahead_tokens",
             False, "yes: the request block hasher covers the tokens the config says", _has_attr),
    _has_api("lookahead-block-hashes",
             f"{CONNECTOR}.OffloadingConnector.supports_lookahead_block_hashes", False,
             "yes: with a drafter, the connector's default hashes each block with the "
             "drafter's lookahead tokens and drops no EAGLE block; the build asks for the "
             "legacy hashes (SpeculativeConfig.disable_lookahead_block_hashes) unless "
             "BuildOptions.lookahead_block_hashes", _has_attr),
    _has_api("lookahead-hash-switch",
             "vllm.config.SpeculativeConfig.disable_lookahead_block_hashes", False,
             "yes: the build can ask a drafter's legacy hashes", _has_field),
    _has_api("eagle-block-drop-switch",
             "vllm.config.SpeculativeConfig.disable_eagle_block_drop", False,
             "yes: an MTP geometry without EAGLE groups (e > 0) is built with the trailing-"
             "block drop off; no: such a geometry is refused", _has_field),
    _has_api("multi-module-mtp", "vllm.config.SpeculativeConfig.use_multi_module_mtp", False,
             "yes: e > 0 is built from an MTP drafter (num_prefill_lookahead_tokens - 1)",
             _has_attr),
    # -- the driver's calls -----------------------------------------------------------
    _has_api("model-output-index-map", "vllm.v1.outputs.ModelRunnerOutput.req_id_to_index",
             False, "yes: the stand-in model output carries the request index map", _has_field),
    _has_api("failed-recving", "vllm.v1.outputs.KVConnectorOutput.failed_recving", False,
             "yes: a failed load can be reported to the scheduler (Timing fail); no: "
             "the fail timing is not replayable", _has_field),
    _has_api("key-positions", "vllm.v1.kv_offload.base.ReqContext.get_offload_key_position",
             False, "yes: a key's chunk is its position; no: its index in the request's keys",
             _has_attr),
    _has_api("request-offload-state", f"{SCHEDULER_MODULE}.RequestOffloadState", False,
             "yes: fixtures compute offload keys with vLLM's own RequestOffloadState; no: "
             "fixtures are not replayable"),
    _Probe("finish-requests", "vllm.v1.core.sched.scheduler.Scheduler.finish_requests("
           "request_ids, finished_status)", False,
           "yes: aborts and finishes reach the scheduler; no: such a run stops on a driver "
           "gap", lambda: {"request_ids", "finished_status"} <= parameters(_method(
               "vllm.v1.core.sched.scheduler", "Scheduler", "finish_requests"))),
    _Probe("preempt-request", "vllm.v1.core.sched.scheduler.Scheduler._preempt_request("
           "request, timestamp)", False,
           "yes: the session preempts through the scheduler's own call; no: preempt is "
           "not replayable",
           lambda: {"request", "timestamp"} <= parameters(_method(
               "vllm.v1.core.sched.scheduler", "Scheduler", "_preempt_request"))),
    _Probe("reset-connector", "vllm.v1.core.sched.scheduler.Scheduler.reset_prefix_cache("
           "reset_connector=)", False,
           "yes: a cache reset can keep or empty the offloaded tier; no: such a run stops "
           "on a driver gap",
           lambda: "reset_connector" in parameters(_method(
               "vllm.v1.core.sched.scheduler", "Scheduler", "reset_prefix_cache"))),
    _has_api("release-worker", f"{OFFLOADING}.worker.OffloadingConnectorWorker.get_finished",
             False, "yes: a worker-fail transfer is handed to the release's own worker", _has_attr),
    # -- behaviours the tests key on ---------------------------------------------------
    _has_api("failed-transfer-jobs", f"{OFFLOADING}.common.OffloadingWorkerMetadata."
             "failed_jobs", False,
             "yes: the worker reports failed transfers (a failed store is dropped from the "
             "CPU tier, a failed load marks its request so it never loads again); no: the "
             "release's worker asserts every transfer succeeded, a failed store is never "
             "reported (it stays pending)", _has_field),
    _has_api("load-failed-flag", f"{SCHEDULER_MODULE}.RequestOffloadState.load_failed", False,
             "yes: after a failed load the request skips the offloaded tier", _has_field),
    _has_api("partial-tails", f"{SCHEDULER_MODULE}.SchedulerOffloadConfig.supports_partial_tail",
             False, "yes: the connector stores and loads a partial tail at a sub-chunk "
             "boundary where its planning turns them on", _has_field),
    _has_api("partial-tail-anchor",
             f"{SCHEDULER_MODULE}.OffloadingConnectorScheduler._lookup_partial_tail_hit",
             False, "yes: a partial tail is searched from the full-attention hit boundary "
             "(not only the complete-chunk hit)", _has_attr),
    _Probe("swa-reserve-before-clamps", f"{SCHEDULER_MODULE}.OffloadingConnectorScheduler."
           "_lookup_complete_chunks (max_hit_size_tokens -= 1 before max_num_new_tokens)",
           False, "yes: a load budget (max_load_tokens) is a boundary kept as it is; no: "
           "the sliding-window groups' last token comes off the clamped boundary too",
           lambda: swa_reserve_before_clamps(_method(
               SCHEDULER_MODULE, "OffloadingConnectorScheduler", "_lookup_complete_chunks"))),
    _Probe("null-page-placeholders", f"{SCHEDULER_MODULE}.OffloadingConnectorScheduler."
           "_build_store_jobs (src_block_ids.append before the null-block test)", False,
           "yes: a stored chunk's null GPU pages are copied as placeholders; no: they are "
           "left out (the chunk's first live block starts the job)",
           lambda: null_page_placeholders(_method(
               SCHEDULER_MODULE, "OffloadingConnectorScheduler", "_build_store_jobs"))),
)
"""Every capability, in the order ``--check`` prints them."""

CAPABILITY_API = {probe.name: probe.api for probe in PROBES}
"""The vLLM API each capability looks up."""

AST_PROBES = ("cpu-requires-triton", "swa-reserve-before-clamps", "null-page-placeholders")
"""Capabilities read from the shape of the release's own code (unknown where it is
reshaped)."""


def detect() -> Capabilities:
    """Look every capability up in the installed vLLM (imports it)."""
    found: list[Capability] = []
    for probe in PROBES:
        try:
            present = probe.find()
        except Exception:  # a probe that cannot read the API says so, never raises
            present = None
        found.append(Capability(probe.name, probe.api, present, probe.required, probe.use))
    return Capabilities(tuple(found))


@functools.cache
def capabilities() -> Capabilities:
    """:func:`detect`, once per process."""
    return detect()


def has(name: str) -> bool:
    """Whether the installed vLLM offers the capability ``name``."""
    return capabilities().has(name)
