"""The store side executed, not modelled (issue 20): the bound ``store_replay_boundaries``
is what upstream's ``_build_store_jobs`` passes to its mask as it runs
(``tools/audit/store.executed_replay_boundaries``), and the executable system's seed
scenarios run on releases with upstream's store path plugged in
(``tools/audit/system.upstream_store_path``) instead of kvcontract's StoreTracker."""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

import pytest
from audit_releases import release_tree

from kvcontract.impl.variants import get_implementation
from kvcontract.spec.geometry import Geometry, fa, swa
from kvcontract.tools.audit import derived_spaces, store, system
from kvcontract.tools.audit.audited_files import SCHEDULER
from kvcontract.tools.audit.binding import bind
from kvcontract.tools.audit.engine import AuditOptions, run_audit
from kvcontract.tools.audit.roles import Binding
from kvcontract.tools.audit.targets import resolve_target
from kvcontract.tools.fuzz import run_scenario, seed_scenarios
from kvcontract.vocabulary import Verdict

_BOUND: dict[str, Binding] = {}

GRID = list(itertools.product(range(0, 70), (None, 4, 16, 48), (None, 0, 96), (False, True)))
"""``(prompt_len, alignment_tokens, retention_interval, use_eagle)`` cases."""


def _bound(version: str) -> Binding:
    if version not in _BOUND:
        _BOUND[version] = bind(resolve_target(f"vllm:{release_tree(version)}"))
    return _BOUND[version]


def test_replay_boundaries_are_observed_on_033() -> None:
    """0.33.0's builder passes ``(num_prompt_tokens - 1,)`` under a retention interval
    and nothing without one (its text says so; the ``upstream-current`` variant restates
    it, kvcontract's own code): the executed field agrees on the whole grid, and it is
    the executed one, not a restatement."""
    binding = _bound("0.33.0")
    assert binding.implementation is not None
    executed = binding.implementation.store_replay_boundaries
    assert executed.__qualname__.startswith("executed_replay_boundaries")
    restated = get_implementation("upstream-current").store_replay_boundaries
    assert [executed(*case) for case in GRID] == [restated(*case) for case in GRID]
    assert executed(33, 16, 0, True) == (32,) and executed(33, 16, None, True) == ()
    assert "store_replay_boundaries" not in binding.missing_fields


def test_replay_boundaries_follow_the_builder_as_it_runs(tmp_path: Path) -> None:
    """A patch whose builder passes ``P - 2`` (0.33.0's own ``_build_store_jobs``,
    edited at test time) binds ``P - 2``: the field is read off the run, so no text
    pattern could make it ``P - 1``."""
    tree = release_tree("0.33.0")
    source = (tree / "vllm" / SCHEDULER).read_text()
    node = next(n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ClassDef)
                and n.name == "OffloadingConnectorScheduler")
    method = next(n for n in node.body if isinstance(n, ast.FunctionDef)
                  and n.name == "_build_store_jobs")
    lines = source.splitlines()[method.lineno - 1:method.end_lineno]
    text = "\n".join(lines)
    assert text.count("req.num_prompt_tokens - 1,") == 1
    patch = tmp_path / "replay_p2.py"
    patch.write_text("class OffloadingConnectorScheduler:\n"
                     + text.replace("req.num_prompt_tokens - 1,", "req.num_prompt_tokens - 2,")
                     + "\n")
    binding = bind(resolve_target(f"module:{patch}", base=f"vllm:{tree}"))
    assert binding.roles["store_jobs"].source == "patch"
    assert binding.implementation is not None
    field = binding.implementation.store_replay_boundaries
    assert field(33, 16, 0, False) == (31,) and field(33, 16, None, False) == ()


@pytest.mark.parametrize("version", [
    "0.29.0", pytest.param("0.28.0", marks=pytest.mark.slow)])
def test_old_builders_pass_no_replay_boundaries(version: str) -> None:
    """0.28/0.29's builder filters chunks with ``is_store_reachable_swa_chunk``, which
    takes no boundaries (and those releases have no retention interval): executed, the
    field is ``()`` everywhere. The former model answered ``(P - 1,)`` under a retention
    interval; their bound mask (the chunk predicate) ignores replay blocks, so no
    verdict read it."""
    binding = _bound(version)
    assert binding.implementation is not None
    field = binding.implementation.store_replay_boundaries
    assert {field(*case) for case in GRID} == {()}


