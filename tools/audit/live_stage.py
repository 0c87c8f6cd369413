"""``audit --live``: each defect's system-level witness replayed on vLLM itself.

The audit's findings come from upstream's functions run among kvcontract's stand-ins;
this stage asks vLLM's own scheduler and ``OffloadingConnector`` (through
:mod:`kvcontract.live`) whether what a defect reports happens there. For every defect
on a geometry vLLM builds, the cases that show it as a scenario are replayed live:

* its headline witness, when that is a producer/consumer case (C12's): the consumer's
  accepted hit against the spec's promise (:func:`kvcontract.live.confirm.confirm_case`:
  a lost hit, a crash, a consumer left deferred);
* its headline witness, when that is a store schedule (C8-C10's ``StoreCase``): the
  producer alone on vLLM, its store offers per group and step
  (:func:`kvcontract.live.confirm.replay_store_case`) judged by the witness's own
  theorem's judge (the store family's, unchanged: what the stand-ins' run was judged
  by), or the crash vLLM raises;
* the first resend its preset cost found losing (the worst geometry of the cost).

Each defect gets ``live``: ``confirmed`` (vLLM did what the defect says on at least one
case: the observed numbers are kept), ``not reproduced`` (vLLM ran every case and did
not: the audit's stand-ins disagree with vLLM, the text names which, and the finding
must not be presented as a defect until that is explained), or ``not replayable`` (why:
vLLM is not installed or is another release than the target's, vLLM will not build the
geometry or makes another chunked-prefill schedule, the witness is a formula or a
lookup state that no trace builds).

**Patches run live.** A ``module:FILE.py`` patch or a source tree is replayed as the
installed wheel with the target's Python laid over it (:mod:`kvcontract.live.overlay`,
planned here, installed in the child before any case): the patch's functions replace
the release's in their modules, the rest stays the release's, as the stand-in audit
binds it (the patch first, the base release's own code for what it does not define).
So the base the patch was audited over must be the installed release; a tree's files
that differ from the installed ones are laid over it the same way.

vLLM runs in a sandbox child (its import and engines take about 12 s and 600 MiB),
with the audit's CPU-time limits. Nothing here changes a verdict or an exit code.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvcontract.live.overlay import Overlay, combine, plan_overlay
from kvcontract.vocabulary import Impact

LIVE_CPU_SECONDS = 1800.0
"""CPU seconds the child that drives vLLM may use (a safety net: a case takes well under
a second once vLLM is imported)."""

STATUSES = ("confirmed", "not reproduced", "not replayable")

UPSTREAM_STORE = "upstream-store-"
"""The audit's theorems of upstream's executed store path (tools/audit/store.py) carry
the store family's judges under this prefix."""

SHOWN_BY_VERDICT = {Impact.LOST_HIT.value: "lost-hit", Impact.CRASH.value: "crash",
                    Impact.DELAY.value: "deferred"}
"""The live verdict of a producer/consumer replay that shows a defect of each impact."""


@dataclass(frozen=True)
class Replay:
    """One case to run live for a defect."""

    defect: str
    kind: str
    """``end-to-end`` (an :class:`EndToEndCase`) or ``store`` (a :class:`StoreCase`)."""
    label: str
    case: dict[str, Any]
    theorem: str | None = None
    """The catalogue theorem whose judge reads a store replay."""


@dataclass
class LiveTarget:
    """What the live engine runs for a report's target: the installed wheel with an
    overlay, or why it cannot."""

    overlay: Overlay = field(default_factory=Overlay)
    why: str | None = None
    release: str | None = None
    """The release the target's code is (or is laid over)."""


# -- what runs -----------------------------------------------------------------------
def _installed_package() -> Path | None:
    from kvcontract.errors import KvContractError
    from kvcontract.tools.audit.targets import resolve_target

    try:
        return resolve_target("vllm:installed").package_dir
    except KvContractError:
        return None


