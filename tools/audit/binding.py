"""Bind upstream vLLM functions, by source, to kvcontract's :class:`Implementation`.

vLLM cannot be imported here (it pulls in torch, CUDA extensions and half of PyPI), and
the audited functions moved between files and changed signatures from 0.28 to 0.33.
So each function is *located by AST* under its qualified name in the known files,
its ``def`` is compiled on its own (with postponed annotations, so type hints need not
resolve) and executed in a namespace of small stand-ins: the ``LookupResult`` enum,
``cdiv``/``round_down``, spec dataclasses named like upstream's (the bodies dispatch with
``isinstance`` on those names), ``dataclasses.replace`` and a logger. Methods get a fake
``self`` that carries only what the body reads (``.manager.lookup``, ``.config``...).

Adapters then give every function the signature of the matching
:class:`~kvcontract.impl.bundle.Implementation` field, so the prover's catalogue runs
on upstream code unchanged. An adapter also validates what upstream returns (garbage is
a finding, not a crash of the audit) and, inside a sandbox child, bounds each call in
time (:func:`set_call_timeout`).

Line numbers are preserved: a traceback or a SARIF location points at the upstream file.

What :mod:`.lookup` and :mod:`.store` share with the adapters sits below all three:
:mod:`.roles` (what is looked for, the :class:`Binding` record), :mod:`.stand_ins` and
:mod:`.upstream_calls` (guarded calls, the time limit, :func:`stand_in_gap`): import
their names from there.
"""

from __future__ import annotations
import __future__

import ast
import copy
import inspect
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvcontract.errors import InputFileError
from kvcontract.impl.bundle import Implementation
from kvcontract.impl.variants import REFERENCE, VARIANTS
from kvcontract.spec import symbolic
from kvcontract.tools.audit import store
from kvcontract.tools.audit.audited_files import OFFLOAD_CONFIG
from kvcontract.tools.audit.roles import (
    FIELD_ROLES,
    ROLE_BY_NAME,
    ROLES,
    Binding,
    RoleBinding,
    RoleSpec,
    _where,
)
from kvcontract.tools.audit.stand_ins import (
    GroupConfig,
    SlidingWindowSpec,
    _EventsTracker,
    _Manager,
    _manager_class,
    _namespace,
    cdiv,
)
from kvcontract.tools.audit.targets import Target
from kvcontract.tools.audit.upstream_calls import (
    MissingRole,
    StandInGap,
    UpstreamError,
    _expired,
    _garbage,
    _guarded,
    _passthrough,
    _time_limit,
    stand_in_gap,
)
from kvcontract.vocabulary import LookupResult


class _AssertToCall(ast.NodeTransformer):
    def visit_Assert(self, node: ast.Assert) -> ast.stmt:
        args: list[ast.expr] = [node.test]
        if node.msg is not None:
            args.append(node.msg)
        call = ast.Expr(ast.Call(ast.Name("__kvc_assert__", ast.Load()), args, []))
        return ast.copy_location(call, node)


# -- locating ---------------------------------------------------------------------------
@dataclass
class Located:
    qualname: str
    path: Path
    line: int
    node: ast.FunctionDef


def _index(path: Path) -> dict[str, Located]:
    """Every function of a file by qualified name (``Class.method``) and bare name."""
    try:
        source = path.read_text(encoding="utf-8", errors="replace")
        tree = ast.parse(source, filename=str(path))
    except (OSError, SyntaxError, ValueError) as exc:
        raise InputFileError(str(path), f"cannot parse: {exc}") from None
    found: dict[str, Located] = {}
    _collect_functions(tree.body, "", path, found)
    return found


def _collect_functions(body: list[ast.stmt], prefix: str, path: Path,
                       found: dict[str, Located]) -> None:
    """Add the functions of ``body``, and of its classes (nested), to ``found`` under
    their qualified names; the first definition of a name wins."""
    for node in body:
        if isinstance(node, ast.FunctionDef):
            qual = prefix + node.name
            found.setdefault(qual, Located(qual, path, node.lineno, node))
        elif isinstance(node, ast.ClassDef):
            _collect_functions(node.body, prefix + node.name + ".", path, found)


