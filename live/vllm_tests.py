"""vLLM's own offloading tests, fetched from a release's sdist and made ready to run on
CPU, offline (``kvcontract vllm-tests``; docs/usage.md, "Runtime monitor").

:func:`fetch_tests` downloads the release's sdist with pip (``pip download --no-deps
--no-binary :all: --no-clean``: pip fails while preparing the metadata, the build needs
CUDA tooling, but the unpacked sdist stays in its ``pip-download-*/vllm_*`` folder under
``TMPDIR``, a private temporary folder here), copies the files that collecting
``tests/v1/kv_connector/unit/offloading_connector/`` needs (:data:`SUPPORT_FILES` and
:data:`OFFLOADING_FOLDER`) into ``DEST/vllm-RELEASE/`` and removes the rest. vLLM's code
and tests are the vLLM project's (Apache-2.0): they are copied outside kvcontract's
repository, never into it.

What running them here takes besides the files (:class:`FetchedTests`):

- an offline Hugging Face cache for ``facebook/opt-125m`` (``DEST/hf-home``): the tests
  build a real ``ModelConfig`` for it (``tests/v1/kv_connector/unit/utils.py``), which
  reads the model's ``config.json`` and nothing else (no tokenizer, no weights: they
  pass with the config alone, and without it fail with "Invalid repository ID or local
  directory" after retrying the hub). :data:`OPT_125M_CONFIG` is the model's published
  config, written here as facts;
- the plugin :data:`CPU_PLUGIN` (``-p kvcontract_vllm_cpu``, a file next to ``tests/``):
  from 0.34.0 on, vLLM's CPU platform refuses to build a ``VllmConfig`` on x86 without
  Triton's CPU backend (``CpuPlatform.check_and_update_config``); the plugin sets
  ``vllm.triton_utils.HAS_TRITON`` true while that check runs and restores it, as the
  live backend does around its own configs (``live/build.py``). No kernel runs in these
  tests. Where the release has no such check, the plugin changes nothing.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvcontract.errors import InputFileError, UsageError

OFFLOADING_FOLDER = "tests/v1/kv_connector/unit/offloading_connector"
"""The folder of vLLM's offloading-connector unit tests (required)."""

SUPPORT_FILES: tuple[str, ...] = (
    "tests/__init__.py",
    "tests/conftest.py",
    "tests/utils.py",
    "tests/ci_envs.py",
    "tests/models/__init__.py",
    "tests/models/utils.py",
    "tests/models/registry.py",
    "tests/v1/__init__.py",
    "tests/v1/kv_connector/__init__.py",
    "tests/v1/kv_connector/conftest.py",
    "tests/v1/kv_connector/unit/__init__.py",
    "tests/v1/kv_connector/unit/conftest.py",
    "tests/v1/kv_connector/unit/utils.py",
    "tests/v1/spec_decode/__init__.py",
    "tests/v1/spec_decode/utils.py",
)
"""What collecting :data:`OFFLOADING_FOLDER` imports besides it (a file a release lacks is
named in :attr:`FetchedTests.missing`, not an error)."""

MODEL = "facebook/opt-125m"
"""The model the tests' ``create_vllm_config`` builds a ``ModelConfig`` for."""