def live_target(spec: str, installed: str | None) -> LiveTarget:
    """The overlay that makes the installed vLLM run the target ``spec`` (a report's
    ``target``: ``@base=`` included), or why it cannot."""
    from kvcontract.errors import KvContractError
    from kvcontract.tools.audit.audited_files import KNOWN_FILES
    from kvcontract.tools.audit.targets import resolve_target

    try:
        target = resolve_target(spec)
    except KvContractError as exc:
        return LiveTarget(why=f"the target cannot be read again here: {exc}")
    if target.kind == "builtin":
        return LiveTarget(why="a built-in implementation is kvcontract's own code, which "
                              "vLLM does not run (`kvcontract live` runs vLLM's)")
    package = _installed_package()
    if package is None:
        return LiveTarget(why="no installed vllm package to lay the target over")
    base = target.base
    if target.kind == "module":
        release = base.version if base is not None else installed
        if base is not None and base.version != installed:
            return LiveTarget(why=f"the patch was audited over vLLM {base.version}, the "
                                  f"installed vLLM is {installed}: install the base's "
                                  "release (or audit over --base vllm:installed)",
                              release=release)
        overlay = plan_overlay(target.files[0], package, KNOWN_FILES)
        if base is None:
            overlay = Overlay(overlay.layers, (*overlay.notes, "audited alone (--base none); "
                              f"laid over the installed vLLM {installed} live"))
        return LiveTarget(overlay, release=release)
    assert target.package_dir is not None
    release = base.version if base is not None else target.version
    if release is not None and release != installed:
        what = "is laid over" if base is not None else "is"
        return LiveTarget(why=f"the target {what} vLLM {release}, the installed vLLM is "
                              f"{installed}: install the target's release to confirm it",
                          release=release)
    overlays = []
    for rel in KNOWN_FILES:
        own = target.package_dir / rel
        if own.is_file() and (package / rel).is_file() and \
                own.resolve() != (package / rel).resolve() and \
                own.read_bytes() != (package / rel).read_bytes():
            overlays.append(plan_overlay(own, package, (rel,)))
    return LiveTarget(combine(overlays), release=release)


# -- which cases show a defect ---------------------------------------------------------
def _witness_kind(witness: Mapping[str, Any]) -> str:
    if isinstance(witness.get("producer"), Mapping) and \
            isinstance(witness.get("consumer"), Mapping):
        return "end-to-end"
    if "steps" in witness and "ending" in witness and "prompt_len" in witness:
        return "store"
    if "states" in witness:
        return "lookup"
    return "formula"


def store_theorem(theorem: str) -> str:
    """The catalogue theorem whose judge an audit theorem of a store witness uses
    (``C10/upstream-store-stores-well-formed`` -> ``C10/stores-well-formed``)."""
    clause, _, name = theorem.partition("/")
    return f"{clause}/{name.removeprefix(UPSTREAM_STORE)}"


def replays_of(defect: Mapping[str, Any]) -> tuple[list[Replay], str | None]:
    """The cases that show ``defect`` live, and why its headline witness is not one
    (None when it is)."""
    from kvcontract.spec.geometry import Geometry
    from kvcontract.spec.properties.end_to_end import resend_case

    found: list[Replay] = []
    headline = defect.get("witness") or {}
    theorem = str(headline.get("theorem", ""))
    witness = headline.get("witness") or {}
    kind = _witness_kind(witness) if isinstance(witness, Mapping) else "formula"
    why: str | None = None
    if kind == "end-to-end":
        found.append(Replay(str(defect["id"]), kind, f"witness {theorem}",
                            {k: witness[k] for k in ("producer", "consumer")}))
    elif kind == "store" and witness.get("start_hit"):
        why = (f"its witness ({theorem}) is a producer that starts from a cached prefix "
               "(start_hit): the live stage builds no first request for it to hit")
    elif kind == "store" and witness.get("max_offload_tokens") is not None:
        why = (f"its witness ({theorem}) caps the request's max_offload_tokens, which the "
               "live traces do not pass")
    elif kind == "store":
        case = {k: v for k, v in witness.items() if k not in ("kind", "theorem")}
        found.append(Replay(str(defect["id"]), kind, f"witness {theorem}", case,
                            store_theorem(theorem)))
    elif kind == "lookup":
        why = (f"its witness ({theorem}) is a lookup state: the manager's answer per chunk, "
               "set directly; the live stage builds no trace that reaches a given state "
               "(only producer/consumer and store-schedule witnesses are replayed)")
    else:
        why = f"its witness ({theorem or 'none'}) is a formula over sizes: nothing to run"
    rows = (defect.get("cost") or {}).get("rows") or []
    example = next((r["example"] for r in rows if r.get("example")), None)
    if example and defect.get("impact") == Impact.LOST_HIT.value:
        geometry = Geometry.from_dict(example["geometry"])
        row = next(r for r in rows if r.get("example") is example)
        case_json = resend_case(str(row["geometry"]), geometry, int(example["prompt"])).to_json()
        found.append(Replay(str(defect["id"]), "end-to-end",
                            f"{row['geometry']} resend of P={example['prompt']}", case_json))
    return found, why