class _FunctionIndex:
    """The functions of every file searched so far (each file is parsed once)."""

    def __init__(self) -> None:
        self._files: dict[Path, dict[str, Located]] = {}

    def find(self, path: Path, qualname: str, *, any_class: bool) -> Located | None:
        """``qualname`` in ``path``; with ``any_class`` also a function of that name in
        any class (a patched file may nest the function in any class)."""
        if path not in self._files:
            self._files[path] = _index(path)
        functions = self._files[path]
        hit = functions.get(qualname)
        if hit is None and any_class:
            hit = next((loc for q, loc in functions.items()
                        if q.rsplit(".", 1)[-1] == qualname), None)
        return hit


def _compile(located: Located) -> Callable[..., Any]:
    node = copy.deepcopy(located.node)
    node.decorator_list = []
    node = _AssertToCall().visit(node)
    module = ast.Module(body=[node], type_ignores=[])
    ast.fix_missing_locations(module)
    code = compile(module, str(located.path), "exec",
                   flags=__future__.annotations.compiler_flag, dont_inherit=True)
    namespace = _namespace()
    exec(code, namespace)
    fn = namespace[node.name]
    if not callable(fn):
        raise TypeError(f"{located.qualname} is not a function")
    return fn  # type: ignore[no-any-return]


# -- adapters ------------------------------------------------------------------------------
def _is_number(value: Any) -> bool:
    return (isinstance(value, (int, symbolic.SymInt)) and not isinstance(value, bool)) or \
        type(value).__name__ == "ArithRef"


def _param_names(fn: Callable[..., Any]) -> list[str]:
    return list(inspect.signature(fn).parameters)


Fields = dict[str, Callable[..., Any]]
"""Implementation field -> its adapter, filled role by role by :func:`_build_adapters`."""


def _build_adapters(binding: Binding) -> None:
    """Give every bound role an adapter with the matching Implementation signature; a
    field whose roles are missing raises :class:`MissingRole` (the engine skips it)."""
    fields: Fields = {}
    _adapt_skipped(binding, fields)
    _adapt_window(binding, fields)
    _adapt_load_window(binding, fields)
    _adapt_sw_scan(binding, fields)
    _adapt_prefix_scan(binding, fields)
    _adapt_reachability(binding, fields)
    # No store horizon: never inferred from the builder's text (_no_store_horizon).
    binding.missing_fields["store_final_segment_end"] = _no_store_horizon(binding)
    _adapt_replay_boundaries(binding, fields)
    binding.implementation = _assemble_implementation(binding, fields)


def _scan_has_initial(binding: Binding) -> bool:
    """Whether the bound sliding-window scanner takes ``initial_window_size`` (0.30+)."""
    f = binding.functions
    scan_params = _param_names(f["sw_scan"]) if "sw_scan" in f else []
    return "initial_window_size" in scan_params


def _adapt_skipped(binding: Binding, fields: Fields) -> None:
    """``get_num_skipped_tokens``, and ``Ret(n)`` / ``Load(N, L)`` derived from it."""
    if "skipped" not in binding.functions:
        return
    skipped_fn = _guarded(_where(binding, "skipped"), binding.functions["skipped"])

    def get_num_skipped_tokens(n: Any, sliding_window: Any, extra_retained: Any) -> Any:
        manager = types.SimpleNamespace(sliding_window=sliding_window,
                                        extra_retained_tokens=extra_retained)
        value = skipped_fn(manager, n)
        if not _is_number(value):
            raise _garbage(_where(binding, "skipped"), value, "an int")
        return value

    def retained_block_range(n: Any, bs: Any, sw: Any, e: Any) -> tuple[Any, Any]:
        return get_num_skipped_tokens(n, sw, e) // bs, cdiv(n, bs)

    def load_chunk_range(hit: Any, local: Any, bs: Any, bpc: Any, sw: Any,
                         e: Any) -> tuple[Any, Any]:
        first = get_num_skipped_tokens(hit, sw, e) // bs
        local_blocks = cdiv(local, bs)
        if local_blocks > first:
            first = local_blocks
        return first // bpc, cdiv(hit, bs * bpc)

    fields["get_num_skipped_tokens"] = get_num_skipped_tokens
    fields["retained_block_range"] = retained_block_range
    fields["load_chunk_range"] = load_chunk_range
    binding.roles["retained_range"] = RoleBinding(
        "retained_range", "derived", "retained blocks Ret(n) and load set Load(N, L)",
        note="[skipped(n) // bs, cdiv(n, bs)) from the bound get_num_skipped_tokens "
             "(the allocation path itself is not executed)")


