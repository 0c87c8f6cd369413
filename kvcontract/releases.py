"""The vLLM releases kvcontract knows, in one place.

These lists say which releases are fetched, driven and restated, never how to treat
one: what differs between releases is found by capability, on the release's own
objects (:mod:`kvcontract.live.capabilities`: a probe per API the driver and the
judges use, each naming the API it misses), so a release not listed here (vLLM's main
laid over a wheel) is driven as far as its capabilities allow and its gaps are
UNKNOWN naming the API. ARCHITECTURE.md, "How to support a vLLM release", is the recipe;
``tests/kvcontract/test_release_lists.py`` pins these lists to the install script and to
each other.
"""

from __future__ import annotations

AUDITED_RELEASES = ("0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.32.0", "0.33.0", "0.34.0")
"""Releases whose audited files the audit fetches (``tools/audit/wheels``: the audit's
release tests, ``--base`` when no vLLM is installed), oldest first."""

LIVE_RELEASES = ("0.30.0", "0.31.0", "0.32.0", "0.33.0", "0.34.0")
"""Releases the live backend is known to drive (informational: the check never refuses
by it). 0.30.0-0.32.0 plan the KV cache in one call and mark no drafter layer (an EAGLE
geometry is refused there); 0.30.0's request context has no key positions. 0.28 and
0.29 plan the KV cache another way: their planning functions are absent, which the
check names."""

NEWEST_RELEASE = LIVE_RELEASES[-1]
"""The release ``.ci/install-live`` installs by default and the install recipe names."""

PLANNING_RELEASE = "0.33.0"
"""The release whose KV-cache planning rules :mod:`kvcontract.spec.build` restates
(each rule's message cites the function of this release it restates)."""
