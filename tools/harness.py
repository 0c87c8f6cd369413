"""Test fixtures of the executable system: states a program cannot reach by itself.

Contract: :class:`SystemHarness` manipulates one
:class:`~kvcontract.impl.system.engine.OffloadSystem` from the outside, through the
system's public hooks (``chunk_key``, ``chunk_keys_for``, ``local_hit_for``,
``hold_loading``, ``inject_store_failure``, ``BlockPool.evict_free``) and the offload
manager's ``force_state``: installing chunks in a state (with the producer's bytes),
marking chunks as loaded by another request, perturbing the leftmost chunk the contract
would read, failing the next store job and evicting the GPU prefix caches. Each
manipulation is noted in the system's decision log, so two systems driven in lockstep
stay comparable. The fuzzer's programs name these as operations
(:data:`FIXTURE_OPERATIONS`); the tests call them directly. Bad arguments raise
:class:`~kvcontract.errors.UsageError`.
"""

from __future__ import annotations

import torch

from kvcontract.errors import UsageError
from kvcontract.impl.system.engine import OffloadSystem
from kvcontract.impl.system.offload import ChunkKey, ChunkState, TensorOffloadManager
from kvcontract.impl.system.oracle import expected_kv
from kvcontract.spec import multigroup

FIXTURE_OPERATIONS = frozenset({
    "install_chunk", "mark_loading", "perturb_left_chunk", "fail_next_store",
    "evict_gpu_cache",
})
"""The program operations that are fixtures (methods of :class:`SystemHarness`)."""

PERTURB_STATES = ("absent", "pending", "loading", "stale")


class SystemHarness:
    """Fixtures for one system (see the module docstring)."""

    def __init__(self, system: OffloadSystem) -> None:
        self.system = system

    def _force(self, key: ChunkKey, state: ChunkState) -> int | None:
        """Put ``key`` into ``state``. A chunk made pending from outside has no store job
        that could complete it: for the lifecycle judges it is a stalled write (C14 does
        not ask it to end; C13 still bounds every deferral on it)."""
        if state is ChunkState.PENDING:
            self.system.stalled_keys.add(key)
        return self.system.manager.force_state(key, state)

    def install_chunk(self, tokens: list[int], group: int, chunk: int, state: ChunkState) -> None:
        """Put a chunk into ``state``; a ready chunk gets the producer's bytes."""
        system = self.system
        key = system.chunk_key(tokens, group, chunk)
        slot = self._force(key, state)
        if slot is not None and isinstance(system.manager, TensorOffloadManager):
            spec = system.geometry.groups[group]
            tpc = system.geometry.chunk_tokens(spec)
            positions = torch.arange(chunk * tpc, (chunk + 1) * tpc)
            ids = torch.tensor(tokens[chunk * tpc : (chunk + 1) * tpc])
            kv = expected_kv(system.config.layout, group, positions, ids)
            target = system.manager.chunks[group][slot]
            target.copy_(kv.view(target.shape))

    def mark_loading(self, tokens: list[int], group: int, chunk: int) -> None:
        """Another request, outside the program, is loading this chunk (and never ends)."""
        self.system.hold_loading(self.system.chunk_key(tokens, group, chunk))

    def perturb_left_chunk(self, tokens: list[int], state: str) -> None:
        """Change the leftmost chunk the contract would read for ``tokens``.

        The chunk is the first of the read range (docs/CONTRACT.md 10, "left chunk") of the
        SWA group with the largest window at the boundary the contract accepts now, given
        the local hit ``tokens`` would get. ``state``: ``absent`` (evicted), ``pending``
        (a stalled write), ``loading`` (another request is loading it) or ``stale``
        (absent, and the group's last chunk pending: docs/CONTRACT.md 8, seed 000).
        """
        if state not in PERTURB_STATES:
            raise UsageError(f"perturb_left_chunk: unknown state {state!r}")
        system = self.system
        geo = system.geometry
        keys = system.chunk_keys_for(tokens)
        found = multigroup.left_chunk(geo, len(tokens), system.local_hit_for(tokens),
                                      lambda g, k: system.manager.lookup(keys[(g, k)]))
        if found is None:
            system.log.append("perturb: no boundary to perturb")
            return
        best, g, chunk = found
        key = keys[(g, chunk)]
        if state == "loading":
            system.hold_loading(key)
        elif state == "stale":
            self._force(key, ChunkState.ABSENT)
            last = len(tokens) // geo.chunk_tokens(geo.groups[g]) - 1
            if last > chunk:
                self._force(keys[(g, last)], ChunkState.PENDING)
        else:
            self._force(key, ChunkState(state))
        system.log.append(f"perturb g{g} chunk {chunk} of boundary {best} -> {state}")

    def fail_next_store(self) -> None:
        """The next store job fails (its chunks end absent)."""
        self.system.inject_store_failure()

    def evict_gpu_cache(self) -> None:
        """Drop every free block from the GPU prefix caches (memory pressure)."""
        for pool in self.system.pools:
            pool.evict_free()
        self.system.log.append("evict-gpu-cache")
