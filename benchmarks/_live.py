"""What the benchmarks that run vLLM share (imported by name: a benchmark runs as a
script, with this folder first on ``sys.path``)."""

from __future__ import annotations

import resource
import sys


def live_backend_missing(*, import_modules: bool = True) -> bool:
    """Whether the live backend cannot run here (:func:`kvcontract.live.env.check`, with
    ``import_modules``); what it lacks is printed to stderr (the benchmark exits 3)."""
    from kvcontract.live.env import check

    found = check(import_modules=import_modules)
    if not found.ok:
        print("\n".join(found.lines()), file=sys.stderr)
    return not found.ok


def rss_mib() -> float:
    """The process's maximum resident set so far, in MiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