def _adapt_window(binding: Binding, fields: Fields) -> None:
    """The window ``W`` in chunks, for a sliding-window spec stand-in."""
    if "window" not in binding.functions:
        return
    window_fn = _guarded(_where(binding, "window"), binding.functions["window"])

    def get_sliding_window_size_in_chunks(sw: Any, e: Any, tpc: Any) -> Any:
        spec = SlidingWindowSpec(block_size=tpc, sliding_window=sw, extra_retained_tokens=e)
        value = window_fn(spec, tpc)
        if not _is_number(value):
            raise _garbage(_where(binding, "window"), value, "an int for a sliding-window spec")
        return value

    fields["get_sliding_window_size_in_chunks"] = get_sliding_window_size_in_chunks


def _adapt_load_window(binding: Binding, fields: Fields) -> None:
    """The load window ``lw(N)``: the bound function (it needs the window adapter), or
    ``W`` itself where the scanner has no initial window (0.28/0.29)."""
    f = binding.functions
    roles = binding.roles
    if "load_window" in f and "get_sliding_window_size_in_chunks" in fields:
        lw_fn = _guarded(_where(binding, "load_window"), f["load_window"])
        window_adapter = fields["get_sliding_window_size_in_chunks"]

        def load_window_size_in_chunks(boundary: Any, sw: Any, e: Any, tpc: Any) -> Any:
            spec = SlidingWindowSpec(block_size=tpc, sliding_window=sw, extra_retained_tokens=e)
            config = GroupConfig(sliding_window_size_in_chunks=window_adapter(sw, e, tpc),
                                 kv_cache_spec=spec, tokens_per_chunk=tpc, tokens_per_block=tpc)
            value = lw_fn(config, boundary)
            if not _is_number(value):
                raise _garbage(_where(binding, "load_window"), value,
                               "an int for a sliding-window spec")
            return value

        fields["load_window_size_in_chunks"] = load_window_size_in_chunks
    elif "load_window" not in f and "sw_scan" in f and not _scan_has_initial(binding) and \
            "get_sliding_window_size_in_chunks" in fields:
        window_only = fields["get_sliding_window_size_in_chunks"]

        def load_window_is_w(boundary: Any, sw: Any, e: Any, tpc: Any) -> Any:
            return window_only(sw, e, tpc)

        fields["load_window_size_in_chunks"] = load_window_is_w
        roles["load_window"].status = "derived"
        anchor = roles.get("multi_group_lookup") or roles["sw_scan"]
        roles["load_window"].path, roles["load_window"].line = anchor.path, anchor.line
        roles["load_window"].note = (
            "absent; this scanner has no initial_window_size, so the lookup requires W chunks "
            "ending at cdiv(N, tpc) for every boundary: lw(N) = W")
    elif "load_window" in f:
        binding.missing_fields["load_window_size_in_chunks"] = "needs the window function"


def _adapt_sw_scan(binding: Binding, fields: Fields) -> None:
    """The sliding-window scanner over a lookup callback (a manager stand-in)."""
    if "sw_scan" not in binding.functions:
        return
    scan_fn = _guarded(_where(binding, "sw_scan"), binding.functions["sw_scan"])
    scan_has_initial = _scan_has_initial(binding)

    def sliding_window_lookup(lookup: Callable[[int], LookupResult], start: int, end: int,
                              initial_window: int, window: int) -> int | None:
        keys = list(range(start, end))
        sched = types.SimpleNamespace(manager=_Manager(lookup),
                                      _events_tracker=_EventsTracker())
        if scan_has_initial:
            value = scan_fn(sched, keys, window, None, initial_window_size=initial_window)
        else:
            value = scan_fn(sched, keys, window, None)
        if value is None:
            return None
        if not isinstance(value, int) or isinstance(value, bool) or \
                not 0 <= value <= len(keys):
            raise _garbage(_where(binding, "sw_scan"), value,
                           f"None or an index in [0, {len(keys)}]")
        return start + value

    fields["sliding_window_lookup"] = sliding_window_lookup


