"""Wall-clock time of a full audit of one vLLM release (target: under 2 minutes on 2 cores).

Usage: ``python benchmarks/audit_time.py [VERSION] [--jobs N]``. The release is fetched
with ``pip download --no-deps`` into the kvcontract cache (only the audited ``.py`` files
are unpacked; ``KVCONTRACT_VLLM_CACHE`` may point at an unpacked tree) and audited with the
default options, every clause, exactly as ``kvcontract audit --target vllm:PATH`` does.
"""

from __future__ import annotations

import argparse
import os
import time

from kvcontract.tools.audit.binding import bind
from kvcontract.tools.audit.engine import AuditOptions, clause_summary, run_audit
from kvcontract.tools.audit.targets import resolve_target
from kvcontract.tools.audit.wheels import fetch_release

TARGET_SECONDS = 120.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("version", nargs="?", default="0.33.0")
    parser.add_argument("--jobs", type=int, default=None)
    args = parser.parse_args()
    tree = fetch_release(args.version)
    started = time.perf_counter()
    binding = bind(resolve_target(f"vllm:{tree}"))
    run = run_audit(binding, AuditOptions(jobs=args.jobs))
    elapsed = time.perf_counter() - started
    summary = ", ".join(f"{e['clause']} {e['status']}"
                        for e in clause_summary(run.rows, run.unchecked))
    print(f"vllm {args.version}: {len(run.rows)} theorems, {len(run.unchecked)} not checked")
    print(f"clauses: {summary}")
    print(f"full audit: {elapsed:.1f}s on {args.jobs or os.cpu_count()} workers "
          f"(target < {TARGET_SECONDS:.0f}s): {'OK' if elapsed < TARGET_SECONDS else 'MISS'}")


if __name__ == "__main__":
    main()
