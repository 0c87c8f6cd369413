"""``audit --live``: each defect's lost hits replayed on the installed vLLM itself.

The audit's findings come from upstream's functions run among kvcontract's stand-ins;
this stage asks vLLM's own scheduler and ``OffloadingConnector`` (through
:mod:`kvcontract.live`) whether the lost hit a defect reports happens there. For every
defect on a geometry vLLM builds whose impact is ``lost-hit``, the producer/consumer
cases that show it are replayed live:

* its headline witness, when that is a producer/consumer case (C12's);
* the first resend its preset cost found losing (the worst geometry of the cost).

Each defect gets ``live``: ``confirmed`` (vLLM accepted less than the spec's promise,
in whole scheduler blocks, on at least one case: the observed numbers are kept),
``not reproduced`` (vLLM served the promise on every case: the audit's stand-ins
disagree with vLLM, and the finding must not be presented as a defect until that is
explained), or ``not replayable`` (why: vLLM is not installed or is another release
than the target, vLLM will not build the geometry, the defect is not a lost hit).

vLLM runs in a sandbox child (its import and engines take about 12 s and 600 MiB),
with the audit's CPU-time limits. Nothing here changes a verdict or an exit code.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvcontract.vocabulary import Impact

LIVE_CPU_SECONDS = 1800.0
"""CPU seconds the child that drives vLLM may use (a safety net: a case takes well under
a second once vLLM is imported)."""

STATUSES = ("confirmed", "not reproduced", "not replayable")


def _cases(defect: Mapping[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """``(label, EndToEndCase JSON)`` of the cases that show a defect's lost hit."""
    from kvcontract.spec.geometry import Geometry
    from kvcontract.spec.properties.end_to_end import resend_case

    found: list[tuple[str, dict[str, Any]]] = []
    witness = (defect.get("witness") or {}).get("witness") or {}
    if isinstance(witness.get("producer"), Mapping) and isinstance(witness.get("consumer"),
                                                                   Mapping):
        case = {k: witness[k] for k in ("producer", "consumer")}
        found.append((f"witness {defect['witness']['theorem']}", case))
    rows = (defect.get("cost") or {}).get("rows") or []
    example = next((r["example"] for r in rows if r.get("example")), None)
    if example:
        geometry = Geometry.from_dict(example["geometry"])
        row = next(r for r in rows if r.get("example") is example)
        case_json = resend_case(str(row["geometry"]), geometry, int(example["prompt"])).to_json()
        found.append((f"{row['geometry']} resend of P={example['prompt']}", case_json))
    return found


def _replay(cases: list[tuple[str, str, dict[str, Any]]]) -> dict[str, Any]:
    """Run in the child: every case on vLLM, by defect id."""
    from kvcontract.live.confirm import confirm_case
    from kvcontract.spec.properties.end_to_end import EndToEndCase

    results: dict[str, list[dict[str, Any]]] = {}
    for defect_id, label, case_json in cases:
        case = EndToEndCase.from_json(case_json)
        confirmation = confirm_case(case, keep_observation=False)
        results.setdefault(defect_id, []).append({
            "case": label, "verdict": confirmation.verdict,
            "observed_hit": confirmation.observed_hit,
            "promised_hit": confirmation.promised_hit,
            "gpu_promise": confirmation.gpu_promise,
            "raised": confirmation.raised, "refused": confirmation.refused,
        })
    return {"results": results}


def _status(replays: list[dict[str, Any]]) -> tuple[str, str]:
    lost = [r for r in replays if r["verdict"] == "lost-hit"]
    if lost:
        first = lost[0]
        return "confirmed", (f"vLLM accepted {first['observed_hit']}, the spec promises "
                             f"{first['gpu_promise']} ({first['case']})")
    ran = [r for r in replays if r["verdict"] != "refused"]
    if not ran:
        why = replays[0]["refused"] if replays else "no case to replay"
        return "not replayable", f"vLLM would not build the case: {why}"
    first = ran[0]
    return "not reproduced", (f"vLLM gave {first['verdict']} ({first['observed_hit']} "
                              f"tokens, promise {first['gpu_promise']}) on {first['case']}")


def confirm_defects(report: dict[str, Any], options: Any) -> None:
    """Give every defect of ``report`` on a geometry vLLM builds its ``live`` status, and
    the report a ``live`` section (the vLLM release it ran, or why it could not)."""
    from kvcontract.live import env

    defects = [d for d in report.get("defects", []) if not d["latent"]]
    check = env.check(import_modules=False)
    installed = check.vllm_version
    target = report.get("vllm_version")
    section: dict[str, Any] = {"vllm": installed, "target_release": target}
    report["live"] = section

    def unreplayable(why: str) -> None:
        for defect in defects:
            defect["live"] = {"status": "not replayable", "why": why}
        section["why"] = why

    if not check.ok:
        unreplayable("vLLM cannot run here: " + "; ".join(check.lines()[2:]))
        return
    if target is not None and target != installed:
        unreplayable(f"the installed vLLM is {installed}, the target is {target}: "
                     "install the target's release to confirm it")
        return
    cases: list[tuple[str, str, dict[str, Any]]] = []
    for defect in defects:
        if defect["impact"] != Impact.LOST_HIT.value:
            defect["live"] = {"status": "not replayable",
                              "why": f"a {defect['impact']} defect: its live scenario is "
                                     "not built (lost hits are replayed)"}
            continue
        found = _cases(defect)
        if not found:
            defect["live"] = {"status": "not replayable",
                              "why": "no producer/consumer case shows it (a formula "
                                     "witness, and no preset cost)"}
            continue
        cases += [(str(defect["id"]), label, case) for label, case in found]
    if not cases:
        return
    from kvcontract.tools.audit.sandbox import run_jobs

    outcome = run_jobs([("live", lambda: _replay(cases))], workers=1,
                       job_timeout=LIVE_CPU_SECONDS, call_timeout=None)["live"]
    if not outcome.ok or outcome.value is None:
        why = "the live run failed: " + (outcome.error or "no result").splitlines()[0]
        for defect in defects:
            defect.setdefault("live", {"status": "not replayable", "why": why})
        section["why"] = why
        return
    results = outcome.value["results"]
    for defect in defects:
        replays = results.get(str(defect["id"]))
        if replays is None:
            continue
        status, text = _status(replays)
        defect["live"] = {"status": status, "text": text, "vllm": installed,
                          "replays": replays}


__all__ = ["STATUSES", "confirm_defects"]