def _adapt_prefix_scan(binding: Binding, fields: Fields) -> None:
    """The full-attention prefix scanner; required parameters it does not know (a later
    release's recompute budget) are passed as 0."""
    if "prefix_scan" not in binding.functions:
        return
    prefix_raw = binding.functions["prefix_scan"]
    prefix_fn = _guarded(_where(binding, "prefix_scan"), prefix_raw)
    params = _param_names(prefix_raw)
    known = {"self", "keys", "req_context", "req", "group_config", "start_chunk_idx"}
    extra = [p for p in params if p not in known
             and inspect.signature(prefix_raw).parameters[p].default is inspect.Parameter.empty]

    def prefix_lookup(lookup: Callable[[int], LookupResult], start: int,
                      end: int) -> int | None:
        keys = list(range(start, end))
        sched = types.SimpleNamespace(manager=_Manager(lookup),
                                      _events_tracker=_EventsTracker())
        request = types.SimpleNamespace(request_id="audit", num_tokens=end)
        kwargs: dict[str, Any] = {"keys": keys, "req_context": None, "req": request,
                                  "group_config": GroupConfig(),
                                  "start_chunk_idx": start}
        for name in extra:
            kwargs[name] = 0  # e.g. a later recompute budget: none
        value = prefix_fn(sched, **{k: v for k, v in kwargs.items() if k in params})
        if value is None:
            return None
        if not isinstance(value, int) or isinstance(value, bool) or \
                not 0 <= value <= len(keys):
            raise _garbage(_where(binding, "prefix_scan"), value,
                           f"None or a count in [0, {len(keys)}]")
        return start + value

    if extra:
        binding.roles["prefix_scan"].note = f"extra parameters {extra} passed as 0"
    fields["prefix_lookup"] = prefix_lookup


# -- store reachability ----------------------------------------------------------------
def _adapt_reachability(binding: Binding, fields: Fields) -> None:
    """``is_block_reachable`` from the first store-reachability shape the target has:
    the scheduler's store mask over the manager's block mask (0.30+), the chunk-level
    predicate (0.28/0.29), or the manager's block mask alone."""
    f = binding.functions
    manager_cls = _manager_class(binding)
    reach: Callable[..., Any] | None = None
    note = ""
    if "store_mask" in f and manager_cls is not None:
        reach = _reach_via_store_mask(binding, manager_cls)
        note = ("_reachable_store_block_mask over one block (bpc = 1 view), driving "
                "reachable_block_mask through a SlidingWindowManager stand-in")
    elif "store_predicate" in f and "get_sliding_window_size_in_chunks" in fields:
        reach = _reach_via_predicate(binding, fields["get_sliding_window_size_in_chunks"])
        note = ("is_store_reachable_swa_chunk at block granularity (bpc = 1 view); "
                "alignment_chunk_count = A // B when A > B and W < A // B (upstream's rule), "
                "storable count = the horizon passed to the mask; no retention interval")
    elif manager_cls is not None:
        reach = _reach_via_block_mask(binding, manager_cls)
        note = "reachable_block_mask alone (no scheduler-side widening found)"
    if reach is not None:
        binding.roles["reachability"] = RoleBinding(
            "reachability", "derived", "per-block store reachability", note=note)
        fields["is_block_reachable"] = reach


def _mask_value(mask: Any, what: str) -> bool:
    """The one block's entry of a one-block mask (None marks every block reachable)."""
    if mask is None:
        return True
    if not isinstance(mask, list) or len(mask) != 1 or not isinstance(mask[0], bool):
        raise _garbage(what, mask, "None or a list of one bool per block")
    return mask[0]


def _reach_via_store_mask(binding: Binding, manager_cls: Any) -> Callable[..., Any]:
    """Per-block reachability through the scheduler's ``_reachable_store_block_mask``
    over one block, driving the manager stand-in's block mask (0.30+)."""
    store_fn = _guarded(_where(binding, "store_mask"), binding.functions["store_mask"])
    mask_where = _where(binding, "store_mask")

    def reach_store_mask(block: Any, alignment: int | None, block_tokens: int, sw: Any,
                         e: Any, eagle: bool, retention: int | None,
                         final_end_block: Any | None, replay_blocks: tuple[Any, ...] = (),
                         blocks_per_chunk: int = 1) -> Any:
        spec = SlidingWindowSpec(block_size=block_tokens, sliding_window=sw,
                                 extra_retained_tokens=e)
        config = GroupConfig(kv_cache_spec=spec, manager_cls=manager_cls,
                             is_eagle_group=bool(eagle), tokens_per_block=block_tokens,
                             tokens_per_chunk=block_tokens)
        # use_lookahead_block_hashes: off, as ``eagle`` already says whether the mask
        # drops (the caller passes the hash mode's drop, docs/CONTRACT.md 2.1).
        sched = types.SimpleNamespace(config=types.SimpleNamespace(
            blocks_per_chunk=1, alignment_tokens=alignment, retention_interval=retention,
            dcp_world_size=1), use_lookahead_block_hashes=False)
        mask = store_fn(sched, config, block, block + 1, final_end_block,
                        tuple(b * block_tokens for b in replay_blocks))
        return _mask_value(mask, mask_where)

    return reach_store_mask


