"""The audit judged on vLLM's own engine (issue 26): the target run, not modelled.

Where the target's vLLM can be imported (the installed wheel, a release or a checkout
composed over it: :mod:`kvcontract.live.judge.roots`; a patch laid over its base:
:mod:`kvcontract.live.overlay`), every clause family about upstream's behaviour is
decided on vLLM's objects: the ``upstream-*`` theorems observe each case on the real
scheduler, KV-cache manager, offload manager and connector
(:mod:`kvcontract.live.judge`), with the families' own judges. The search is the
audit's as before (the same cases, in the same order, the same ``--budget``); only the
observation changes. Everything else the audit checks (Z3 over upstream's pure
formulas, kvcontract's loop over upstream's bound functions, the executable system) is
*graded* by the engine (:func:`grade`): a counterexample whose root cause is the root
cause of no engine-judged finding is ``latent`` ("no run of vLLM's engine in this audit
reaches it").

Where vLLM cannot be imported, the ``upstream-*`` theorems run on kvcontract's stand-ins
as before, every counterexample is marked ``unconfirmed`` (judged on stand-ins, not run
on vLLM) and the default summary does not call it a defect of the release.

The engine lives in this process once :func:`prepare_engine` has imported it (before any
sandbox child is forked, so every child shares the import); each child builds its own
engines (:class:`EngineJudge` is per process).
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import os
import signal
import threading
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvcontract.spec.properties import CaseProperty, Property
from kvcontract.spec.properties.base import Family, LastCase
from kvcontract.tools.audit.audited_files import KNOWN_FILES
from kvcontract.tools.audit.derived_spaces import engine_family, stand_in_family
from kvcontract.tools.audit.targets import Target
from kvcontract.vocabulary import Impact, Verdict

ENGINE_FAMILIES = (Family.LOOKUP, Family.STORE, Family.END_TO_END)
"""The families vLLM's engine observes (its own scheduler, connector and store path)."""
ENGINE_LOOKUP, ENGINE_STORE, ENGINE_END_TO_END = map(engine_family, ENGINE_FAMILIES)

MODES = ("auto", "engine", "stand-ins")
"""``--judge``: ``auto`` (vLLM's engine where it imports, else stand-ins, said so),
``engine`` (vLLM's engine or exit 3 naming why not), ``stand-ins`` (the fallback, on
purpose: for comparing the two)."""

IMPORT_TIMEOUT = 600.0
"""Wall-clock seconds the import of the target's vLLM may take (a cold import is about
20 s): a watchdog, never a verdict."""

STAND_INS = "judged on stand-ins, not run on vLLM"

CONFLICT = "another vLLM is imported in this process"
"""The start of :func:`prepare_engine`'s reason when the target's vLLM could run, but not
in this process (:func:`kvcontract.tools.audit.command.produce_report` then runs the
audit in a fresh one)."""
"""The label of every finding the engine did not judge where no engine could run."""


@dataclass
class _Judges:
    pool: Any
    lookups: Any
    stores: Any
    resends: Any
    left_out: dict[str, Counter[str]] = field(default_factory=dict)


@dataclass
class EngineJudge:
    """The target's vLLM, importable in this process: its root, what it is, and (per
    process, built on first use) the case judges."""

    root: Any
    """:class:`kvcontract.live.judge.roots.VllmRoot`."""
    release: str
    """What the report calls it: ``vLLM 0.33.0``, ``a patch over vLLM 0.34.0``..."""
    description: str
    capabilities: dict[str, Any] = field(default_factory=dict)
    overlay: Any = None
    """A patch's definitions to lay over vLLM (:class:`kvcontract.live.overlay.Overlay`),
    installed in each process that judges (a sandbox child), never in the audit's own:
    a later audit in the same process meets the release unpatched."""
    _pid: int = -1
    _judges: _Judges | None = None

    def judges(self) -> _Judges:
        if self._judges is None or self._pid != os.getpid():
            if self.overlay is not None and not self.overlay.empty:
                from kvcontract.live.overlay import install
                from kvcontract.tools.audit.upstream_calls import StandInGap

                try:
                    install(self.overlay)
                except Exception as exc:  # the audit's gap: the theorem is UNKNOWN
                    raise StandInGap(f"the patch cannot be laid over vLLM in this process: "
                                     f"{type(exc).__name__}: {exc}") from exc
            # The audited functions of the running vLLM (the patch's among them) under
            # the audit's per-call limit, as the bound functions are: a hang is UNKNOWN.
            from kvcontract.tools.audit.upstream_calls import limit_loaded_release

            limit_loaded_release()
            from kvcontract.live.judge.engines import EnginePool
            from kvcontract.live.judge.lookups import LookupJudge
            from kvcontract.live.judge.resends import EndToEndJudge
            from kvcontract.live.judge.stores import StoreJudge

            pool = EnginePool()
            self._judges = _Judges(pool, LookupJudge(pool), StoreJudge(pool),
                                   EndToEndJudge(pool))
            self._pid = os.getpid()
        return self._judges

    def to_json(self) -> dict[str, Any]:
        return {"release": self.release, "description": self.description,
                "root": self.root.to_json(), "capabilities": self.capabilities}


