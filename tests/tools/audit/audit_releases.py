"""Released vLLM trees and small upstream-shaped snippets shared by the audit tests.

A module of its own name (not ``conftest``): tests import it as ``audit_releases``, so
collecting tests/tools/audit together with another folder whose ``conftest`` is imported
by name (tests/live) cannot pick up the wrong one. Released trees come from
:func:`kvcontract.tools.audit.wheels.fetch_release` (see conftest.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kvcontract.releases import AUDITED_RELEASES, NEWEST_RELEASE
from kvcontract.tools.audit.wheels import FetchError, fetch_release

DEFAULT_RELEASES = ("0.29.0", "0.33.0")
"""Released trees every run audits (the rest of kvcontract.releases.AUDITED_RELEASES runs
with -m slow; 0.34.0, the installed release, is audited by the live tests)."""
SLOW_RELEASES = tuple(r for r in AUDITED_RELEASES
                      if r not in DEFAULT_RELEASES and r != NEWEST_RELEASE)

_TREES: dict[str, Path | str] = {}


def release_tree(version: str) -> Path:
    """The unpacked tree of a release, or skip the test saying why it is unavailable."""
    if version not in _TREES:
        try:
            _TREES[version] = fetch_release(version)
        except FetchError as exc:
            _TREES[version] = str(exc)
    found = _TREES[version]
    if isinstance(found, str):
        pytest.skip(f"vLLM {version} is not available (registry unreachable?): {found}")
    return found


def release_params() -> list[object]:
    return [*DEFAULT_RELEASES,
            *(pytest.param(v, marks=pytest.mark.slow) for v in SLOW_RELEASES)]


# -- small files with upstream names (our own code, written from the documented logic) --
STALE_PENDING_SCAN = '''
def _sliding_window_lookup(self, keys, sliding_window_size, req_context):
    """Right-to-left run search whose pending mark survives a MISS (the old defect)."""
    deferred = False
    run = 0
    for position in reversed(range(len(keys))):
        state = self.manager.lookup(keys[position], req_context)
        if state == LookupResult.MISS:
            run = 0
            continue
        if state == LookupResult.RETRY:
            deferred = True
            run = 0
            continue
        if state == LookupResult.HIT_PENDING:
            deferred = True
        run += 1
        if run == sliding_window_size:
            return None if deferred else position + run
    return None if deferred else run
'''

STALE_PENDING_SCAN_030 = '''
def _sliding_window_lookup(self, keys, sliding_window_size, req_context,
                           initial_window_size=None):
    """The 0.30+ signature (a first window of its own), with the old defect: the pending
    mark survives a MISS."""
    deferred = False
    run = 0
    required = initial_window_size or sliding_window_size
    for position in reversed(range(len(keys))):
        state = self.manager.lookup(keys[position], req_context)
        if state == LookupResult.MISS:
            run = 0
            required = sliding_window_size
            continue
        if state == LookupResult.RETRY:
            deferred = True
            run = 0
            required = sliding_window_size
            continue
        if state == LookupResult.HIT_PENDING:
            deferred = True
        run += 1
        if run == required:
            return None if deferred else position + run
    return None if deferred else run
'''
"""STALE_PENDING_SCAN with the signature 0.30.0-0.34.0's callers call (vLLM's engine runs
a patch only where it fits its release)."""

FIXED_SCAN = '''
def _sliding_window_lookup(self, keys, sliding_window_size, req_context,
                           initial_window_size=None):
    """Right-to-left run search; a pending mark belongs to its run only."""
    sticky_defer = False
    run_pending = False
    run = 0
    needed = initial_window_size or sliding_window_size
    for position in reversed(range(len(keys))):
        state = self.manager.lookup(keys[position], req_context)
        if state in (LookupResult.MISS, LookupResult.RETRY):
            sticky_defer = sticky_defer or state == LookupResult.RETRY
            run = 0
            run_pending = False
            needed = sliding_window_size
            continue
        run_pending = run_pending or state == LookupResult.HIT_PENDING
        run += 1
        if run == needed:
            return None if sticky_defer or run_pending else position + needed
    return None if sticky_defer or run_pending else run
'''

HANGING_SCAN = '''
def _sliding_window_lookup(self, keys, sliding_window_size, req_context,
                           initial_window_size=None):
    while True:
        pass
'''

RAISING_SCAN = '''
def _sliding_window_lookup(self, keys, sliding_window_size, req_context,
                           initial_window_size=None):
    raise RuntimeError("scanner exploded")
'''

GARBAGE_SCAN = '''
def _sliding_window_lookup(self, keys, sliding_window_size, req_context,
                           initial_window_size=None):
    return "seven"
'''

STUBBORN_SCAN = '''
def _sliding_window_lookup(self, keys, sliding_window_size, req_context,
                           initial_window_size=None):
    import signal

    signal.signal(signal.SIGALRM, signal.SIG_IGN)
    signal.signal(signal.SIGPROF, signal.SIG_IGN)
    while True:
        pass
'''
"""Ignores the per-call alarm: only the per-theorem CPU limit stops it."""

E_IGNORING_WINDOW = '''
def get_sliding_window_size_in_chunks(kv_cache_spec, tokens_per_chunk):
    if isinstance(kv_cache_spec, SlidingWindowSpec):
        return cdiv(kv_cache_spec.sliding_window, tokens_per_chunk)
    return None
'''

EXACT_WINDOW = '''
def get_sliding_window_size_in_chunks(kv_cache_spec, tokens_per_chunk):
    if isinstance(kv_cache_spec, SlidingWindowSpec):
        return cdiv(kv_cache_spec.sliding_window - 1 + kv_cache_spec.extra_retained_tokens,
                    tokens_per_chunk)
    return None
'''
