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

import ctypes
import gc
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from kvcontract.errors import KvContractError
from kvcontract.tools.audit.binding import Binding, UpstreamTimeout
from kvcontract.vocabulary import Verdict

if TYPE_CHECKING:
    from kvcontract.impl.bundle import Implementation
    from kvcontract.tools.fuzz import Scenario

SYSTEM_PREFIX = "system["


def run_system_scenarios(binding: Binding, seed: int = 0,
                         scenarios: Sequence[Scenario] | None = None) -> list[dict[str, Any]]:
    """Report rows for every seed scenario, or for ``scenarios`` (those of given
    geometries: :func:`kvcontract.tools.fuzz.scoped_seed_scenarios`); runs in a sandbox
    child."""
    return [row for rows in scenario_rows(binding, seed, scenarios) for row in rows]


def scenario_rows(binding: Binding, seed: int = 0,
                  scenarios: Sequence[Scenario] | None = None) -> list[list[dict[str, Any]]]:
    """:func:`run_system_scenarios`, the rows of each scenario apart (one or more per
    scenario: the audit's ``--shard`` places each by its scenario's position)."""
    from kvcontract.tools.fuzz import run_scenario, seed_scenarios

    impl = binding.implementation
    assert impl is not None
    rows: list[list[dict[str, Any]]] = []
    # What the child inherited (the binding, the catalogue, Z3) is never garbage here:
    # frozen, the collections below walk only what the scenarios allocate, and touch no
    # inherited page (a full collection in a forked child copies every page it walks).
    gc.freeze()
    try:
        for scenario in seed_scenarios(seed) if scenarios is None else scenarios:
            rows.append(_scenario_rows(impl, scenario, run_scenario, binding))
            # The scenario's system (block pools of up to gigabytes on a 16k-token prompt
            # at 16 blocks per chunk) is garbage now: collect it before the next one
            # allocates its own, and hand the freed heap back, so the child's peak is one
            # scenario's, not two.
            gc.collect()
            _trim_heap()
    finally:
        gc.unfreeze()
    return rows


def _trim_heap() -> None:
    """Return freed heap pages to the system (glibc ``malloc_trim``; elsewhere a no-op)."""
    global _MALLOC_TRIM
    if _MALLOC_TRIM is None:
        try:
            _MALLOC_TRIM = ctypes.CDLL("libc.so.6").malloc_trim
        except (OSError, AttributeError):
            _MALLOC_TRIM = False
    if _MALLOC_TRIM:
        _MALLOC_TRIM(0)


_MALLOC_TRIM: Any = None


def _scenario_rows(impl: Implementation, scenario: Scenario,
                   run_scenario: Callable[[Implementation, Scenario, str], Any],
                   binding: Binding | None = None) -> list[dict[str, Any]]:
    """The rows of one scenario (its lockstep systems are dropped on return); with the
    ``binding``, each violated clause's root cause (:func:`scenario_root_cause`)."""
    rows: list[dict[str, Any]] = []
    name = f"{SYSTEM_PREFIX}{scenario.name}]"
    started = time.perf_counter()
    try:
        lockstep = run_scenario(impl, scenario, "cpu")
    except KvContractError as exc:
        rows.append(_row("C11", name, Verdict.UNKNOWN, started,
                         message=f"could not run: {exc}"))
        return rows
    except UpstreamTimeout as exc:  # a wall-clock limit: says nothing about the code
        rows.append(_row("C11", name, Verdict.UNKNOWN, started,
                         message=f"{exc}: a wall-clock limit (machine load or a hang); "
                                 "rerun with a larger --timeout"))
        return rows
    except Exception as exc:  # a crash inside the bound code is a finding
        rows.append(_row("C11", name, Verdict.COUNTEREXAMPLE, started,
                         message=f"the system crashed: {type(exc).__name__}: {exc}",
                         impact="crash",
                         witness={"kind": "system", "scenario": scenario.name}))
        return rows
    checks = sum(lockstep.checks().values())
    domain = (f"scenario {scenario.name}: {lockstep.steps} steps, {checks} checks, mocked "
              "and tensor-backed managers in lockstep (one program, not exhaustive)")
    seen: dict[str, Any] = {}
    for finding in lockstep.findings:
        seen.setdefault(finding.clause, finding)
    if not seen:
        rows.append(_row("C11", name, Verdict.TESTED, started, domain=domain,
                         evidence="examples", examples=checks))
        return rows
    for clause, finding in sorted(seen.items(), key=lambda kv: int(kv[0][1:])):
        cause = (scenario_root_cause(binding, scenario, clause, run_scenario)
                 if binding is not None else None)
        rows.append(_row(
            clause, name, Verdict.COUNTEREXAMPLE, started, domain=domain,
            message=f"{finding.kind}: {finding.message}", impact=finding.impact.value,
            witness={"kind": "system", "scenario": scenario.name,
                     "program": list(finding.program)[-12:],
                     **{k: v for k, v in finding.witness.items()
                        if isinstance(v, (int, str, bool, list))}}))
        if cause is not None:
            rows[-1]["root_cause"] = cause
    return rows


