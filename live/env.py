"""Whether vLLM's scheduler side can run here, and the environment it needs.

The live backend runs vLLM's own scheduler, KV-cache manager and offloading connector
from the installed wheel on a CPU build of torch (no model, no kernels). This module
imports no vLLM at import time: :func:`check` finds what is missing and says how to
install it, :func:`prepare_environment` sets the variables vLLM reads at import
(``VLLM_TARGET_DEVICE=cpu``, else vLLM picks ``UnspecifiedPlatform``; a private
``VLLM_CACHE_ROOT``), and :func:`require` is what the other modules call first.

Which release is installed decides nothing: the driver adapts to what the release
offers, found by introspection (:mod:`kvcontract.live.capabilities`), and the check
fails only when something the driver needs is absent, naming the API.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import logging
import os
import tempfile
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kvcontract.releases import LIVE_RELEASES, NEWEST_RELEASE

if TYPE_CHECKING:
    from kvcontract.live.capabilities import Capabilities

INSTALL_RECIPE = (
    "pip install -e '.[live]' && pip install --no-deps xgrammar==0.2.8 && "
    f"pip install --no-deps vllm=={NEWEST_RELEASE} (or .ci/install-live); never let pip "
    "resolve vllm's or xgrammar's own dependencies: they pull a CUDA build of torch and "
    "triton"
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
    "numpy": "numpy",
}


class LiveUnavailable(RuntimeError):
    """vLLM (or a package its scheduler side imports) is not installed, or the installed
    vLLM lacks an API the live driver needs."""


@dataclass(frozen=True)
class LiveCheck:
    """What :func:`check` found."""

    vllm_version: str | None
    torch_version: str | None
    missing: tuple[str, ...] = ()
    """Distributions to install (the pure-Python closure, vllm itself)."""
    problems: tuple[str, ...] = field(default_factory=tuple)
    """Other reasons the backend cannot run (an import error, an API the driver needs
    and the installed vLLM lacks)."""
    capabilities: Capabilities | None = None
    """What the installed vLLM offers the driver (None: not looked up, which needs
    vLLM imported)."""

    @property
    def ok(self) -> bool:
        return not self.missing and not self.problems

    def lines(self) -> list[str]:
        """The check as text lines: the versions, then what is missing and the install
        recipe, or that the backend can run."""
        found = [f"vllm: {self.vllm_version or 'not installed'} (releases known to work: "
                 f"{', '.join(LIVE_RELEASES)}; the driver adapts to the capabilities it "
                 "finds, not to the version)",
                 f"torch: {self.torch_version or 'not installed'}"]
        if self.missing:
            found.append("missing: " + ", ".join(self.missing))
        found += [f"problem: {p}" for p in self.problems]
        if not self.ok:
            found.append(f"install: {INSTALL_RECIPE}")
        else:
            found.append("the live backend can run (vLLM's scheduler, KV-cache manager and "
                         "OffloadingConnector import, with every API the driver needs)")
        return found

    def capability_lines(self) -> list[str]:
        """One line per capability found (empty when they were not looked up)."""
        if self.capabilities is None:
            return []
        return ["capabilities of the installed vLLM (what the driver uses):",
                *(f"  {line}" for line in self.capabilities.lines())]


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def prepare_environment() -> None:
    """Set what vLLM reads at import, unless the user set it: the CPU platform, a
    private cache root (vLLM writes there), quiet logging, and the Hugging Face hub
    offline (every model the live backend builds is a local ``config.json``; online,
    each speculative config's drafter is looked up on the hub first: about 16 s of
    retries per engine on a machine without network)."""
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    if "VLLM_CACHE_ROOT" not in os.environ:
        os.environ["VLLM_CACHE_ROOT"] = os.path.join(tempfile.gettempdir(),
                                                     f"kvcontract-live-{os.getuid()}")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    level = os.environ["VLLM_LOGGING_LEVEL"].upper()
    logging.getLogger("vllm").setLevel(getattr(logging, level, logging.ERROR))


def missing_capabilities(found: Capabilities) -> list[str]:
    """A problem line for each capability the driver needs and ``found`` lacks."""
    return [f"the installed vLLM lacks {c.api}, which the live driver needs ({c.use})"
            for c in found.missing]


def check(*, import_modules: bool = True) -> LiveCheck:
    """What is missing for the live backend, without raising. ``import_modules``: also
    import :data:`LIVE_MODULES` and look the driver's capabilities up (seconds; it finds
    what the installed files cannot tell)."""
    vllm_version = _version("vllm")
    torch_version = _version("torch")
    missing = [dist for name, dist in PURE_PYTHON_CLOSURE.items()
               if importlib.util.find_spec(name) is None]
    problems: list[str] = []
    if torch_version is None:
        missing.append("torch (the CPU build: pip install torch --index-url "
                       "https://download.pytorch.org/whl/cpu)")
    if vllm_version is None:
        missing.append(f"vllm=={NEWEST_RELEASE} (pip install --no-deps)")
    found: Capabilities | None = None
    if import_modules and not missing:
        prepare_environment()
        for module in LIVE_MODULES:
            try:
                importlib.import_module(module)
            except Exception as exc:  # any import failure is a reason the backend cannot run
                problems.append(f"import {module}: {type(exc).__name__}: {exc}")
                break
        if not problems:
            from kvcontract.live.capabilities import capabilities

            found = capabilities()
            problems += missing_capabilities(found)
    return LiveCheck(vllm_version, torch_version, tuple(missing), tuple(problems), found)


def available() -> bool:
    """Whether the live backend's packages are installed (vLLM, torch, the closure);
    imports nothing heavy."""
    return check(import_modules=False).ok


def require() -> None:
    """Raise :class:`LiveUnavailable` (with the install recipe) unless the backend can
    run: its packages installed, its modules importable and every API the driver needs
    present (this imports vLLM, once per process); set the environment vLLM needs."""
    found = check(import_modules=False)
    if found.ok:
        found = _full_check()
    if not found.ok:
        raise LiveUnavailable("; ".join(found.lines()[2:]))
    prepare_environment()


_CHECKED: list[LiveCheck] = []


def _full_check() -> LiveCheck:
    """:func:`check` with the imports, once per process once it passed (the modules stay
    imported and the capabilities do not change)."""
    if not _CHECKED:
        found = check(import_modules=True)
        if not found.ok:
            return found
        _CHECKED.append(found)
    return _CHECKED[0]