def _reach_via_predicate(binding: Binding,
                         window_adapter: Callable[..., Any]) -> Callable[..., Any]:
    """Per-block reachability through ``is_store_reachable_swa_chunk`` (0.28/0.29), with
    upstream's alignment rule and the horizon as the storable count."""
    predicate = _guarded(_where(binding, "store_predicate"), binding.functions["store_predicate"])
    mask_where = _where(binding, "store_predicate")

    def reach_predicate(block: Any, alignment: int | None, block_tokens: int, sw: Any,
                        e: Any, eagle: bool, retention: int | None,
                        final_end_block: Any | None, replay_blocks: tuple[Any, ...] = (),
                        blocks_per_chunk: int = 1) -> Any:
        window = window_adapter(sw, e, block_tokens)
        per: int | None = None
        if alignment is not None and alignment > block_tokens:
            per = alignment // block_tokens
            if window >= per:
                per = None
        storable = final_end_block if final_end_block is not None else block + (per or 1)
        value = predicate(block, storable, per, window, bool(eagle))
        if not isinstance(value, bool):
            raise _garbage(mask_where, value, "a bool")
        return value

    return reach_predicate


def _reach_via_block_mask(binding: Binding, manager_cls: Any) -> Callable[..., Any]:
    """Per-block reachability through the manager's ``reachable_block_mask`` alone."""
    mask_params = _param_names(binding.functions["block_mask"])
    mask_where = _where(binding, "block_mask")

    def reach_block_mask(block: Any, alignment: int | None, block_tokens: int, sw: Any,
                         e: Any, eagle: bool, retention: int | None,
                         final_end_block: Any | None, replay_blocks: tuple[Any, ...] = (),
                         blocks_per_chunk: int = 1) -> Any:
        spec = SlidingWindowSpec(block_size=block_tokens, sliding_window=sw,
                                 extra_retained_tokens=e)
        kwargs: dict[str, Any] = {
            "start_block": block, "end_block": block + 1, "alignment_tokens": alignment,
            "kv_cache_spec": spec, "use_eagle": bool(eagle),
            "retention_interval": retention,
            "reachable_boundaries": tuple(b * block_tokens for b in replay_blocks),
        }
        if "final_segment_end_block" in mask_params:
            kwargs["final_segment_end_block"] = final_end_block
        with _time_limit(mask_where):
            try:
                mask = manager_cls.reachable_block_mask(**kwargs)
            except Exception as exc:
                if _passthrough(exc):
                    raise
                gap = stand_in_gap(exc)
                if gap is not None:
                    raise StandInGap(f"{mask_where}: {gap}") from exc
                raise UpstreamError(f"{mask_where} raised {type(exc).__name__}: {exc}") \
                    from exc
            return _mask_value(mask, mask_where)
        _expired()

    return reach_block_mask


# -- the bundle ---------------------------------------------------------------------------
def _assemble_implementation(binding: Binding, fields: Fields) -> Implementation:
    """The Implementation of the adapted fields; a field that could not be bound raises
    :class:`MissingRole` with the reason recorded in ``binding.missing_fields``."""
    for name in FIELD_ROLES:
        if name not in fields and name not in binding.missing_fields:
            binding.missing_fields[name] = "missing " + ", ".join(
                _role_display(binding, r) for r in FIELD_ROLES[name])
    filled: dict[str, Any] = {
        name: fields.get(name, _missing_field(name, binding.missing_fields.get(name, "")))
        for name in FIELD_ROLES}
    return Implementation(
        name=binding.target.name, description=binding.target.display(), **filled)


def _role_display(binding: Binding, role: str) -> str:
    if role == "reachability":
        return ("store reachability (_reachable_store_block_mask + reachable_block_mask, "
                "or is_store_reachable_swa_chunk)")
    if role == "store_horizon":
        return "the store horizon (executed only as part of _build_store_jobs)"
    spec = ROLE_BY_NAME.get(role)
    return spec.qualnames[0] if spec else role


