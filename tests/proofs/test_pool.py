"""The prover's worker processes (kvcontract.proofs.pool): every task from the same
state, failures reported as themselves, a dead child as BrokenProcessPool."""

from __future__ import annotations

import functools
import os
import threading
from concurrent.futures.process import BrokenProcessPool
from typing import Any

import pytest

from kvcontract.proofs import runner
from kvcontract.proofs.pool import TaskRunner, WorkerError

pytestmark = pytest.mark.skipif(os.name != "posix", reason="the template forks on POSIX")


def _square(task: int) -> int:
    return task * task


def _raise_value_error(task: int) -> int:
    raise ValueError(f"task {task} is bad")


class _Unpicklable(Exception):
    def __init__(self, lock: Any) -> None:
        super().__init__("holds a lock")
        self.lock = lock


def _raise_unpicklable(task: int) -> int:
    raise _Unpicklable(threading.Lock())


def _die_on_two(task: int) -> int:
    if task == 2:
        os._exit(9)
    return task


def test_results_of_every_task() -> None:
    with TaskRunner() as pool:
        out = dict(pool.run(_square, [1, 2, 3, 4, 5], jobs=2))
    assert out == {0: 1, 1: 4, 2: 9, 3: 16, 4: 25}


def test_an_exception_comes_back_as_itself() -> None:
    with TaskRunner() as pool, pytest.raises(ValueError, match="task 7 is bad"):
        list(pool.run(_raise_value_error, [7], jobs=1))


def test_an_unpicklable_exception_comes_back_as_its_text() -> None:
    with TaskRunner() as pool, pytest.raises(WorkerError, match="_Unpicklable"):
        list(pool.run(_raise_unpicklable, [1], jobs=1))


def test_a_dead_child_is_a_broken_pool() -> None:
    with TaskRunner() as pool, pytest.raises(BrokenProcessPool, match="exit code 9"):
        list(pool.run(_die_on_two, [1, 2, 3], jobs=1))


def test_no_tasks_is_no_work() -> None:
    with TaskRunner() as pool:
        assert list(pool.run(_square, [], jobs=2)) == []


def test_leaving_early_ends_the_template() -> None:
    pool = TaskRunner()
    for _ in pool.run(_square, list(range(20)), jobs=2):
        break
    pool.close()
    assert pool._process is None


REPLAY = next(i for i, t in enumerate(runner.catalog())
              if t.theorem_id == "C7/replay-boundary-supplied[plain-zero]")


def test_the_same_theorem_uses_the_same_resources_in_every_child() -> None:
    """Z3's search depends on when the collector frees terms (recycled ids). Forked
    children of one process without a collection first used 1,064,769 to 1,081,409
    resources for this theorem, by the order they were forked in; a verdict near its
    budget would then depend on the scheduling."""
    task: runner.Task = ("reference", (REPLAY,), 0, 1, ())
    with TaskRunner(prepare=functools.partial(runner.catalog, ())) as pool:
        outcomes = [outcome for _, (_, outcome) in pool.run(runner._run_task, [task] * 3,
                                                            jobs=2)]
    used = {result.rlimit_used for outcome in outcomes for result in outcome}  # type: ignore[union-attr]
    assert len(used) == 1, used
