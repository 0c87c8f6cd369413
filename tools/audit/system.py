"""Stateful scenarios on the bound code: the executable offloading system of issue 3.

The seed scenarios of ``kvcontract fuzz`` (the four historic defects as request
programs, plus the window-bound case) drive the tensor-backed system and its mocked twin
in lockstep, with the bound upstream functions as the system's implementation. The
system checks every decision against the spec as it goes (lookups, loads, stores, and
the bytes of every loaded position: C11). Each scenario becomes report rows: one per
clause it violated, or one ``C11`` row when it ran clean (evidence ``examples``: one
program, its step and check counts).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from kvcontract.errors import KvContractError
from kvcontract.tools.audit.binding import Binding, UpstreamTimeout
from kvcontract.vocabulary import Verdict

if TYPE_CHECKING:
    from kvcontract.tools.fuzz import Scenario

SYSTEM_PREFIX = "system["


def run_system_scenarios(binding: Binding, seed: int = 0,
                         scenarios: Sequence[Scenario] | None = None) -> list[dict[str, Any]]:
    """Report rows for every seed scenario, or for ``scenarios`` (those of given
    geometries: :func:`kvcontract.tools.fuzz.scoped_seed_scenarios`); runs in a sandbox
    child."""
    from kvcontract.tools.fuzz import run_scenario, seed_scenarios

    impl = binding.implementation
    assert impl is not None
    rows: list[dict[str, Any]] = []
    for scenario in seed_scenarios(seed) if scenarios is None else scenarios:
        name = f"{SYSTEM_PREFIX}{scenario.name}]"
        started = time.perf_counter()
        try:
            lockstep = run_scenario(impl, scenario, "cpu")
        except KvContractError as exc:
            rows.append(_row("C11", name, Verdict.UNKNOWN, started,
                             message=f"could not run: {exc}"))
            continue
        except UpstreamTimeout as exc:  # a wall-clock limit: says nothing about the code
            rows.append(_row("C11", name, Verdict.UNKNOWN, started,
                             message=f"{exc}: a wall-clock limit (machine load or a hang); "
                                     "rerun with a larger --timeout"))
            continue
        except Exception as exc:  # a crash inside the bound code is a finding
            rows.append(_row("C11", name, Verdict.COUNTEREXAMPLE, started,
                             message=f"the system crashed: {type(exc).__name__}: {exc}",
                             impact="crash",
                             witness={"kind": "system", "scenario": scenario.name}))
            continue
        checks = sum(lockstep.checks().values())
        domain = (f"scenario {scenario.name}: {lockstep.steps} steps, {checks} checks, mocked "
                  "and tensor-backed managers in lockstep (one program, not exhaustive)")
        seen: dict[str, Any] = {}
        for finding in lockstep.findings:
            seen.setdefault(finding.clause, finding)
        if not seen:
            rows.append(_row("C11", name, Verdict.TESTED, started, domain=domain,
                             evidence="examples", examples=checks))
            continue
        for clause, finding in sorted(seen.items(), key=lambda kv: int(kv[0][1:])):
            rows.append(_row(
                clause, name, Verdict.COUNTEREXAMPLE, started, domain=domain,
                message=f"{finding.kind}: {finding.message}", impact=finding.impact.value,
                witness={"kind": "system", "scenario": scenario.name,
                         "program": list(finding.program)[-12:],
                         **{k: v for k, v in finding.witness.items()
                            if isinstance(v, (int, str, bool, list))}}))
    return rows


def _row(clause: str, name: str, verdict: Verdict, started: float, *, domain: str = "",
         message: str = "", witness: dict[str, Any] | None = None, evidence: str | None = None,
         examples: int = 0, impact: str | None = None) -> dict[str, Any]:
    return {
        "clause": clause, "theorem": name, "verdict": verdict.value, "domain": domain,
        "impact": impact,
        "seconds": round(time.perf_counter() - started, 4), "witness": witness,
        "message": message, "description": "a seed scenario of the executable system",
        "evidence": evidence, "examples": examples,
        "via": "the executable offloading system (mocked and tensor-backed) over the bound "
               "functions",
    }