# -- preparing the engine --------------------------------------------------------------------
class _ImportTimeout(Exception):
    pass


@contextlib.contextmanager
def _watchdog(seconds: float) -> Iterator[None]:
    """A wall-clock watchdog on the main thread (an import that hangs is no verdict)."""
    if threading.current_thread() is not threading.main_thread() or seconds <= 0:
        yield
        return

    def expire(signum: int, frame: Any) -> None:
        raise _ImportTimeout(f"the import of vLLM did not finish within {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _root_of(target: Target) -> Any:
    """The vLLM root that runs ``target``'s code (a patch's base for ``module:``)."""
    from kvcontract.live.judge.roots import installed_package, installed_root

    installed = installed_package()
    if installed is None:
        return installed_root()  # raises RootError naming the set-up
    tree = target.package_dir if target.kind == "vllm" else None
    base = target.base.package_dir if target.base is not None else None
    below = _release_beneath(base, installed) if base is not None else installed_root()
    if tree is None:
        return below
    return _release_beneath(tree, below.package if below.path is not None else installed)


def tree_root(tree: Any) -> Any:
    """The root running the ``vllm`` package folder ``tree`` laid over the installed
    vLLM (:func:`_release_beneath`); :class:`~kvcontract.live.judge.roots.RootError`
    naming why it cannot."""
    from kvcontract.live.judge.roots import RootError, installed_package

    installed = installed_package()
    if installed is None:
        raise RootError("no vllm package is installed in this Python to lay the tree over "
                        "(the live set-up: .ci/install-live)")
    return _release_beneath(tree, installed)


def _release_beneath(tree: Any, installed: Any) -> Any:
    """The root running ``tree`` laid over ``installed``. A tree holding only some of
    vLLM's files (a fetched release's audited files) runs among its own release's
    Python, not another's: where its ``_version.py`` names a release other than the
    installed one, that release's whole Python package (from the cached wheel) goes
    between, over the installed compiled parts."""
    from kvcontract.live.judge.roots import RootError, compose, version_of
    from kvcontract.tools.audit.wheels import FetchError, cache_dir, python_tree

    root = compose(tree, installed)
    if root.complete or root.version is None or root.version == root.installed_version:
        return root
    try:
        whole = python_tree(root.version)
    except FetchError as exc:
        raise RootError(str(exc)) from None
    if whole is None:
        raise RootError(
            f"{root.description}: {root.laid_files} files of vLLM {root.version} run only "
            f"among vLLM {root.version}'s other modules, and no wheel of it is cached "
            f"(pip download --no-deps --only-binary=:all: -d "
            f"{cache_dir() / 'wheels' / root.version} vllm=={root.version}, or install "
            f"vLLM {root.version})")
    release = compose(whole / "vllm", installed)
    laid = compose(tree, release.package)
    return dataclasses.replace(
        laid, installed_version=version_of(installed),
        description=f"vLLM {root.version} (its wheel's Python laid over the installed "
                    f"vLLM {version_of(installed) or '(version unknown)'}; "
                    f"{root.laid_files} files from {tree})")


def prepare_engine(target: Target, mode: str = "auto",
                   import_timeout: float = IMPORT_TIMEOUT) -> tuple[EngineJudge | None, str]:
    """The engine judge of ``target`` with vLLM imported in this process (and a patch
    laid over it), or None and why not (one line: what to install, or the import error
    that is kvcontract's gap)."""
    if mode not in MODES:
        from kvcontract.errors import UsageError

        raise UsageError(f"--judge must be one of {', '.join(MODES)}, not {mode!r}")
    if target.kind == "builtin":
        return None, "a built-in implementation is kvcontract's own code"
    if mode == "stand-ins":
        return None, "stand-ins were asked for (--judge stand-ins)"
    if target.kind == "module" and target.base is None:
        return None, ("the patch is audited alone (--base none); vLLM's engine runs a "
                      "patch laid over a release (--base)")
    from kvcontract.live.judge.roots import RootConflict, RootError, activate

    try:
        root = _root_of(target)
        activate(root)
    except RootConflict as exc:
        return None, f"{CONFLICT}: {exc}"
    except RootError as exc:
        return None, str(exc)
    overlay = None
    if target.kind == "module":
        from kvcontract.live.overlay import plan_overlay

        try:
            overlay = plan_overlay(target.files[0], root.package, KNOWN_FILES)
        except Exception as exc:  # the patch cannot be laid over: the audit's gap
            return None, f"the patch cannot be laid over {root.description}: {exc}"
    try:
        with _watchdog(import_timeout):
            from kvcontract.live.env import check

            found = check(import_modules=True)
            if not found.ok:
                return None, "; ".join(found.lines()[2:]) or "vLLM does not import here"
    except Exception as exc:  # an import that fails or hangs: kvcontract's gap, named
        return None, f"vLLM from {root.description} does not import: {type(exc).__name__}: " \
                     f"{exc}"
    release = root.description
    if target.kind == "module":
        release = f"the patch {target.files[0].name} laid over {root.description}"
    return EngineJudge(root, release, root.description, _capabilities(), overlay), ""


def _capabilities() -> dict[str, Any]:
    try:
        from kvcontract.live import env

        probe = getattr(env, "capabilities", None)
        if callable(probe):
            found = probe()
            return dict(found.to_json()) if hasattr(found, "to_json") else dict(vars(found))
    except Exception:
        return {}
    return {}


# -- the theorems -------------------------------------------------------------------------
ENGINE_LOOKUP_VIA = ("vLLM's own scheduler and OffloadingConnector: get_num_new_matched_"
                     "tokens, the allocation, update_state_after_alloc (prepare_load)")
ENGINE_STORE_VIA = ("vLLM's own scheduler and OffloadingConnector: schedule() / "
                    "update_from_output(), every store job's keys, GPU blocks and "
                    "offsets traced")
ENGINE_END_TO_END_VIA = ("vLLM's own engine: the producer's store jobs, then the "
                         "consumer's lookup over what vLLM's manager holds")
LEFT_OUT_NOTE = ("cases vLLM does not build, or its engine cannot put in the case's "
                 "situation, are left out, counted with the reason in the row's engine "
                 "section")


def is_engine_theorem(theorem: Property) -> bool:
    space = getattr(theorem, "space", None)
    return bool(getattr(space, "family", "").startswith("engine-"))


_FAMILY_CALLS: dict[str, tuple[Any, Any]] = {
    ENGINE_LOOKUP: (lambda j, c: j.lookups.why_not(c), lambda j, c: j.lookups.observe(c)),
    ENGINE_STORE: (lambda j, c: j.stores.why_not(c), lambda j, c: j.stores.observe(c)),
    ENGINE_END_TO_END: (lambda j, c: j.resends.why_not(c), lambda j, c: j.resends.observe(c)),
}
"""Per engine family, ``(why_not, observe)`` on the per-process judges: why vLLM's engine
cannot run a case (None: it can), and the engine's observation of one."""


def _accepts(judge: EngineJudge, family: str, why: Any) -> Any:
    def accepts(case: Any) -> bool:
        reason = why(judge.judges(), case)
        if reason is None:
            return True
        judge.judges().left_out.setdefault(family, Counter())[reason] += 1
        return False

    return accepts


def _observe(judge: EngineJudge, family: str, observe: Any) -> Any:
    from kvcontract.live.judge.lookups import NotRealized

    def run(case: Any, impl: Any) -> Any:
        del impl  # vLLM's engine runs its own code
        try:
            return observe(judge.judges(), case)
        except NotRealized as exc:
            judge.judges().left_out.setdefault(family, Counter())[str(exc)] += 1
            raise

    return run


def engine_theorems(judge: EngineJudge, lookups: Sequence[CaseProperty] | None,
                    stores: Sequence[CaseProperty] | None,
                    ends: Sequence[CaseProperty] | None) -> list[CaseProperty]:
    """The ``upstream-*`` theorems observed on vLLM's engine: the lookup, store and
    end-to-end properties that declare an upstream observer, with their judges, on the
    cases of their (catalogue or scoped) spaces that vLLM's engine can run."""
    from kvcontract.spec.properties.end_to_end import END_TO_END_SPACE
    from kvcontract.spec.properties.lookup import LOOKUP_SPACE
    from kvcontract.spec.properties.store import STORE_SPACE
    from kvcontract.tools.audit.derived_spaces import filtered_space
    from kvcontract.tools.audit.lookup import upstream_loop_name, upstream_loop_properties
    from kvcontract.tools.audit.store import (
        UPSTREAM_STORE,
        end_to_end_path_properties,
        store_path_properties,
    )

    made: list[CaseProperty] = []
    families = (
        (ENGINE_LOOKUP, upstream_loop_properties(lookups), LOOKUP_SPACE,
         ENGINE_LOOKUP_VIA, upstream_loop_name),
        (ENGINE_STORE, store_path_properties(stores), STORE_SPACE,
         ENGINE_STORE_VIA, lambda name: UPSTREAM_STORE + name),
        (ENGINE_END_TO_END, end_to_end_path_properties(ends), END_TO_END_SPACE,
         ENGINE_END_TO_END_VIA, lambda name: f"upstream-{name}"),
    )
    for family, properties, default_space, via, rename in families:
        why, observe = _FAMILY_CALLS[family]
        if not properties:
            continue
        base = properties[0].space if properties[0].space.family != "" else default_space
        accepts = _accepts(judge, family, why)
        space = filtered_space(base, family, LastCase(_observe(judge, family, observe)),
                               accepts, LEFT_OUT_NOTE)
        space = dataclasses.replace(space, driver=f"{via} ({judge.release})")
        made += [dataclasses.replace(prop, name=rename(prop.name), space=space, uses=(),
                                     description=f"vLLM's engine: {prop.description}")
                 for prop in properties]
    return made


LEGACY_HASHES_MODE = ("disable_lookahead_block_hashes=True (legacy block hashes; vLLM's "
                      "default, lookahead block hashes, is judged on the geometries that "
                      "state it: hash_lookahead)")
"""The mode of a finding on a geometry with a drafter (an EAGLE group, or ``e > 0``) on a
release whose connector hashes blocks with the drafter's lookahead by default: the engine
builds it with the legacy hashes the geometry states (:mod:`kvcontract.live.build`), so
the finding holds in that configuration, not in vLLM's default one."""


@dataclass(frozen=True)
class ModeSetting:
    """A configuration a geometry states that vLLM's default may not: the geometry's field,
    the vLLM option that sets it, and how to read vLLM's default for the field from the
    running vLLM (never from a release list)."""

    field: str
    option: str
    read_default: Any
    """``() -> value``: vLLM's default, as the geometry states it; raises where the
    running vLLM does not say."""
    meaning: str

    def label(self, value: Any, default: Any, evidence: str) -> str:
        return (f"{self.option}={value} ({self.meaning}; gone at vLLM's default, {default}: "
                f"{evidence})")


def _default_retention() -> Any:
    from vllm.config import CacheConfig

    return CacheConfig().prefix_cache_retention_interval


MODE_SETTINGS = (
    ModeSetting("retention_interval", "prefix_cache_retention_interval", _default_retention,
                "the retention of sliding-window checkpoints"),
)
"""The settings besides the block-hash mode that a finding may need (docs/CONTRACT.md 2,
9.3): each decided per finding on the engine, over its family with the setting at vLLM's
default (:func:`finding_mode`). Not among them: DCP (vLLM's engine on CPU builds no DCP
geometry, so no engine finding has one) and partial tails (no option turns them on: vLLM
derives them from the model, one block per chunk, uniform block sizes and a recurrent
group, so a finding on such a geometry holds in vLLM's default mode for that model)."""


def _drafter_on_legacy_hashes(geometry: Any) -> bool:
    """A geometry with a drafter (an EAGLE group, or ``e > 0``) built with legacy block
    hashes: a mode beyond vLLM's default where the release has lookahead hashes."""
    return not getattr(geometry, "hash_lookahead", 0) and any(
        g.eagle or g.extra_retained_tokens for g in getattr(geometry, "groups", ()))


def _with_geometry_field(encoded: Any, name: str, value: Any) -> Any:
    """A case's JSON with ``name`` set to ``value`` in every geometry it holds (an
    end-to-end case holds its producer's and its consumers')."""
    if isinstance(encoded, dict):
        return {key: ({**item, name: value} if key == "geometry" and isinstance(item, dict)
                      else _with_geometry_field(item, name, value))
                for key, item in encoded.items()}
    if isinstance(encoded, list):
        return [_with_geometry_field(item, name, value) for item in encoded]
    return encoded


MODE_SEARCH_CASES = 600
"""Cases of a finding's family judged at a setting's default before its mode is called
undecided (:func:`default_mode_search`): a count, never seconds."""


@dataclass
class ModeSearch:
    """A finding's theorem judged on its family's cases with one geometry setting at
    vLLM's default (:func:`default_mode_search`)."""

    failing: Any = None
    """The first case that fails there (None: none found)."""
    judged: int = 0
    complete: bool = False
    """Every case of the family was looked at (the budget did not stop the search)."""
    left_out: Counter[str] = field(default_factory=Counter)
    """Changed cases the engine cannot run, by why."""


def default_mode_search(judge: EngineJudge, theorem: CaseProperty, case: Any, name: str,
                        value: Any, budget: int) -> ModeSearch:
    """``theorem`` judged on vLLM's engine with every geometry's ``name`` set to ``value``:
    ``case`` (the witness) first, then each case of the theorem's family in its order
    (duplicates once) in the witness's block-hash mode (a case that needs another mode
    shows nothing about this one), until one fails or ``budget`` cases were judged. A
    finding gone at the witness may stay on another case of the family: only the family
    decides."""
    from kvcontract.errors import KvContractError
    from kvcontract.live.judge.lookups import NotRealized
    from kvcontract.tools.audit.upstream_calls import StandInGap, UpstreamError, UpstreamTimeout

    search = ModeSearch()
    calls = _FAMILY_CALLS.get(theorem.space.family)
    if calls is None:
        search.left_out[f"the {theorem.space.family!r} family is not judged on the "
                        "engine"] += 1
        return search
    why_not, observe = calls
    base = theorem.space.shares[0] if theorem.space.shares else theorem.space
    legacy = _drafter_on_legacy_hashes(getattr(case, "geometry", None))
    seen: set[str] = set()
    for original in itertools.chain((case,), base.cases()):
        if search.judged >= budget:
            return search
        if _drafter_on_legacy_hashes(getattr(original, "geometry", None)) != legacy:
            continue
        try:
            encoded = _with_geometry_field(theorem.space.to_json(original), name, value)
            key = repr(encoded)
            if key in seen:
                continue
            seen.add(key)
            changed = theorem.space.decode(encoded)
        except (KvContractError, KeyError, TypeError, ValueError) as exc:
            search.left_out[f"no form with {name}={value!r}: {type(exc).__name__}"] += 1
            continue
        reason = why_not(judge.judges(), changed)
        if reason is not None:
            search.left_out[str(reason)] += 1
            continue
        if theorem.relevant is not None and not theorem.relevant(changed):
            continue
        search.judged += 1
        try:
            violation = theorem.judge(changed, observe(judge.judges(), changed))
        except (NotRealized, StandInGap, UpstreamTimeout) as exc:  # kvcontract's gap, a hang
            search.left_out[type(exc).__name__] += 1
            continue
        except UpstreamError:  # vLLM itself raised there: a finding in that setting
            violation = "raised"
        if violation is not None:
            search.failing = changed
            return search
    search.complete = True
    return search


def finding_mode(case: Any, theorem: CaseProperty | None = None,
                 judge: EngineJudge | None = None) -> str | None:
    """The configuration an engine finding on ``case`` needs beyond vLLM's defaults, None
    when it is found in vLLM's default mode. The block-hash mode from the geometry
    (:data:`LEGACY_HASHES_MODE`); each of :data:`MODE_SETTINGS` the geometry states
    otherwise than vLLM's default, by :func:`default_mode_search`: nothing when a case of
    the family fails at the default, named when none does in the whole family, "not
    decided" when the budget or the engine's reach stopped the search. Called in the
    process that judged it."""
    needs: list[str] = []
    geometry = getattr(case, "geometry", None)
    if _drafter_on_legacy_hashes(geometry):
        from kvcontract.live.capabilities import has

        if has("lookahead-block-hashes"):
            needs.append(LEGACY_HASHES_MODE)
    if geometry is None or theorem is None or judge is None:
        return "; ".join(needs) or None
    for setting in MODE_SETTINGS:
        value = getattr(geometry, setting.field)
        try:
            default = setting.read_default()
        except Exception as exc:  # a release whose config does not say: named, not guessed
            needs.append(f"{setting.option}={value} (vLLM's default could not be read: "
                         f"{type(exc).__name__}: {exc}; not decided)")
            continue
        if value == default:
            continue
        search = default_mode_search(judge, theorem, case, setting.field, default,
                                     MODE_SEARCH_CASES)
        if search.failing is not None:
            continue
        left = (f"; {sum(search.left_out.values())} left out, "
                f"{search.left_out.most_common(1)[0][0]}" if search.left_out else "")
        if search.complete and search.judged:
            needs.append(setting.label(value, default, f"{search.judged} cases of the "
                                                       f"family hold there{left}"))
        else:
            needs.append(f"{setting.option}={value} (not decided at vLLM's default, "
                         f"{default}: {search.judged} cases hold there"
                         f"{', the budget stopped the search' if not search.complete else ''}"
                         f"{left})")
    return "; ".join(needs) or None


def engine_section(judge: EngineJudge, theorem: Property) -> dict[str, Any]:
    """What a row of an engine theorem reports of the engine: the release, the vLLM runs
    and the cases left out (with why)."""
    judges = judge.judges()
    family = str(getattr(getattr(theorem, "space", None), "family", ""))
    stats: dict[str, Any] = {"release": judge.release}
    if family == ENGINE_LOOKUP:
        stats["vllm_runs"] = judges.lookups.stats.runs
        stats["shared_runs"] = judges.lookups.stats.shared
    elif family == ENGINE_STORE:
        stats["vllm_runs"] = judges.stores.runs
    elif family == ENGINE_END_TO_END:
        stats["vllm_runs"] = judges.resends.runs + judges.resends.consumers
    left = judges.left_out.get(family)
    if left:
        stats["left_out"] = dict(sorted(left.items(), key=lambda kv: -kv[1]))
    return stats


# -- root causes on the engine ----------------------------------------------------------
def engine_root_cause(theorem: CaseProperty, witness: Any, binding: Any,
                      base: Property | None) -> dict[str, Any] | None:
    """The root cause of an engine finding: the upstream function whose replacement by
    the reference (in its own signature, on the running vLLM: :mod:`kvcontract.live.
    judge.rebinding`) makes the witness pass on a fresh engine (``rebound``); else what
    kvcontract's driver over the same bound functions finds (``inferred``); else the
    connector's own loop or store path (``loop``)."""
    from kvcontract.live.judge.rebinding import REPLACEMENTS, rebound
    from kvcontract.tools.audit import root_cause

    judge: EngineJudge = binding.engine
    modules = _modules(binding)
    family = theorem.space.family
    for role in REPLACEMENTS:
        if role not in binding.functions:
            continue
        try:
            with rebound([role], modules):
                fresh = EngineJudge(judge.root, judge.release, judge.description,
                                    overlay=judge.overlay)
                observation = _fresh_observe(fresh, family, witness)
                if observation is not None and theorem.judge(witness, observation) is None:
                    return root_cause.describe(binding, [role], "rebound")
        except Exception:
            continue
    if base is not None:
        # Does kvcontract's driver over the same upstream functions fail on the witness
        # too? Then the smallest replacement of those functions that fixes it there is
        # named (the replacement inside vLLM was not run: ``inferred``).
        from kvcontract.tools.audit.recheck import _fails, theorem_fields

        driver = root_cause.filled_implementation(binding)
        try:
            driver_fails = _fails(base, driver, witness)
        except Exception:
            driver_fails = False
        if driver_fails:
            names = root_cause._field_cause(base, binding, witness,
                                            list(theorem_fields(base)), driver)
            if names is not None:
                return root_cause.describe(binding, root_cause._roles_of_fields(binding, names),
                                           "inferred", names)
    if family == ENGINE_LOOKUP:
        return root_cause.describe(binding, [root_cause.LOOKUP_LOOP_ROLE], "loop")
    absent = _absent_junction_registration(binding, theorem, witness)
    if absent is not None:
        return absent
    from kvcontract.tools.audit.store import blame

    return root_cause.describe(binding, [blame(theorem, witness)[1]], "loop")


def engine_observer(binding: Any, theorem: Property) -> Any:
    """What ``explain`` draws an engine-judged row from: a function observing one case
    of ``theorem``'s family on the audit target's vLLM (the engine prepared on first
    use), or None where no engine runs here or the family has none (the picture then
    comes from kvcontract's binding, as an audit without vLLM draws it)."""
    family = REPLAYED_FAMILIES.get(str(getattr(getattr(theorem, "space", None), "family",
                                               "")))
    if family is None:
        return None
    if binding.engine is None:
        binding.engine, _why = prepare_engine(binding.target)
    judge: EngineJudge | None = binding.engine
    if judge is None:
        return None
    return lambda case: _fresh_observe(judge, family, case)


JUNCTION_REGISTRATION = "OffloadingConnectorScheduler._maybe_register_shared_prefix_junction"
"""The connector method that registers a shared-prefix junction (docs/CONTRACT.md 9.3)."""
LOOKUP_ENTRY = "OffloadingConnectorScheduler._lookup"
"""The connector's lookup of a request: where a release with junctions registers one
after accepting a hit."""


def _absent_junction_registration(binding: Any, theorem: CaseProperty,
                                  witness: Any) -> dict[str, Any] | None:
    """The root cause of a junction consumer's finding on a release whose connector has no
    junction registration (no :data:`JUNCTION_REGISTRATION` in the lookup's file) and
    registered none where the contract registers one: the connector's lookup
    (:data:`LOOKUP_ENTRY`), where the registration is missing, not the loop that answered
    correctly for the junction it was given. None for any other finding."""
    from pathlib import Path

    from kvcontract.spec.properties.end_to_end import EndToEndCase, first_consumer, spec_junction
    from kvcontract.tools.audit.binding import _index
    from kvcontract.tools.audit.root_cause import LOOKUP_LOOP_ROLE

    if not isinstance(witness, EndToEndCase) or witness.consumer.kind != "junction":
        return None
    loop = binding.roles.get(LOOKUP_LOOP_ROLE)
    if loop is None or loop.path is None:
        return None
    functions = _index(Path(loop.path))
    entry = functions.get(LOOKUP_ENTRY)
    expected = spec_junction(witness.geometry, witness.producer, first_consumer(witness))
    if JUNCTION_REGISTRATION in functions or entry is None or not expected:
        return None
    try:
        observation = _fresh_observe(binding.engine, theorem.space.family, witness)
    except Exception:  # the witness's own run raised: not this cause
        return None
    if getattr(observation, "junction", None) != 0:
        return None
    return {"how": "loop", "functions": [{
        "role": "junction_registration", "qualname": LOOKUP_ENTRY,
        "what": (f"registers no shared-prefix junction (the contract's: {expected}); the "
                 "release has no junction registration"),
        "path": str(entry.path), "line": entry.line}]}


def _fresh_observe(judge: EngineJudge, family: str, witness: Any) -> Any:
    calls = _FAMILY_CALLS.get(family)
    return None if calls is None else calls[1](judge.judges(), witness)


# -- costs on the engine ---------------------------------------------------------------------
ENGINE_LENGTHS = 4
"""Prompt lengths per preset geometry of an engine-measured cost (each a producer's
prefill of 4-12k tokens and a resend on vLLM, on both sides): about 30 s of CPU for
every preset; kvcontract's model measures 24."""


def rebindable(cause: dict[str, Any]) -> list[str]:
    """The roles of a root cause the running vLLM can have replaced by the reference
    (:mod:`kvcontract.live.judge.rebinding`), empty when it is another kind of cause."""
    from kvcontract.live.judge.rebinding import REPLACEMENTS

    roles = [str(f.get("role")) for f in cause.get("functions") or []]
    if cause.get("how") != "rebound" or not roles or \
            not all(r in REPLACEMENTS for r in roles):
        return []
    return roles


def _modules(binding: Any) -> dict[str, str]:
    from kvcontract.live.judge.rebinding import REPLACEMENTS, module_of

    package = str(binding.engine.root.package)
    found: dict[str, str] = {}
    for role in REPLACEMENTS:
        record = binding.roles.get(role)
        if record is not None and record.path:
            module = module_of(record.path, package)
            if module is not None:
                found[role] = module
    return found


def engine_resends(binding: Any, roles: Sequence[str]) -> tuple[Any, Any, Any, Any]:
    """The two sides of a cost on vLLM's engine: ``(bound_resend, patched_resend,
    bound_store, patched_store)``; the patched side runs with ``roles`` replaced by the
    reference inside vLLM (its engines built and run inside the replacement)."""
    from kvcontract.live.judge.lookups import NotRealized
    from kvcontract.live.judge.rebinding import rebound
    from kvcontract.spec.properties.end_to_end import ResendPoint, _unread

    judge: EngineJudge = binding.engine
    patched = EngineJudge(judge.root, judge.release, judge.description,
                          overlay=judge.overlay)
    modules = _modules(binding)

    def resend_on(engine: EngineJudge) -> Any:
        def resend(case: Any) -> Any:
            resends = engine.judges().resends
            why = resends.why_not(case)
            if why is not None:
                return why
            try:
                observation = resends.observe(case)
            except NotRealized as exc:
                return str(exc)
            hit = observation.hit_tokens
            unread = _unread(case, observation, hit) if hit else None
            return ResendPoint(case.consumer.num_tokens, hit, None,
                               None if unread is None else
                               (unread[0], unread[1], unread[2].name))

        return resend

    def store_on(engine: EngineJudge) -> Any:
        def store(case: Any) -> Any:
            return engine.judges().stores.observe(case)

        return store

    def inside(fn: Any) -> Any:
        def call(case: Any) -> Any:
            with rebound(roles, modules):
                return fn(case)

        return call

    return (resend_on(judge), inside(resend_on(patched)), store_on(judge),
            inside(store_on(patched)))


# -- a witness of kvcontract's drivers, replayed on the engine ---------------------------------
REPLAYED_FAMILIES = {
    **{str(family): engine_family(family) for family in ENGINE_FAMILIES},
    **{stand_in_family(family): engine_family(family) for family in ENGINE_FAMILIES}}
"""The case families whose witnesses vLLM's engine can run (the same cases its own
``upstream-*`` theorems observe; those theorems' stand-in families too, for a
reproducer of an engine finding)."""


def replay_on_engine(theorem: Property, witness: Any, binding: Any) -> dict[str, Any] | None:
    """A counterexample of kvcontract's driver over upstream's bound functions, its
    witness run on vLLM's engine and judged by the same judge: ``{"fails": True,
    "message"}`` (the engine shows it), ``{"fails": False}`` (it does not), ``{"why"}``
    (the engine cannot run it); None when the audit has no engine or the family none."""
    judge: EngineJudge | None = binding.engine
    if judge is None or not isinstance(theorem, CaseProperty):
        return None
    family = REPLAYED_FAMILIES.get(str(theorem.space.family))
    if family is None:
        return None
    from kvcontract.live.judge.lookups import NotRealized

    judges = judge.judges()
    why = {ENGINE_LOOKUP: judges.lookups, ENGINE_STORE: judges.stores,
           ENGINE_END_TO_END: judges.resends}[family].why_not(witness)
    if why is not None:
        return {"why": why}
    try:
        observation = _fresh_observe(judge, family, witness)
    except NotRealized as exc:
        return {"why": str(exc)}
    message = theorem.judge(witness, observation)
    if message is None:
        return {"fails": False}
    return {"fails": True, "message": str(message)}


# -- grading by the engine ------------------------------------------------------------------
def _causes(row: dict[str, Any]) -> set[str]:
    cause = row.get("root_cause") or {}
    return {str(f.get("qualname")) for f in cause.get("functions") or [] if f.get("qualname")}


def grade(rows: list[dict[str, Any]], engine: dict[str, Any] | None) -> None:
    """Grade every counterexample the engine did not judge itself, in place.

    With an engine (``engine`` is the report's engine section, ``ran``): such a finding
    keeps its impact when vLLM's engine shows it, either its own witness replayed there
    fails the same judge (``engine_replay``), or its root cause is the root cause of a
    finding the engine showed (an engine-judged one, or a replayed one); ``reached_by``
    says which. Else it is ``latent``: no run of vLLM's engine in this audit reaches it;
    but where an engine search stopped short of its family's end (``TESTED``: the budget,
    or ``UNKNOWN``), not reaching it proves nothing: ``unconfirmed``, exit 3.
    Without an engine where one was wanted (``fallback``): it is ``unconfirmed`` (judged
    on stand-ins, not run on vLLM), shown and never called a defect of the release;
    where stand-ins were chosen, it stands as the stand-ins judged it (every report
    says who judged). Idempotent: the impact the check found is kept in
    ``found_impact``."""
    def shown(row: dict[str, Any]) -> bool:
        if row.get("verdict") != Verdict.COUNTEREXAMPLE.value:
            return False
        if (row.get("found_impact") or row.get("impact")) == Impact.LATENT.value:
            return False
        return row.get("judge") == "engine" or bool(
            (row.get("engine_replay") or {}).get("fails"))

    confirmed = [r for r in rows if shown(r)]
    # An engine search that stopped before the end of its family (the budget, or an
    # UNKNOWN) may not have reached a finding: not reaching it then proves nothing.
    short = [f"{r['clause']}/{r['theorem']}" for r in rows if r.get("judge") == "engine"
             and r.get("verdict") in (Verdict.TESTED.value, Verdict.UNKNOWN.value)
             and not str(r.get("theorem", "")).startswith("live-")]
    for row in rows:
        if row.get("judge") in ("engine", None) or \
                row.get("verdict") != Verdict.COUNTEREXAMPLE.value:
            continue
        found = row.setdefault("found_impact", row.get("impact"))
        row["impact"] = found
        for key in ("reached_by", "unconfirmed", "mode"):
            row.pop(key, None)
        if found == Impact.LATENT.value:
            continue
        if engine is None or not engine.get("ran"):
            if engine is not None and engine.get("fallback"):
                row["unconfirmed"] = f"{STAND_INS} ({engine.get('why') or 'no engine'})"
            continue
        if (row.get("engine_replay") or {}).get("fails"):
            row["reached_by"] = ["its witness, run on vLLM's engine"]
            continue
        causes = _causes(row)
        reaching = [r for r in confirmed if r is not row and causes and causes & _causes(r)]
        if reaching:
            row["reached_by"] = [f"{r['clause']}/{r['theorem']}" for r in reaching]
            # shown only in a configuration beyond vLLM's defaults: so is this finding
            # (judged by the engine findings of its own impact where there are any: a
            # store path that wastes in the default mode loses hits only in another)
            alike = [r for r in reaching if r.get("impact") == found] or reaching
            modes = {r.get("mode") for r in alike}
            if len(modes) == 1 and None not in modes:
                row["mode"] = modes.pop()
            continue
        if short:
            row["unconfirmed"] = (
                f"vLLM's engine did not show it, but its search stopped short of the end "
                f"({', '.join(short[:3])}{' ...' if len(short) > 3 else ''}: the budget "
                "or an unknown); a larger --budget decides")
            continue
        row["impact"] = Impact.LATENT.value
        row["latent"] = (f"no run of vLLM's engine in this audit reaches it "
                         f"({engine.get('release')}: neither its witness nor its root "
                         "cause shows on the engine)")


__all__ = ["MODES", "STAND_INS", "EngineJudge", "engine_root_cause", "engine_section",
           "engine_theorems", "grade", "is_engine_theorem", "prepare_engine",
           "replay_on_engine"]