OPT_125M_CONFIG: dict[str, Any] = {
    "_name_or_path": "facebook/opt-125m",
    "_remove_final_layer_norm": False,
    "activation_dropout": 0.0,
    "activation_function": "relu",
    "architectures": ["OPTForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 2,
    "do_layer_norm_before": True,
    "dropout": 0.1,
    "eos_token_id": 2,
    "ffn_dim": 3072,
    "hidden_size": 768,
    "init_std": 0.02,
    "layerdrop": 0.0,
    "max_position_embeddings": 2048,
    "model_type": "opt",
    "num_attention_heads": 12,
    "num_hidden_layers": 12,
    "pad_token_id": 1,
    "prefix": "</s>",
    "torch_dtype": "float16",
    "transformers_version": "4.21.0.dev0",
    "use_cache": True,
    "vocab_size": 50272,
    "word_embed_proj_dim": 768,
}
"""``facebook/opt-125m``'s published ``config.json`` (facts, not weights)."""

CPU_PLUGIN = "kvcontract_vllm_cpu"
"""The pytest plugin module written next to ``tests/`` (``-p kvcontract_vllm_cpu``)."""

CPU_PLUGIN_SOURCE = '''\
"""Written by kvcontract (``kvcontract vllm-tests``): run vLLM's unit tests on an x86
CPU without Triton's CPU backend. vLLM's CPU platform refuses to build a VllmConfig there
(CpuPlatform.check_and_update_config, from 0.34.0 on); no kernel runs in these tests, so
vllm.triton_utils.HAS_TRITON is set true while that check runs, and restored after it.
Where the release has no such check, nothing changes."""

from typing import Any


def pytest_configure(config: Any) -> None:
    try:
        import vllm.triton_utils as triton_utils
        from vllm.platforms.cpu import CpuPlatform
    except ImportError:
        return
    original = CpuPlatform.__dict__.get("check_and_update_config")
    if not isinstance(original, classmethod) or not hasattr(triton_utils, "HAS_TRITON"):
        return
    function = original.__func__

    def check_and_update_config(cls: Any, vllm_config: Any) -> Any:
        before = triton_utils.HAS_TRITON
        triton_utils.HAS_TRITON = True
        try:
            return function(cls, vllm_config)
        finally:
            triton_utils.HAS_TRITON = before

    CpuPlatform.check_and_update_config = classmethod(check_and_update_config)
'''
"""The source of :data:`CPU_PLUGIN` (see the module docstring)."""

HF_HOME = "hf-home"
"""The offline Hugging Face cache's folder under the destination (shared by releases)."""


@dataclass(frozen=True)
class FetchedTests:
    """A release's offloading tests laid out to run: ``root`` holds ``tests/`` (run them
    with ``cwd=root``), ``hf_home`` the offline cache, ``missing`` the support files the
    release does not have."""

    release: str
    root: Path
    hf_home: Path
    missing: tuple[str, ...] = ()

    def environment(self) -> dict[str, str]:
        """The variables to run them with (added to the caller's environment)."""
        return {
            "VLLM_TARGET_DEVICE": "cpu",
            "HF_HOME": str(self.hf_home),
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
        }

    def command(self, test_file: str = "test_scheduler.py", extra: Sequence[str] = (),
                *, python: str = "python") -> list[str]:
        """The argv that runs ``test_file`` of :data:`OFFLOADING_FOLDER` (``cwd=root``,
        with :meth:`environment`), with the interpreter that has this release installed
        (``python``; ``sys.executable`` for this one)."""
        return [python, "-m", "pytest", "-p", CPU_PLUGIN, f"{OFFLOADING_FOLDER}/{test_file}",
                *extra]

    def shell_line(self, test_file: str = "test_scheduler.py", extra: Sequence[str] = (),
                   *, python: str = "python") -> str:
        """One POSIX shell line that runs them: ``cd ROOT && VAR=value ... python -m
        pytest ...``."""
        assignments = " ".join(f"{key}={shlex.quote(value)}"
                               for key, value in self.environment().items())
        argv = " ".join(shlex.quote(a) for a in self.command(test_file, extra, python=python))
        return f"cd {shlex.quote(str(self.root))} && {assignments} {argv}"


def pip_available() -> bool:
    """Whether this interpreter has pip (``python -m pip``): its distribution is
    installed. (Not ``find_spec("pip")``: setuptools' distutils hook acts on that
    lookup, unloading an imported ``distutils``.)"""
    try:
        importlib.metadata.distribution("pip")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def fetch_tests(release: str, dest: Path) -> FetchedTests:
    """Fetch vLLM ``release``'s offloading tests into ``dest/vllm-RELEASE/`` and the
    offline Hugging Face cache into ``dest/hf-home`` (see the module docstring). A
    release pip cannot fetch, or an sdist without :data:`OFFLOADING_FOLDER`, is a
    :class:`~kvcontract.errors.UsageError`; an unusable ``dest`` an
    :class:`~kvcontract.errors.InputFileError`."""
    release = release.strip()
    if not release:
        raise UsageError("name a vLLM release (e.g. 0.34.0)")
    if not pip_available():
        raise UsageError(f"pip is not installed for {sys.executable}; it downloads vLLM's "
                         "sdist (python -m ensurepip, or install pip)")
    dest = Path(dest).expanduser()
    try:
        dest.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputFileError(str(dest), f"cannot create the folder ({exc.strerror or exc})"
                             ) from None
    if not dest.is_dir():
        raise InputFileError(str(dest), "not a folder")
    root = dest / f"vllm-{release}"
    scratch = Path(tempfile.mkdtemp(prefix="kvcontract-vllm-sdist-"))
    try:
        sdist = _download_sdist(release, scratch)
        missing = _copy_tests(sdist, root)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    hf_home = write_hf_cache(dest / HF_HOME)
    return FetchedTests(release=release, root=root, hf_home=hf_home, missing=missing)


def pip_command(release: str, folder: Path) -> list[str]:
    """The pip call that leaves ``release``'s unpacked sdist under ``folder``."""
    return [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
            "--no-clean", "-d", str(folder / "download"), f"vllm=={release}"]


def _download_sdist(release: str, scratch: Path) -> Path:
    """Run pip in ``scratch`` (``TMPDIR`` pointed at it); the unpacked sdist of
    ``release`` it left there."""
    import os

    env = dict(os.environ)
    env["TMPDIR"] = str(scratch)
    env.setdefault("PIP_DISABLE_PIP_VERSION_CHECK", "1")
    done = subprocess.run(pip_command(release, scratch), cwd=scratch, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          check=False)
    found = sorted(p.parent for p in scratch.glob("pip-download-*/vllm_*/PKG-INFO"))
    if not found:
        tail = _pip_error(done.stdout or "")
        raise UsageError(f"pip could not fetch vLLM {release}'s sdist (exit {done.returncode}"
                         f", no unpacked sdist left behind): {tail}")
    versions = {folder: _sdist_version(folder) for folder in found}
    for folder, version in versions.items():
        if version == release:
            return folder
    seen = ", ".join(sorted({v or "none" for v in versions.values()}))
    raise UsageError(f"pip fetched an sdist of vLLM {seen}, not {release}")


def _pip_error(output: str) -> str:
    """The lines of pip's output that say why it failed (its ``ERROR:`` lines, else the
    last non-empty line)."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("ERROR:")]
    chosen = errors[-3:] if errors else lines[-1:]
    return " | ".join(chosen) if chosen else "pip printed nothing"


def _sdist_version(folder: Path) -> str | None:
    """The ``Version:`` of an unpacked sdist's ``PKG-INFO``."""
    try:
        text = (folder / "PKG-INFO").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        if not line.strip():
            break  # the headers end at the first blank line
        if line.startswith("Version:"):
            return line.partition(":")[2].strip()
    return None


def _copy_tests(sdist: Path, root: Path) -> tuple[str, ...]:
    """Copy :data:`SUPPORT_FILES` and :data:`OFFLOADING_FOLDER` from ``sdist`` into
    ``root`` (whose old ``tests/`` goes first), write the CPU plugin; the support files
    the sdist lacks."""
    folder = sdist / OFFLOADING_FOLDER
    if not folder.is_dir():
        raise UsageError(f"vLLM {_sdist_version(sdist)}'s sdist has no {OFFLOADING_FOLDER}/ "
                         "(the offloading connector's tests moved there in later releases)")
    try:
        if (root / "tests").is_dir():
            shutil.rmtree(root / "tests")
        root.mkdir(parents=True, exist_ok=True)
        missing: list[str] = []
        for name in SUPPORT_FILES:
            source = sdist / name
            if not source.is_file():
                missing.append(name)
                continue
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, root / name)
        shutil.copytree(folder, root / OFFLOADING_FOLDER,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        (root / f"{CPU_PLUGIN}.py").write_text(CPU_PLUGIN_SOURCE, encoding="utf-8")
    except OSError as exc:
        raise InputFileError(str(root), f"cannot write the tests ({exc})") from None
    return tuple(missing)


def hf_snapshot_id(config: dict[str, Any] | None = None) -> str:
    """The snapshot's name in the cache: 40 hex digits, the SHA-1 of the config file
    (stable, so a second fetch rewrites the same snapshot)."""
    return hashlib.sha1(config_json(config).encode("utf-8")).hexdigest()


def config_json(config: dict[str, Any] | None = None) -> str:
    """The ``config.json`` text written into the cache."""
    return json.dumps(OPT_125M_CONFIG if config is None else config, indent=2) + "\n"


def write_hf_cache(hf_home: Path) -> Path:
    """An offline Hugging Face cache holding :data:`MODEL`'s ``config.json``:
    ``hub/models--facebook--opt-125m/{refs/main, snapshots/<40-hex>/config.json}``;
    returns ``hf_home``."""
    repo = hf_home / "hub" / ("models--" + MODEL.replace("/", "--"))
    snapshot = hf_snapshot_id()
    try:
        (repo / "refs").mkdir(parents=True, exist_ok=True)
        (repo / "snapshots" / snapshot).mkdir(parents=True, exist_ok=True)
        (repo / "snapshots" / snapshot / "config.json").write_text(config_json(),
                                                                   encoding="utf-8")
        (repo / "refs" / "main").write_text(snapshot, encoding="utf-8")
    except OSError as exc:
        raise InputFileError(str(hf_home), f"cannot write the Hugging Face cache ({exc})"
                             ) from None
    return hf_home
