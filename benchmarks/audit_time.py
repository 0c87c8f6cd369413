"""Wall-clock time, CPU time and peak memory of an audit of one vLLM release (target:
``--model all`` under 2 minutes on 2 cores).

Usage: ``python benchmarks/audit_time.py [VERSION] [--jobs N] [--model NAME ...]
[--catalogue]``. The release is fetched with ``pip download --no-deps`` into the
kvcontract cache (only the audited ``.py`` files are unpacked; ``KVCONTRACT_VLLM_CACHE``
may point at an unpacked tree) and audited as ``kvcontract audit --target vllm:PATH
--model all`` does (every preset at bpc 1, 4 and 16); ``--model`` names other presets,
``--catalogue`` audits the built-in catalogues instead (no ``--model``), the default
audit; ``--shard I/N`` times one shard (``kvcontract audit --shard I/N``). The defects'
costs on the model presets (the default audit's last stage) are measured and timed
apart unless ``--no-costs``.

Two cores are often shared: the CPU time (user + system, this process and its sandbox
children) and the load average are printed next to the wall time, since the wall time
alone says little on a loaded machine. Peak RSS is the largest of this process and any
one child (``ru_maxrss``).
"""

from __future__ import annotations

import argparse
import os
import resource
import time

from kvcontract.errors import UsageError
from kvcontract.proofs.shards import parse_shard
from kvcontract.tools.audit.binding import bind
from kvcontract.tools.audit.engine import AuditOptions, clause_summary, run_audit
from kvcontract.tools.audit.targets import resolve_target
from kvcontract.tools.audit.wheels import fetch_release
from kvcontract.tools.commands._common import resolve_geometries

TARGET_SECONDS = 120.0


def _cpu_seconds() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _peak_rss_mib() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return max(own, children) / 1024  # KiB on Linux


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("version", nargs="?", default="0.33.0")
    parser.add_argument("--jobs", type=int, default=None)
    parser.add_argument("--model", action="append", default=None,
                        help="a preset name or 'all' (repeatable; default: all)")
    parser.add_argument("--catalogue", action="store_true",
                        help="audit the built-in catalogues (no --model)")
    parser.add_argument("--no-costs", action="store_true",
                        help="skip the defects' preset costs (kvcontract audit "
                             "--catalogue-only); by default they are measured and timed "
                             "apart, as the default audit runs them")
    parser.add_argument("--shard", default=None, metavar="I/N",
                        help="time only shard I of N (kvcontract audit --shard I/N)")
    args = parser.parse_args()
    try:
        shard = parse_shard(args.shard)
    except UsageError as exc:
        parser.error(str(exc))
    models = () if args.catalogue else tuple(args.model or ["all"])
    tree = fetch_release(args.version)
    load = os.getloadavg()
    started = time.perf_counter()
    cpu_started = _cpu_seconds()
    geometries = tuple(resolve_geometries(models, ())) if models else ()
    binding = bind(resolve_target(f"vllm:{tree}"))
    run = run_audit(binding, AuditOptions(jobs=args.jobs, geometries=geometries,
                                          shard=shard))
    theorems_wall = time.perf_counter() - started
    theorems_cpu = _cpu_seconds() - cpu_started
    costs = ""
    if not args.no_costs and shard is None:
        from kvcontract.tools.audit.cost_stage import cost_defects
        from kvcontract.tools.audit.report import build_report

        options = AuditOptions(jobs=args.jobs, geometries=geometries)
        report = build_report(binding, run)
        cost_defects(binding, report, options)
        costed = sum(1 for d in report["defects"] if d.get("cost"))
        costs = (f"; of which {len(report['defects'])} defects' costs ({costed} measured): "
                 f"wall {time.perf_counter() - started - theorems_wall:.1f}s, CPU "
                 f"{_cpu_seconds() - cpu_started - theorems_cpu:.1f}s")
    elapsed = time.perf_counter() - started
    cpu = _cpu_seconds() - cpu_started
    summary = ", ".join(f"{e['clause']} {e['status']}"
                        for e in clause_summary(run.rows, run.unchecked))
    scope = f"--model {' '.join(models)} ({len(geometries)} geometries)" if models \
        else "the catalogues"
    if args.shard:
        scope += f", shard {args.shard}"
    print(f"vllm {args.version}, {scope}: {len(run.rows)} theorems, "
          f"{len(run.unchecked)} not checked")
    print(f"clauses: {summary}")
    print(f"wall {elapsed:.1f}s, CPU {cpu:.1f}s (user + system, children included), peak RSS "
          f"{_peak_rss_mib():.0f} MiB, on {args.jobs or os.cpu_count()} workers; load average "
          f"{load[0]:.2f} before, {os.getloadavg()[0]:.2f} after{costs}")
    print(f"target < {TARGET_SECONDS:.0f}s wall: {'OK' if elapsed < TARGET_SECONDS else 'MISS'}")


if __name__ == "__main__":
    main()