def _missing_field(name: str, reason: str) -> Callable[..., Any]:
    def missing(*args: Any, **kwargs: Any) -> Any:
        raise MissingRole(f"{name}: {reason}")

    missing.__name__ = f"missing_{name}"
    return missing


def _adapt_replay_boundaries(binding: Binding, fields: Fields) -> None:
    """``store_replay_boundaries``: what upstream's ``_build_store_jobs`` passes to its
    mask, observed by executing it (:func:`kvcontract.tools.audit.store.
    executed_replay_boundaries`), never restated from its text. Where the builder
    cannot run (a function it calls is missing), the field is missing and its theorems
    are unchecked, naming what is absent. The built-in targets keep their own field."""
    absent = store.missing(binding)
    if absent:
        binding.missing_fields["store_replay_boundaries"] = (
            "the replay boundaries are observed only by executing upstream's store path, "
            "which cannot run (it needs " + ", ".join(absent) + ")")
        return
    fields["store_replay_boundaries"] = store.executed_replay_boundaries(binding)


STORE_HORIZON_EXECUTED = (
    "the store horizon is not modelled from _build_store_jobs' source text; upstream's "
    "store path is checked as executed by the Cn/upstream-store-* theorems (and "
    "C12/upstream-no-lost-hits)")


def _no_store_horizon(binding: Binding) -> str:
    """Why ``store_final_segment_end`` is not bound: kvcontract's StoreTracker over a
    horizon read off the builder's text would be a model of upstream presented as
    upstream's. Where the builder can run, its theorems are the executed ones."""
    absent = store.missing(binding) if binding.target.kind != "builtin" else []
    binding.roles["store_horizon"] = RoleBinding(
        "store_horizon", "missing", "final-segment horizon of a store job",
        note=STORE_HORIZON_EXECUTED if not absent else
        "not modelled from source text, and upstream's store path cannot run: it needs "
        + ", ".join(absent))
    if absent:
        return ("the store horizon is not modelled from source text, and upstream's store "
                "path cannot run (it needs " + ", ".join(absent) + ")")
    return STORE_HORIZON_EXECUTED


# -- entry point ----------------------------------------------------------------------------
def _candidates(target: Target, spec: RoleSpec) -> list[tuple[Path, str]]:
    """Where the role may be defined, in search order: the patch (any class), else the
    base release's own files; a tree's files, else the base's for a file it lacks."""
    if target.kind == "module":
        path = target.files[0]
        own = [(path, q) for q in spec.qualnames] + \
            [(path, q.rsplit(".", 1)[-1]) for q in spec.qualnames]
    else:
        assert target.package_dir is not None
        own = [(target.package_dir / rel, q) for rel in spec.files for q in spec.qualnames]
    if target.base is None:
        return own
    base_dir = target.base.package_dir
    assert base_dir is not None
    if target.kind == "module":
        return own + [(base_dir / rel, q) for rel in spec.files for q in spec.qualnames]
    # A partial tree: a file it has is its own (a function it lacks there is its
    # release's shape); a file it lacks is the base's.
    assert target.package_dir is not None
    return [(target.package_dir / rel if (target.package_dir / rel).is_file()
             else base_dir / rel, q) for rel in spec.files for q in spec.qualnames]


def _source_of(target: Target, path: Path) -> str:
    """``patch`` (a ``module:`` file), ``target`` (a tree's own file) or ``base``."""
    if target.kind == "module" and path == target.files[0]:
        return "patch"
    base_dir = target.base.package_dir if target.base is not None else None
    if base_dir is not None and path.is_relative_to(base_dir) and not (
            target.package_dir is not None and path.is_relative_to(target.package_dir)):
        return "base"
    return "target"


def bind(target: Target) -> Binding:
    """Locate, compile and adapt every role of ``target`` (builtins bind to themselves)."""
    if target.kind == "builtin":
        return _bind_builtin(target)
    binding = Binding(target)
    index = _FunctionIndex()
    for spec in ROLES:
        located = _locate(target, spec, index)
        if located is None:
            binding.roles[spec.role] = _not_found(target, spec)
        else:
            _bind_located(binding, spec, located)
    _check_patch_binds_something(binding)
    _describe_shapes(binding)
    _build_adapters(binding)
    return binding


