"""An upstream function of the running vLLM replaced by the reference's rule, in the
function's own signature, for the duration of a ``with`` block.

This is how the engine names a finding's root cause (the smallest set of upstream
functions whose replacement makes the witness pass on vLLM's own engine) and measures
its cost (the engine against the same engine with the root cause replaced). A
replacement follows the value everywhere vLLM reads it: a top-level function is rebound
in its module and in every loaded ``vllm`` module that imported it by name; a method is
set on its class (every instance and subclass that does not override it runs it).
Engines that read a replaced value when they are built (the window ``W`` is computed
into each ``GroupOffloadConfig``) must be built inside the block.

:data:`REPLACEMENTS` names what can be replaced, by the audit's binding roles:

* ``window``: ``get_sliding_window_size_in_chunks(kv_cache_spec, tokens_per_chunk)``,
  the reference's ``W`` for a sliding-window spec (upstream's own answer otherwise);
* ``skipped``: ``SlidingWindowManager.get_num_skipped_tokens(self, n)``, the reference's
  retention (the manager's window and ``extra_retained_tokens``);
* ``load_window``: ``GroupOffloadConfig.load_window_size_in_chunks(self, num_tokens)``,
  the reference's ``lw(N)`` for a sliding-window group;
* ``store_jobs`` (the replay boundaries of ``_build_store_jobs``): its mask,
  ``_reachable_store_block_mask``, receives the reference's replay boundaries instead of
  the ones the builder passes;
* ``sliding_lookup``: ``OffloadingConnectorScheduler._sliding_window_lookup(self, keys,
  sliding_window_size, req_context, initial_window_size=None)``, the implementation's
  right-to-left window scan over the manager's own answers.

``rebound(..., implementation=VARIANTS[name])`` puts another implementation's rule in
place of the reference's: a historic defect of kvcontract's catalogue driven through
vLLM's own code (``kvcontract.monitor``'s ``--kvcontract-vllm-variant``).
:data:`ROLE_OF_FIELD` names the role that carries each bundle field.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from kvcontract.impl.bundle import Implementation
from kvcontract.impl.variants import REFERENCE
from kvcontract.live.capabilities import vllm_names
from kvcontract.vocabulary import LookupResult


@dataclass(frozen=True)
class Replacement:
    """Where a role's function lives in vLLM and how the reference's rule replaces it."""

    role: str
    module: str
    """Its module in 0.33.0 and later (the binding's location wins when it differs)."""
    qualname: str
    make: Callable[[Callable[..., Any], Implementation], Callable[..., Any]]
    """The replacement, from the original and the implementation whose rule it runs."""
    what: str


def _sliding_spec() -> Any:
    return vllm_names("vllm.v1.kv_cache_interface", "SlidingWindowSpec")


def _window(original: Callable[..., Any], impl: Implementation) -> Callable[..., Any]:
    sliding = _sliding_spec()

    def get_sliding_window_size_in_chunks(kv_cache_spec: Any, tokens_per_chunk: int) -> Any:
        if isinstance(kv_cache_spec, sliding):
            return impl.get_sliding_window_size_in_chunks(
                kv_cache_spec.sliding_window,
                getattr(kv_cache_spec, "extra_retained_tokens", 0), tokens_per_chunk)
        return original(kv_cache_spec, tokens_per_chunk)

    return get_sliding_window_size_in_chunks


def _skipped(original: Callable[..., Any], impl: Implementation) -> Callable[..., Any]:
    del original

    def get_num_skipped_tokens(self: Any, num_computed_tokens: int) -> Any:
        return impl.get_num_skipped_tokens(
            num_computed_tokens, self.sliding_window,
            getattr(self, "extra_retained_tokens", 0))

    return get_num_skipped_tokens


def _load_window(original: Callable[..., Any], impl: Implementation) -> Callable[..., Any]:
    sliding = _sliding_spec()

    def load_window_size_in_chunks(self: Any, num_tokens: int) -> Any:
        spec = self.kv_cache_spec
        if isinstance(spec, sliding):
            return impl.load_window_size_in_chunks(
                num_tokens, spec.sliding_window, getattr(spec, "extra_retained_tokens", 0),
                self.tokens_per_chunk)
        return original(self, num_tokens)

    return load_window_size_in_chunks


def _replay_boundaries(original: Callable[..., Any], impl: Implementation,
                       ) -> Callable[..., Any]:
    """``_reachable_store_block_mask`` given the reference's replay boundaries
    (:func:`kvcontract.impl.reference.store_replay_boundaries`) instead of those
    ``_build_store_jobs`` passes: the prompt is read off upstream's own first boundary
    (``P - 1``), the alignment, retention and EAGLE (any group; legacy hashes) off the
    scheduler's config."""
    import inspect

    signature = inspect.signature(original)

    def reachable_store_block_mask(self: Any, *args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(self, *args, **kwargs)
        given = tuple(bound.arguments.get("reachable_boundaries") or ())
        if given:
            config = self.config
            eagle = any(c.is_eagle_group for c in config.kv_group_configs) and \
                not getattr(self, "use_lookahead_block_hashes", False)
            bound.arguments["reachable_boundaries"] = tuple(
                impl.store_replay_boundaries(int(given[0]) + 1, config.alignment_tokens,
                                             config.retention_interval, eagle))
        return original(*bound.args, **bound.kwargs)

    return reachable_store_block_mask


def _sliding_lookup(original: Callable[..., Any], impl: Implementation) -> Callable[..., Any]:
    """The implementation's window scan over the keys, each answer the manager's own
    (vLLM's ``LookupResult`` read by name; one the vocabulary lacks is a MISS)."""
    import inspect

    signature = inspect.signature(original)

    def sliding_window_lookup(self: Any, *args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(self, *args, **kwargs)
        keys = bound.arguments["keys"]
        window = bound.arguments["sliding_window_size"]
        context = bound.arguments["req_context"]
        initial = bound.arguments.get("initial_window_size") or window

        def lookup(index: int) -> LookupResult:
            answer = self.manager.lookup(keys[index], context)
            return LookupResult.__members__.get(getattr(answer, "name", ""), LookupResult.MISS)

        return impl.sliding_window_lookup(lookup, 0, len(keys), initial, window)

    return sliding_window_lookup


OFFLOADING = "vllm.distributed.kv_transfer.kv_connector.v1.offloading"
REPLACEMENTS: dict[str, Replacement] = {
    "window": Replacement("window", f"{OFFLOADING}.config",
                          "get_sliding_window_size_in_chunks", _window,
                          "the window W in chunks"),
    "skipped": Replacement("skipped", "vllm.v1.core.single_type_kv_cache_manager",
                           "SlidingWindowManager.get_num_skipped_tokens", _skipped,
                           "the tokens skipped below the window (retention)"),
    "load_window": Replacement("load_window", f"{OFFLOADING}.scheduler",
                               "GroupOffloadConfig.load_window_size_in_chunks", _load_window,
                               "the load window lw(N)"),
    # The binding's role of the store path's replay boundaries (FIELD_ROLES).
    "store_jobs": Replacement("store_jobs", f"{OFFLOADING}.scheduler",
                              "OffloadingConnectorScheduler._reachable_store_block_mask",
                              _replay_boundaries,
                              "the replay boundaries _build_store_jobs passes to its mask"),
    "sliding_lookup": Replacement("sliding_lookup", f"{OFFLOADING}.scheduler",
                                  "OffloadingConnectorScheduler._sliding_window_lookup",
                                  _sliding_lookup, "the sliding-window scan of the lookup"),
}

ROLE_OF_FIELD: dict[str, str] = {
    "get_sliding_window_size_in_chunks": "window",
    "get_num_skipped_tokens": "skipped",
    "load_window_size_in_chunks": "load_window",
    "store_replay_boundaries": "store_jobs",
    "sliding_window_lookup": "sliding_lookup",
}
"""The role whose replacement carries an implementation's bundle field into vLLM."""


class RebindError(RuntimeError):
    """The running vLLM has no such function where it was looked for (kvcontract's
    gap, named)."""


def _resolve(module_name: str, qualname: str) -> tuple[Any, str, Any]:
    """``(owner, attribute, value)``: the module or class holding the function."""
    import importlib

    try:
        owner: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise RebindError(f"cannot import {module_name}: {exc}") from None
    *path, name = qualname.split(".")
    for part in path:
        owner = getattr(owner, part, None)
        if owner is None:
            raise RebindError(f"{module_name} has no {'.'.join(path)}")
    value = owner.__dict__.get(name) if isinstance(owner, type) else getattr(owner, name, None)
    if value is None:
        raise RebindError(f"{module_name} has no {qualname}")
    return owner, name, value


@contextlib.contextmanager
def rebound(roles: Sequence[str], modules: dict[str, str] | None = None,
            implementation: Implementation = REFERENCE) -> Iterator[None]:
    """Inside the block, each role's function is ``implementation``'s rule (the
    reference's unless named; :data:`REPLACEMENTS`); ``modules`` overrides a role's
    module (where the audit's binding found it in this release)."""
    undo: list[Callable[[], None]] = []
    try:
        for role in roles:
            spec = REPLACEMENTS[role]
            module = (modules or {}).get(role, spec.module)
            owner, name, original = _resolve(module, spec.qualname)
            replacement = spec.make(original, implementation)
            holders = [owner] if isinstance(owner, type) else [
                loaded for loaded in list(sys.modules.values())
                if loaded is not None and getattr(loaded, "__name__", "").startswith("vllm")
                and getattr(loaded, name, None) is original]
            for holder in holders:
                setattr(holder, name, replacement)
                undo.append(_restorer(holder, name, original))
        yield
    finally:
        for step in reversed(undo):
            step()


def _restorer(holder: Any, name: str, value: Any) -> Callable[[], None]:
    def restore() -> None:
        setattr(holder, name, value)

    return restore


def module_of(path: str, package: str) -> str | None:
    """The dotted module of ``path`` under the ``vllm`` package folder ``package``."""
    from pathlib import Path

    try:
        relative = Path(path).resolve().relative_to(Path(package).resolve().parent)
    except ValueError:
        return None
    return ".".join(relative.with_suffix("").parts)


__all__ = ["REPLACEMENTS", "ROLE_OF_FIELD", "RebindError", "Replacement", "module_of",
           "rebound"]