# -- the child ---------------------------------------------------------------------------
def _run_end_to_end(replay: Replay) -> dict[str, Any]:
    from kvcontract.live.confirm import confirm_case
    from kvcontract.spec.properties.end_to_end import EndToEndCase

    confirmation = confirm_case(EndToEndCase.from_json(replay.case), keep_observation=False)
    return {"case": replay.label, "kind": replay.kind, "verdict": confirmation.verdict,
            "observed_hit": confirmation.observed_hit,
            "promised_hit": confirmation.promised_hit,
            "gpu_promise": confirmation.gpu_promise,
            "raised": confirmation.raised, "refused": confirmation.refused}


def live_store_run(case: Any, offers: Any) -> Any:
    """A :class:`~kvcontract.spec.properties.store.StoreRun` of vLLM's offers per group
    and step. vLLM's ``next_stored_chunk_idx`` is not observed live: the run carries the
    spec's, so ``store-steps`` compares the offers alone."""
    from typing import cast

    from kvcontract.impl.scheduler import StoreTracker
    from kvcontract.spec.properties.store import StoreRun, _spec_run, schedule_steps
    from kvcontract.tools.audit.store import UpstreamOffers
    from kvcontract.vocabulary import RequestStatus

    trackers = []
    for g, per_step in enumerate(offers):
        tracker = UpstreamOffers(g)
        tracker.offers.extend(list(o) for o in per_step)
        trackers.append(tracker)
    steps = schedule_steps(case)
    frontiers = [s.num_computed for s in steps if s.status is RequestStatus.PREFILLING]
    indices = [_spec_run(case, g)[1] for g in range(len(case.geometry.groups))]
    return StoreRun(cast(list[StoreTracker], trackers), indices, frontiers,
                    steps[-1].num_computed)


def _run_store(replay: Replay) -> dict[str, Any]:
    from kvcontract.live.confirm import replay_store_case
    from kvcontract.spec.properties.catalog import get_property
    from kvcontract.spec.properties.store import StoreCase

    case = StoreCase.from_json(replay.case)
    done = replay_store_case(case)
    result: dict[str, Any] = {"case": replay.label, "kind": replay.kind,
                              "theorem": replay.theorem, "offers": done.to_json()["offers"],
                              "scheduled": list(done.scheduled),
                              "expected_schedule": list(done.expected_schedule),
                              "raised": done.raised, "refused": done.refused}
    if done.refused is not None:
        return {**result, "verdict": "refused"}
    if done.raised is not None:
        return {**result, "verdict": "crash"}
    if done.schedule_differs:
        return {**result, "verdict": "other schedule"}
    judge = get_property(str(replay.theorem)).judge  # type: ignore[union-attr]
    message = judge(case, live_store_run(case, done.offers))
    return {**result, "verdict": "violated" if message else "holds",
            "message": str(message) if message else None}


def _replay(replays: list[Replay], overlay: Overlay) -> dict[str, Any]:
    """Run in the child: the overlay laid over vLLM, then every case, by defect id."""
    from kvcontract.live import env
    from kvcontract.live.overlay import install

    env.require()
    installed = install(overlay) if not overlay.empty else list(overlay.notes)
    results: dict[str, list[dict[str, Any]]] = {}
    for replay in replays:
        run = _run_store if replay.kind == "store" else _run_end_to_end
        try:
            result = run(replay)
        except Exception as exc:  # one case that cannot run leaves the others' results
            result = {"case": replay.label, "kind": replay.kind, "verdict": "error",
                      "error": f"{type(exc).__name__}: {exc}"}
        results.setdefault(replay.defect, []).append(result)
    return {"results": results, "overlay": installed}


# -- statuses ------------------------------------------------------------------------------
def _shows(impact: str, result: Mapping[str, Any]) -> bool:
    if result["kind"] == "store":
        return result["verdict"] == "violated" or (
            result["verdict"] == "crash" and impact == Impact.CRASH.value)
    return result["verdict"] == SHOWN_BY_VERDICT.get(impact, "lost-hit") or \
        result["verdict"] in ("lost-hit", "crash")