def _check_patch_binds_something(binding: Binding) -> None:
    """A ``module:`` patch laid over a base release must define at least one audited
    function: else every finding would be the base release's, reported as the file's."""
    target = binding.target
    if target.kind != "module" or target.base is None:
        return
    if any(rb.source == "patch" for rb in binding.roles.values()):
        return
    names = sorted({spec.qualnames[0].rsplit(".", 1)[-1] for spec in ROLES})
    raise InputFileError(str(target.files[0]), (
        "defines none of the audited functions, so its audit would be the base release's "
        f"(none of {', '.join(names)}); audit the base itself (--target vllm:installed) or a "
        "file that defines one"))


def _bind_builtin(target: Target) -> Binding:
    """A built-in implementation, bound to itself with every role found."""
    binding = Binding(target)
    assert target.builtin is not None
    binding.implementation = VARIANTS[target.builtin]
    for spec in ROLES:
        binding.roles[spec.role] = RoleBinding(
            spec.role, "found", spec.what, qualname=f"kvcontract.impl ({target.builtin})",
            note="built-in implementation")
    return binding


def _locate(target: Target, spec: RoleSpec, index: _FunctionIndex) -> Located | None:
    """The role's definition: the first candidate (file, qualified name) that exists."""
    for path, qualname in _candidates(target, spec):
        if not path.is_file():
            continue
        patch = target.kind == "module" and path == target.files[0]
        hit = index.find(path, qualname, any_class=patch)
        if hit is not None:
            return hit
    return None


def _not_found(target: Target, spec: RoleSpec) -> RoleBinding:
    """The record of a role none of whose candidates exists (it names the files searched)."""
    note = "not found in " + ", ".join(sorted({str(p) for p, _ in _candidates(target, spec)}))
    if target.base is None and target.kind == "module":
        note += ("; no base release (--base): a function the patch does not define is "
                 "not bound")
        if target.notes:
            note += f" ({target.notes[-1]})"
    return RoleBinding(spec.role, "missing", spec.what, note=note)


def _bind_located(binding: Binding, spec: RoleSpec, located: Located) -> None:
    """Compile a located definition among the stand-ins and record the role; a definition
    that cannot even be created is recorded with status ``error`` (a finding)."""
    rb = RoleBinding(spec.role, "found", spec.what, qualname=located.qualname,
                     path=str(located.path), line=located.line,
                     source=_source_of(binding.target, located.path))
    try:
        fn = _compile(located)
        rb.signature = f"{located.node.name}{inspect.signature(fn)}"
    except Exception as exc:  # a definition that cannot even be created is a finding
        rb.status = "error"
        rb.note = f"cannot define it with stand-ins: {type(exc).__name__}: {exc}"
        binding.roles[spec.role] = rb
        return
    binding.functions[spec.role] = fn
    binding.nodes[spec.role] = located.node
    binding.roles[spec.role] = rb


def _describe_shapes(binding: Binding) -> None:
    """A one-phrase shape per role: which release family its signature belongs to."""
    f = binding.functions
    if "sw_scan" in f:
        has = "initial_window_size" in _param_names(f["sw_scan"])
        binding.roles["sw_scan"].shape = (
            "with initial_window_size (0.30+)" if has else "W only, no initial window (0.28/0.29)")
    if "window" in f:
        rb = binding.roles["window"]
        rb.shape = "offloading/config.py (0.33+)" if rb.path and rb.path.endswith(
            OFFLOAD_CONFIG) else "module function"
    if "block_mask" in f:
        params = _param_names(f["block_mask"])
        binding.roles["block_mask"].shape = (
            "with dcp_world_size and final_segment_end_block (0.30+)"
            if "final_segment_end_block" in params else "without final segment (0.28/0.29)")
    if "store_predicate" in f:
        binding.roles["store_predicate"].shape = "chunk-level predicate (0.28/0.29)"
    if "multi_group_lookup" in f:
        params = _param_names(f["multi_group_lookup"])
        binding.roles["multi_group_lookup"].shape = (
            "with max_num_new_tokens (0.30+)" if "max_num_new_tokens" in params
            else "req_status only (0.28/0.29)")


def reference_binding() -> Binding:
    """The built-in reference as a binding (for baselines against it)."""
    from kvcontract.tools.audit.targets import resolve_target

    binding = bind(resolve_target("builtin:reference"))
    assert binding.implementation is REFERENCE
    return binding


__all__ = ["bind", "reference_binding"]
