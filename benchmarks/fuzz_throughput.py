"""Scheduler steps per second: mocked manager vs tensor-backed manager on CPU.

Target: the real manager on CPU is at most 5x slower than the mocked one. Both systems
run every check (the formal model on every lookup and store job; the real one adds the
byte and attention oracles of C11), so the ratio is the cost of the tensors and oracles.
Two workloads: CPU loads only (no GPU prefix cache: every consumer loads from the CPU)
and the default system (GPU prefix hits, then CPU loads past them).

    python benchmarks/fuzz_throughput.py [--rounds N] [--repeat K] [--threads T]

Figures are steps per second of process CPU time (best of K), so other load on a shared
machine does not skew the ratio; ``kvcontract fuzz`` on CPU also runs torch with one
intra-op thread (its tensors are a few KiB; thread start-up costs more than it saves).
"""

from __future__ import annotations

import argparse
import time

import torch

from kvcontract.impl.system import OffloadSystem, SystemConfig
from kvcontract.impl.variants import get_implementation
from kvcontract.spec.geometry import Geometry, fa, swa
from kvcontract.tools.monitor import Monitor


def steps_per_second(tensor_backed: bool, gpu_prefix_cache: bool, rounds: int) -> float:
    impl = get_implementation("reference")
    geometry = Geometry((fa(16), swa(4, 8, 1), swa(8, 24)), blocks_per_chunk=2)
    system = OffloadSystem(
        SystemConfig(
            geometry, impl, tensor_backed=tensor_backed, capacity_chunks=256,
            gpu_prefix_cache=gpu_prefix_cache,
        )
    )
    # The monitor judges every event (the system does not check itself): timed with it,
    # since the fuzzer always runs one.
    monitor = Monitor.attach(system)
    start = time.process_time()
    for i in range(rounds):
        tokens = [(j * 7 + (i % 3)) % 50 for j in range(200)] + [i % 50, 7]
        system.add_request(f"r{i}", tokens, 3)
        for _ in range(4):
            system.step(64)
    system.drain()
    elapsed = time.process_time() - start
    assert not monitor.violations, monitor.violations[:1]
    steps: int = system.steps
    return steps / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--repeat", type=int, default=5, help="best of K runs")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads (the fuzzer's tensors are tiny)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"steps per CPU second (process time, best of {args.repeat}, "
          f"{args.threads} torch thread(s))")
    for label, cache in (("CPU loads only", False), ("GPU prefix hits", True)):
        mocked = max(steps_per_second(False, cache, args.rounds) for _ in range(args.repeat))
        real = max(steps_per_second(True, cache, args.rounds) for _ in range(args.repeat))
        ratio = mocked / real
        print(f"[{label}]")
        print(f"  mocked manager:      {mocked:8.1f} steps/s")
        print(f"  real manager (CPU):  {real:8.1f} steps/s")
        print(f"  slowdown (mocked/real): {ratio:.2f}x (target <= 5x): "
              f"{'OK' if ratio <= 5 else 'MISS'}")


if __name__ == "__main__":
    main()
