"""Binding the released shapes 0.28-0.33: what is found where, and the pinned numbers of
upstream's own tests replayed through the adapters (docs/CONTRACT.md section 10)."""

from __future__ import annotations

from pathlib import Path

import pytest
from audit_releases import release_params, release_tree

from kvcontract.spec.lookup import LookupResult
from kvcontract.tools.audit.audited_files import OFFLOAD_CONFIG
from kvcontract.tools.audit.binding import bind
from kvcontract.tools.audit.roles import Binding
from kvcontract.tools.audit.targets import resolve_target

H, P, M, R = (LookupResult.HIT, LookupResult.HIT_PENDING, LookupResult.MISS,
              LookupResult.RETRY)


def _bound(version: str) -> Binding:
    return bind(resolve_target(f"vllm:{release_tree(version)}"))


def _minor(version: str) -> int:
    return int(version.split(".")[1])


def _scan(binding: Binding, states: list[LookupResult], initial: int, window: int) -> int | None:
    impl = binding.implementation
    assert impl is not None
    found: int | None = impl.sliding_window_lookup(lambda k: states[k], 0, len(states), initial,
                                                   window)
    return found


@pytest.mark.parametrize("version", release_params())
def test_roles_found_for_release(version: str) -> None:
    binding = _bound(version)
    minor = _minor(version)
    status = {role: rb.status for role, rb in binding.roles.items()}
    for role in ("skipped", "window", "sw_scan", "prefix_scan", "block_mask",
                 "multi_group_lookup", "store_jobs"):
        assert status[role] == "found", (role, binding.roles[role])
        assert binding.roles[role].line and binding.roles[role].line > 0
    # Only the store horizon, which is never modelled from source text (issue 20).
    assert list(binding.missing_fields) == ["store_final_segment_end"]
    if minor < 30:
        assert status["load_window"] == "derived"
        assert status["store_predicate"] == "found"
        assert status["store_mask"] == "missing"
        assert "no initial window" in (binding.roles["sw_scan"].shape or "")
    else:
        assert status["load_window"] == "found"
        assert status["store_mask"] == "found"
        assert status["store_predicate"] == "missing"
    window_path = binding.roles["window"].path or ""
    assert window_path.endswith(OFFLOAD_CONFIG) == (minor >= 33)


@pytest.mark.parametrize("version", release_params())
def test_pinned_numbers(version: str) -> None:
    binding = _bound(version)
    impl = binding.implementation
    assert impl is not None
    minor = _minor(version)
    # Stale pending: W = 2, [HIT, HIT, MISS, HIT_PENDING] -> None before 0.30, 2 after.
    assert _scan(binding, [H, H, M, P], 2, 2) == (None if minor < 30 else 2)
    # Scanner table (W = 2, initial 3): MISS, RETRY, HIT_PENDING, HIT -> 2, None, None, 5.
    table = [_scan(binding, [H, H, mid, H, H], 3, 2) for mid in (M, R, P, H)]
    assert table == ([5, 5, 5, 5] if minor < 30 else [2, None, None, 5])
    # W with MTP: sw 32, e 3, tpc 16 -> 2 before 0.31 (e ignored), 3 from 0.31.
    assert impl.get_sliding_window_size_in_chunks(32, 3, 16) == (2 if minor < 31 else 3)
    # Unaligned boundary 3904, bs 64, bpc 4, sw 128: lw = 2 from 0.30, W = 1 before.
    assert impl.load_window_size_in_chunks(3904, 128, 0, 256) == (1 if minor < 30 else 2)
    # Store mask FA 16 / SWA 4 / sw 8 over 8 blocks; e = 3 widens it from 0.31.
    plain = [b for b in range(8) if impl.is_block_reachable(b, 16, 4, 8, 0, False, None, 8)]
    mtp = [b for b in range(8) if impl.is_block_reachable(b, 16, 4, 8, 3, False, None, 8)]
    assert plain == [2, 3, 6, 7]
    assert mtp == ([1, 2, 3, 5, 6, 7] if minor >= 31 else [2, 3, 6, 7])
    assert impl.get_num_skipped_tokens(100, 32, 3) == 66
    # The store horizon is no longer modelled from _build_store_jobs' text (issue 20):
    # the field is unbound, its theorems unchecked and named; upstream's store path is
    # checked as executed (tests/tools/audit/test_audit_store.py pins what it does).
    assert binding.roles["store_horizon"].status == "missing"
    assert "store_final_segment_end" in binding.missing_fields
    assert "not modelled from" in binding.missing_fields["store_final_segment_end"]


def test_module_file_binds_by_bare_name(tmp_path: Path) -> None:
    path = tmp_path / "patch.py"
    path.write_text(
        "class Anything:\n"
        "    def _maximal_prefix_lookup(self, keys, req_context, req, group_config,\n"
        "                               start_chunk_idx):\n"
        "        return 0\n"
    )
    binding = bind(resolve_target(f"module:{path}"))
    assert binding.roles["prefix_scan"].status == "found"
    assert binding.roles["prefix_scan"].line == 2
    assert binding.roles["sw_scan"].status == "missing"
    assert "sliding_window_lookup" in binding.missing_fields


def test_definition_error_is_reported_not_raised(tmp_path: Path) -> None:
    path = tmp_path / "patch.py"
    path.write_text("def get_sliding_window_size_in_chunks(spec, tpc=undefined_name):\n"
                    "    return 1\n")
    binding = bind(resolve_target(f"module:{path}"))
    assert binding.roles["window"].status == "error"
    assert "NameError" in binding.roles["window"].note