def test_no_store_path_leaves_the_replay_boundaries_missing(tmp_path: Path) -> None:
    """Where upstream's builder cannot run, the field is not modelled: it is missing,
    naming what the builder needs, and the system says why it cannot run."""
    patch = tmp_path / "window_only.py"
    patch.write_text("def get_sliding_window_size_in_chunks(kv_cache_spec, tokens_per_chunk):\n"
                     "    return cdiv(kv_cache_spec.sliding_window, tokens_per_chunk)\n")
    binding = bind(resolve_target(f"module:{patch}", base="none"))
    reason = binding.missing_fields["store_replay_boundaries"]
    assert "cannot run" in reason and "_build_store_jobs" in reason
    why = system.cannot_run(binding)
    assert why is not None and "_build_store_jobs" in why


def test_seed_scenarios_run_on_033_with_upstream_s_store_path() -> None:
    """``audit --clause C11`` on 0.33.0 reports the seed scenarios again, each row saying
    its store path is upstream's builder, executed: the window bound's lost hit (the
    window formula, the defect the upstream-lookup theorems report) and clean runs of
    the historic defects' programs; the Mamba scenario is left out, named."""
    binding = _bound("0.33.0")
    assert system.cannot_run(binding) is None
    run = run_audit(binding, AuditOptions(clauses=["C11"], jobs=1))
    rows = {(r["clause"], r["theorem"]): r for r in run.rows}
    lost = rows[("C4", "system[window-sw9-tpc4]")]
    assert lost["verdict"] == Verdict.COUNTEREXAMPLE.value and lost["impact"] == "lost-hit"
    assert lost["root_cause"]["how"] == "rebound"
    assert [f["qualname"] for f in lost["root_cause"]["functions"]] == [
        "get_sliding_window_size_in_chunks"]
    clean = {t for (c, t), r in rows.items() if r["verdict"] == Verdict.TESTED.value}
    # The stalled store's seed is clean here: on upstream code the system stage judges
    # C11 and the store and lookup clauses, not the lifecycle (C13 is judged live).
    assert clean == {"system[seed000-stale-pending]", "system[seed001-unaligned-hit]",
                     "system[seed003-mtp]", "system[seed004-prefill-horizon]",
                     "system[c13-stalled-store]"}
    assert all(system.UPSTREAM_VIA in r["via"] for r in run.rows)
    unchecked = {u["theorem"]: u["reason"] for u in run.unchecked}
    # 0.33.0 has no lookahead block hashes: that scenario is left out too, named.
    assert unchecked == {"system[mamba-retention]": store.MAMBA_NOTE,
                         "system[lookahead-eagle]": derived_spaces.LOOKAHEAD_NOTE,
                         "system[c12-shared-prefix-junction]": store.JUNCTION_NOTE}


def test_plugged_store_path_offers_what_the_builder_offers() -> None:
    """The system's store events on upstream's path are the builder's offers, every
    group of a step from one builder call, with each group's stored index as the event
    saw it before its own step (the monitor's C8/C9 spec step reads it)."""
    binding = _bound("0.33.0")
    scenario = seed_scenarios()[0]
    plugged = system.upstream_store_path(binding)
    assert binding.implementation is not None
    lockstep = run_scenario(binding.implementation, scenario, "cpu", plugged)
    assert lockstep.findings == []
    assert sum(lockstep.checks().values()) > 0
    # One builder run per step: a request's path, stepped group by group.
    geometry = Geometry((fa(4), swa(4, 8)))
    paths = plugged(geometry, 17, True)
    assert [p.step("prefilling", 0, 17, 17) for p in paths] == [[0, 1, 2, 3], [0, 1, 2, 3]]
    assert [p.next_stored_chunk_idx for p in paths] == [4, 4]
    with pytest.raises(Exception, match="share their arguments"):
        paths[0].step("decoding", 17, 1, 18)
        paths[1].step("decoding", 18, 1, 19)


def test_builtin_targets_keep_kvcontract_s_store_path() -> None:
    """A built-in implementation is kvcontract's own code: its StoreTracker stays."""
    binding = bind(resolve_target("builtin:reference"))
    assert system.runner(binding) is run_scenario
    assert system.cannot_run(binding) is None
    assert all(system.left_out(binding, s) is None for s in seed_scenarios())
