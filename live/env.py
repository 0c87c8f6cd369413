"""Whether vLLM's scheduler side can run here, and the environment it needs.

The live backend runs vLLM's own scheduler, KV-cache manager and offloading connector
from the installed wheel on a CPU build of torch (no model, no kernels). This module
imports no vLLM at import time: :func:`check` finds what is missing and says how to
install it, :func:`prepare_environment` sets the variables vLLM reads at import
(``VLLM_TARGET_DEVICE=cpu``, else vLLM picks ``UnspecifiedPlatform``; a private
``VLLM_CACHE_ROOT``), and :func:`require` is what the other modules call first.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import logging
import os
import tempfile
from dataclasses import dataclass, field
from typing import Any

SUPPORTED_RELEASES = ("0.30.0", "0.31.0", "0.32.0", "0.33.0")
"""The vLLM releases the live backend drives (their scheduler and connector APIs). 0.33.0
is the one installed by ``.ci/install-live``; 0.30.0, 0.31.0 and 0.32.0 plan the KV cache
in one call (``kv_cache_utils.get_kv_cache_configs``) and mark no drafter layer, so an
EAGLE-3 geometry is refused there (vLLM plans no EAGLE group for it); 0.30.0's request
context has no key positions (chunks are found in the request's own key list). 0.28 and
0.29 plan the KV cache another way and are not driven."""

INSTALL_RECIPE = (
    "pip install -e '.[live]' && pip install --no-deps vllm==0.33.0 "
    "(or .ci/install-live); never let pip resolve vllm's own dependencies: they pull a "
    "CUDA build of torch"
)

LIVE_MODULES = (
    "vllm.v1.core.sched.scheduler",
    "vllm.v1.core.kv_cache_manager",
    "vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector",
)
"""The modules the live backend drives."""

PURE_PYTHON_CLOSURE: dict[str, str] = {
    # import name -> distribution: what importing LIVE_MODULES needs besides torch
    "psutil": "psutil", "cbor2": "cbor2", "zmq": "pyzmq", "transformers": "transformers",
    "aiohttp": "aiohttp", "openai_harmony": "openai-harmony", "openai": "openai",
    "pybase64": "pybase64", "cachetools": "cachetools", "msgspec": "msgspec",
    "uvloop": "uvloop", "prometheus_client": "prometheus_client",
    "xgrammar": "xgrammar==0.2.8 (pip install --no-deps: it requires triton, a GPU package)",
    "fastapi": "fastapi", "partial_json_parser": "partial-json-parser",
    "llguidance": "llguidance", "einops": "einops", "cpuinfo": "py-cpuinfo",
    "regex": "regex", "cloudpickle": "cloudpickle", "PIL": "pillow",
    "pydantic": "pydantic", "requests": "requests", "urllib3": "urllib3",
}


class LiveUnavailable(RuntimeError):
    """vLLM (or a package its scheduler side imports) is not installed, or the
    installed release is not one the live backend drives."""


@dataclass(frozen=True)
class LiveCheck:
    """What :func:`check` found."""

    vllm_version: str | None
    torch_version: str | None
    missing: tuple[str, ...] = ()
    """Distributions to install (the pure-Python closure, vllm itself)."""
    problems: tuple[str, ...] = field(default_factory=tuple)
    """Other reasons the backend cannot run (an unsupported release, an import error)."""

    @property
    def ok(self) -> bool:
        return not self.missing and not self.problems

    def lines(self) -> list[str]:
        """The check as text lines (what ``kvcontract live --check`` prints)."""
        found = [f"vllm: {self.vllm_version or 'not installed'} (supported: "
                 f"{', '.join(SUPPORTED_RELEASES)})",
                 f"torch: {self.torch_version or 'not installed'}"]
        if self.missing:
            found.append("missing: " + ", ".join(self.missing))
        found += [f"problem: {p}" for p in self.problems]
        if not self.ok:
            found.append(f"install: {INSTALL_RECIPE}")
        else:
            found.append("the live backend can run (vLLM's scheduler, KV-cache manager and "
                         "OffloadingConnector import)")
        return found


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def prepare_environment() -> None:
    """Set what vLLM reads at import, unless the user set it: the CPU platform, a
    private cache root (vLLM writes there), quiet logging."""
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    if "VLLM_CACHE_ROOT" not in os.environ:
        os.environ["VLLM_CACHE_ROOT"] = os.path.join(tempfile.gettempdir(),
                                                     f"kvcontract-live-{os.getuid()}")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    level = os.environ["VLLM_LOGGING_LEVEL"].upper()
    logging.getLogger("vllm").setLevel(getattr(logging, level, logging.ERROR))


def check(*, import_modules: bool = True) -> LiveCheck:
    """What is missing for the live backend, without raising. ``import_modules``: also
    import :data:`LIVE_MODULES` (seconds; it finds what a version check cannot)."""
    vllm_version = _version("vllm")
    torch_version = _version("torch")
    missing = [dist for name, dist in PURE_PYTHON_CLOSURE.items()
               if importlib.util.find_spec(name) is None]
    problems: list[str] = []
    if torch_version is None:
        missing.append("torch (the CPU build: pip install torch --index-url "
                       "https://download.pytorch.org/whl/cpu)")
    if vllm_version is None:
        missing.append("vllm==0.33.0 (pip install --no-deps)")
    elif vllm_version not in SUPPORTED_RELEASES:
        problems.append(f"vllm {vllm_version} is installed; the live backend drives "
                        f"{', '.join(SUPPORTED_RELEASES)}")
    if import_modules and not missing and not problems:
        prepare_environment()
        for module in LIVE_MODULES:
            try:
                importlib.import_module(module)
            except Exception as exc:  # any import failure is a reason the backend cannot run
                problems.append(f"import {module}: {type(exc).__name__}: {exc}")
                break
    return LiveCheck(vllm_version, torch_version, tuple(missing), tuple(problems))


def available() -> bool:
    """Whether the live backend can run (vLLM installed, a supported release, the
    closure importable); imports nothing heavy."""
    return check(import_modules=False).ok


def require() -> None:
    """Raise :class:`LiveUnavailable` (with the install recipe) unless the backend can
    run; set the environment vLLM needs."""
    found = check(import_modules=False)
    if not found.ok:
        raise LiveUnavailable("; ".join(found.lines()[2:]))
    prepare_environment()


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