def _clause_fields(clause: str) -> tuple[str, ...]:
    """The bundle fields a scenario's violation of ``clause`` can come from: the lookup's
    for C1-C6 (C1 judges the retention after a hit), the store path's for C7-C10, both
    for C11 and C12."""
    from kvcontract.proofs.uses import LOOKUP_FUNCTIONS, STORE_FUNCTIONS

    number = int(clause[1:])
    lookup = (*LOOKUP_FUNCTIONS, "get_num_skipped_tokens", "retained_block_range")
    if number <= 6:
        return lookup
    if number <= 10:
        return STORE_FUNCTIONS
    return (*lookup, *STORE_FUNCTIONS)


def _roles(binding: Binding, names: Sequence[str],
           field_role: Callable[[Binding, str], str | None]) -> list[str]:
    roles: list[str] = []
    for name in names:
        role = field_role(binding, name)
        if role and role not in roles:
            roles.append(role)
    return roles


def scenario_root_cause(binding: Binding, scenario: Scenario, clause: str,
                        run_scenario: Callable[[Implementation, Scenario, str], Any],
                        ) -> dict[str, Any] | None:
    """The smallest replacement of the bound code by the reference under which the
    scenario no longer violates ``clause`` (:mod:`kvcontract.tools.audit.root_cause`):
    an upstream function replaced in its own signature first, then one adapted field.
    One rerun of the scenario per candidate (at most 2 + 45), in a fixed order; None if
    none removes it
    (the row then has no root cause and its defect is reported unattributed)."""
    import dataclasses
    import itertools

    from kvcontract.impl.variants import REFERENCE
    from kvcontract.tools.audit import root_cause
    from kvcontract.tools.audit.binding import FIELD_ROLES

    def still_fails(candidate: Implementation) -> bool:
        try:
            lockstep = run_scenario(candidate, scenario, "cpu")
        except Exception:
            return True
        return any(f.clause == clause for f in lockstep.findings)

    if binding.target.kind != "builtin":
        for role in root_cause.REFERENCE_ROLES:
            if role in binding.functions:
                rebound = root_cause.rebind(binding, [role]).implementation
                if rebound is not None and not still_fails(rebound):
                    return root_cause.describe(binding, [role], "rebound")
    impl = binding.implementation
    assert impl is not None
    # One field of the clause's side, then a pair (an unaligned boundary needs both the
    # load window and the scanner's initial window), in a fixed order: a counted budget.
    side = [f for f in FIELD_ROLES if f in _clause_fields(clause)
            and f not in binding.missing_fields]
    for size in (1, 2):
        for names in itertools.combinations(side, size):
            patched = dataclasses.replace(impl, **{n: getattr(REFERENCE, n) for n in names})
            if not still_fails(patched):
                return root_cause.describe(
                    binding, _roles(binding, names, root_cause.field_role), "field",
                    list(names))
    return None


SHARDS_PER_WORKER = 3
"""Shards of the scoped scenarios per worker (:func:`shards`)."""


def program_weight(scenario: Scenario) -> int:
    """About what a scenario costs: the tokens its requests send, plus one per operation."""
    return sum(len(op[2]) if op[0] == "add_request" and len(op) > 2
               and isinstance(op[2], list) else 1 for op in scenario.program)


def shards(scenarios: Sequence[Scenario], workers: int) -> list[list[Scenario]]:
    """``scenarios`` cut into consecutive runs of about equal :func:`program_weight`
    (in order, so the rows keep theirs), :data:`SHARDS_PER_WORKER` per worker: each is a
    sandbox job of its own, so the scenarios of many geometries spread over the workers
    next to the theorem families instead of holding one worker for the whole audit.
    Which scenarios run, and how, does not change."""
    weights = [program_weight(s) for s in scenarios]
    count = max(1, min(len(scenarios), SHARDS_PER_WORKER * max(1, workers)))
    target = sum(weights) / count
    found: list[list[Scenario]] = [[]]
    filled = 0
    for scenario, weight in zip(scenarios, weights, strict=True):
        if found[-1] and filled >= target * len(found) and len(found) < count:
            found.append([])
        found[-1].append(scenario)
        filled += weight
    return found


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