def _describe(result: Mapping[str, Any]) -> str:
    if result["kind"] == "store":
        if result["verdict"] == "violated":
            return f"vLLM's store path: {result['message']} ({result['case']})"
        if result["verdict"] == "crash":
            return f"vLLM raised {result['raised']} ({result['case']})"
        offered = {g: sorted({c for step in steps for c in step})
                   for g, steps in enumerate(result["offers"])}
        return (f"vLLM offered {offered} on {result['case']} (scheduled "
                f"{result['scheduled']}) and {result['theorem']} holds there")
    if result["verdict"] == "lost-hit":
        return (f"vLLM accepted {result['observed_hit']}, the spec promises "
                f"{result['gpu_promise']} ({result['case']})")
    if result["verdict"] == "crash":
        return f"vLLM raised {result['raised']} ({result['case']})"
    return (f"vLLM gave {result['verdict']} ({result['observed_hit']} tokens, promise "
            f"{result['gpu_promise']}) on {result['case']}")


STAND_INS = {"store": "the audit's stand-in store path (tools/audit/store.py: upstream's "
                      "_build_store_jobs among stand-ins) disagrees with vLLM there",
             "end-to-end": "the audit's stand-ins (tools/audit/store.py's store path and "
                           "tools/audit/lookup.py's lookup, or kvcontract's loop over the "
                           "bound functions) disagree with vLLM there"}


def _unrun(result: Mapping[str, Any]) -> str:
    if result["verdict"] == "error":
        return f"the live stage could not run the case ({result['case']}): {result['error']}"
    if result["verdict"] == "refused":
        return f"vLLM would not build the case: {result['refused']}"
    return (f"vLLM schedules the producer {result['scheduled']} under the case's budget, "
            f"the witness's schedule is {result['expected_schedule']}")


def status_of(impact: str, replays: list[dict[str, Any]]) -> tuple[str, str]:
    """A defect's live status and its text from its replays."""
    shown = [r for r in replays if _shows(impact, r)]
    if shown:
        return "confirmed", _describe(shown[0])
    ran = [r for r in replays if r["verdict"] not in ("refused", "other schedule", "error")]
    if not ran:
        return "not replayable", ("; ".join(_unrun(r) for r in replays)
                                  if replays else "no case to replay")
    first = ran[0]
    return "not reproduced", _describe(first) + ": " + STAND_INS[first["kind"]]


def confirm_defects(report: dict[str, Any], options: Any) -> None:
    """Give every defect of ``report`` on a geometry vLLM builds its ``live`` status, and
    the report a ``live`` section (the vLLM release it ran, the overlay laid over it, or
    why it could not)."""
    del options  # the live stage has its own limit (LIVE_CPU_SECONDS)
    from kvcontract.live import env

    defects = [d for d in report.get("defects", []) if not d["latent"]]
    check = env.check(import_modules=False)
    installed = check.vllm_version
    section: dict[str, Any] = {"vllm": installed,
                               "target_release": report.get("vllm_version")}
    report["live"] = section

    def unreplayable(why: str) -> None:
        for defect in defects:
            defect["live"] = {"status": "not replayable", "why": why}
        section["why"] = why

    if not check.ok:
        unreplayable("vLLM cannot run here: " + "; ".join(check.lines()[2:]))
        return
    where = live_target(str(report.get("target", "")), installed)
    section["target_release"] = where.release
    if where.why is not None:
        unreplayable(where.why)
        return
    if not where.overlay.empty or where.overlay.notes:
        section["overlay"] = where.overlay.to_json()
    replays: list[Replay] = []
    for defect in defects:
        found, why = replays_of(defect)
        if not found:
            defect["live"] = {"status": "not replayable", "why": str(why)}
            continue
        if why is not None:
            defect["live_note"] = why
        replays += found
    if not replays:
        return
    from kvcontract.tools.audit.sandbox import run_jobs

    outcome = run_jobs([("live", lambda: _replay(replays, where.overlay))], workers=1,
                       job_timeout=LIVE_CPU_SECONDS, call_timeout=None)["live"]
    if not outcome.ok or outcome.value is None:
        why = "the live run failed: " + (outcome.error or "no result").splitlines()[0]
        for defect in defects:
            defect.setdefault("live", {"status": "not replayable", "why": why})
        section["why"] = why
        return
    if outcome.value["overlay"]:
        section["laid_over"] = outcome.value["overlay"]
    results = outcome.value["results"]
    for defect in defects:
        replayed = results.get(str(defect["id"]))
        if replayed is None:
            continue
        status, text = status_of(str(defect["impact"]), replayed)
        live = {"status": status, "text": text, "vllm": installed, "replays": replayed}
        note = defect.pop("live_note", None)
        if note:
            live["note"] = note
        if not where.overlay.empty:
            live["patched"] = True
        defect["live"] = live


__all__ = ["STATUSES", "LiveTarget", "Replay", "confirm_defects", "live_store_run",
           "live_target", "replays_of", "status_of", "store_theorem"]
