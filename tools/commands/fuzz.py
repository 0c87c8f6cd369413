"""``kvcontract fuzz``: differential fuzzing of the mocked and tensor-backed managers.

``--live`` adds the installed vLLM as a third backend (kvcontract's model of vLLM
against vLLM's own scheduler on every program): exit 3 with the install recipe when the
live backend cannot run here; its model gaps are printed after the contract findings
(one summary line, then each gap) and carried in the JSON report's ``live`` object;
they never change the exit code unless ``--fail-on-model-gap`` (then an unexplained
gap is exit 1)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import click
from rich.markup import escape
from rich.table import Table

from kvcontract.errors import UsageError
from kvcontract.options import (
    fuzz_options,
    parse_fail_on,
    resolve_geometries,
)
from kvcontract.tools.commands._common import (
    IMPL_FORMS,
    check_report_outputs,
    emit_reports,
    fail_on_option,
    geometry_options,
    impl_option,
    json_option,
    print_scope,
    quiet_option,
    report_options,
    shard_option,
)
from kvcontract.tools.reports.console import make_console
from kvcontract.vocabulary import EXIT_UNKNOWN


@click.command()
@impl_option(f"implementation to fuzz: a registered name (kvcontract list) or {IMPL_FORMS}")
@click.option("--matrix", is_flag=True, help="run the full combination matrix")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True)
@click.option("--examples", type=int, default=200, show_default=True,
              help="Hypothesis state-machine examples")
@click.option("--seed", type=int, default=0, show_default=True)
@json_option()
@quiet_option("no progress and no table, only the differences and the summary line")
@click.option("--live", "live", is_flag=True,
              help="also run every program on the installed vLLM (kvcontract.live) against "
                   "kvcontract's model of it (--impl, normally upstream-current): "
                   "differences are model gaps, findings about kvcontract's model")
@click.option("--fail-on-model-gap", "fail_on_model_gap", is_flag=True,
              help="with --live: exit 1 when a model gap is unexplained (no documented "
                   "class of disagreement fits it)")
@shard_option("run only shard I of N (1-based) of the scenarios (seed scenarios, the "
              "--matrix, the state machine as one unit), split by a static cost")
@geometry_options
@fail_on_option
@report_options
def fuzz(impl_name: str, matrix: bool, device: str, examples: int, seed: int,
         json_path: str | None, quiet: bool, live: bool, fail_on_model_gap: bool,
         shard_text: str | None, models: tuple[str, ...],
         geometry_files: tuple[str, ...],
         bpcs: tuple[int, ...], retentions: tuple[str, ...], fail_on: str,
         formats: tuple[str, ...], outputs: tuple[str, ...]) -> None:
    """Differential fuzzing: mocked vs tensor-backed managers, against the spec.

    With --model or --geometry, the seed scenarios' shapes (resend, continuation, stale
    pending, unaligned hit, prefill horizon) run on those geometries instead of the
    built-in ones, at one token past the first multiple of A beyond every window (and
    4k-16k tokens where chunks are large); prompts are capped at 16,384 tokens, so a
    longer window is exercised up to there only. The state machine draws from those
    geometries too, with shared prefixes as long as that prompt (--examples sets how
    many programs; on long prompts each takes longer). Not with --matrix.

    Progress goes to stderr: a bar on a terminal, else one line per finished scenario."""
    from kvcontract.api import register_implementation
    from kvcontract.proofs.shards import parse_shard
    from kvcontract.tools.commands._progress import progress
    from kvcontract.tools.fuzz import run_fuzz
    from kvcontract.tools.reports import pair_outputs

    # Every input is validated before any scenario runs (issue #11).
    shard = parse_shard(shard_text)
    impl_name = register_implementation(impl_name)  # a name or module:FILE.py
    pairs = pair_outputs(formats, outputs)
    check_report_outputs(pairs, json_path)
    options = fuzz_options(impl_name, examples=examples, seed=seed, matrix=matrix,
                           device=device, fail_on=parse_fail_on(fail_on),
                           scope=tuple(resolve_geometries(models, geometry_files, bpcs,
                                                          retentions)))
    scope = list(options.scope)
    if fail_on_model_gap and not live:
        raise UsageError("--fail-on-model-gap judges the live comparison: add --live")
    if live and shard is not None:
        raise UsageError("--live runs unsharded (kvcontract merge does not join live "
                         "comparisons): drop --shard or --live")
    console = make_console(stderr=any(path is None for _, path in pairs))
    if live:
        from kvcontract.live.env import check

        found = check(import_modules=True)
        if not found.ok:
            for line in found.lines():
                console.print(escape(line))
            sys.exit(EXIT_UNKNOWN)
    if scope and not quiet:
        print_scope(console, scope, notes=False)
    plan = _shard_plan(shard, matrix=matrix, seed=seed, examples=examples,
                       scope=scope) if shard is not None else None
    with progress("fuzzing", impl_name, quiet=quiet) as advance:
        report = run_fuzz(impl_name, device=options.device, examples=options.examples
                          if plan is None else plan.examples, matrix=options.matrix,
                          seed=options.seed, fail_on=options.fail_on,
                          geometries=scope, on_progress=advance,
                          scenarios=None if plan is None else plan.scenarios,
                          live=live, fail_on_model_gap=fail_on_model_gap)
    data = report.to_json()
    if plan is not None:
        data["shard"] = plan.section(data["differences"])
    title = f"kvcontract fuzz --impl {impl_name}"
    if scope:
        title += " on " + ", ".join(label for label, _ in scope)
    table = Table(title=title)
    table.add_column("clause", no_wrap=True)
    table.add_column("checks", justify="right", no_wrap=True)
    for clause, count in sorted(data["per_clause"].items(), key=lambda kv: int(kv[0][1:])):
        table.add_row(clause, str(count))
    if not quiet:
        console.print(table)
    for diff in data["differences"]:
        console.print(f"[bold red]{diff['clause']}[/] {diff['kind']} "
                      f"{escape('[' + diff['impact'] + ']')}: {escape(diff['message'])}")
        for line in diff.get("program", [])[:20]:
            console.print(f"    {escape(str(line))}", highlight=False)
    console.print(
        f"{impl_name}: {data['cases']} cases, {data['steps']} steps, "
        f"{len(data['differences'])} differences"
        + (f"; shard {shard}" if shard is not None else "")
    )
    if report.live is not None:
        console.print(escape(report.live.summary()), highlight=False)
        for gap in report.live.gaps:
            console.print(f"  {escape(gap.line())}", highlight=False)
        tails = report.live.partial_tails
        violations: list[dict[str, Any]] = (
            [] if tails is None or isinstance(tails, str) else tails.violations)
        for violation in violations:
            for failed in violation["failed"]:
                console.print(escape(
                    f"  partial tail ({failed['clause'] or 'model gap'}) "
                    f"{violation['case']}: {failed['check']}: expected "
                    f"{failed['expected']}, observed {failed['observed']}"), highlight=False)
    if json_path:
        pairs.append(("json", json_path))
    emit_reports(data, pairs)
    sys.exit(report.exit_code)


STATE_MACHINE_STEP_COST = 40.0
"""Static cost of one Hypothesis program of the state machine (up to 25 steps, each a
few operations) in the units of :func:`scenario_cost`."""


def scenario_cost(scenario: Any) -> float:
    """A static cost of one scenario for ``--shard`` balance: its operations, plus its
    token lists (a long prompt makes every store and lookup step longer). Never a
    timing: every machine must compute the same partition."""
    cost = 0.0
    for op in scenario.program:
        cost += 1.0
        for arg in op[1:]:
            if isinstance(arg, (list, tuple)):
                cost += len(arg) / 64
    return cost


@dataclass
class ShardPlan:
    """One shard's part of a fuzz run: its scenarios (positions of the unsharded list)
    and whether it runs the state machine (the last unit, position ``total - 1``)."""

    shard: Any
    scenarios: list[Any]
    positions: list[int]
    names: dict[str, int]
    examples: int
    total: int
    selection: str
    seed: int
    all_examples: int

    def section(self, differences: list[dict[str, Any]]) -> dict[str, Any]:
        """The report's ``shard`` object, with each difference's position in the
        unsharded order (its scenario's; the state machine's after all scenarios)."""
        from kvcontract.proofs.shards import shard_section

        at = [self.names.get(str((d.get("witness") or {}).get("scenario")), self.total)
              for d in differences]
        section: dict[str, Any] = shard_section(
            self.shard, self.positions, self.total, self.selection,
            difference_positions=at, examples=self.all_examples, seed=self.seed)
        return section


def _shard_plan(shard: Any, *, matrix: bool, seed: int, examples: int,
                scope: Sequence[tuple[str, Any]]) -> ShardPlan:
    """The scenario list the unsharded run would build (``run_fuzz``'s), partitioned."""
    from kvcontract.proofs.shards import partition, selection_digest
    from kvcontract.tools.fuzz import matrix_scenarios, scoped_seed_scenarios, seed_scenarios

    if scope:
        every = list(scoped_seed_scenarios(scope, seed))
    else:
        every = list(seed_scenarios(seed))
        if matrix:
            every.extend(matrix_scenarios(seed))
    costs = [scenario_cost(s) for s in every]
    if examples > 0:
        costs.append(STATE_MACHINE_STEP_COST * examples)
    mine = partition(costs, shard.count)[shard.index - 1]
    runs_machine = examples > 0 and len(every) in mine
    chosen = [p for p in mine if p < len(every)]
    names = {every[p].name: p for p in chosen}
    return ShardPlan(
        shard=shard, scenarios=[every[p] for p in chosen], positions=list(mine),
        names=names, examples=examples if runs_machine else 0, total=len(costs),
        selection=selection_digest([s.name for s in every],
                                   [matrix, seed, examples, [[label, g.to_dict()]
                                                             for label, g in scope]]),
        seed=seed, all_examples=examples)
