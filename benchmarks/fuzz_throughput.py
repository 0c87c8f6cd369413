"""Scheduler steps per second: mocked manager vs tensor-backed manager on CPU.

Target: the real manager on CPU is at most 5x slower than the mocked one.
"""

from __future__ import annotations

import time

from kvcontract.impl.system import OffloadSystem, SystemConfig
from kvcontract.impl.variants import get_implementation
from kvcontract.spec.geometry import Geometry, fa, swa


def steps_per_second(tensor_backed: bool, rounds: int = 30) -> float:
    impl = get_implementation("reference")
    geometry = Geometry((fa(16), swa(4, 8, 1), swa(8, 24)), blocks_per_chunk=2)
    system = OffloadSystem(
        SystemConfig(geometry, impl, tensor_backed=tensor_backed, capacity_chunks=256)
    )
    start = time.perf_counter()
    for i in range(rounds):
        tokens = [(j * 7 + (i % 3)) % 50 for j in range(200)] + [i % 50, 7]
        system.add_request(f"r{i}", tokens, 3)
        for _ in range(4):
            system.step(64)
    system.drain()
    elapsed = time.perf_counter() - start
    assert not system.violations, system.violations[:1]
    return system.steps / elapsed


def main() -> None:
    mocked = steps_per_second(False)
    real = steps_per_second(True)
    ratio = mocked / real
    print(f"mocked manager:      {mocked:8.1f} steps/s")
    print(f"real manager (CPU):  {real:8.1f} steps/s")
    print(f"slowdown (mocked/real): {ratio:.2f}x (target <= 5x): {'OK' if ratio <= 5 else 'MISS'}")


if __name__ == "__main__":
    main()
