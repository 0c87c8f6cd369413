"""A lookup case judged on vLLM's own engine.

A :class:`~kvcontract.spec.properties.lookup.LookupCase` (a geometry, the request's
tokens, its local GPU hit ``L``, a scheduling budget, and each chunk's state in the
offload tier) becomes a run of vLLM's real scheduler:

1. the chunk states are installed in vLLM's own offload manager through its API, on the
   request's own offload keys (computed by vLLM: the request's block hashes and
   ``RequestOffloadState.update_offload_keys``): ``HIT`` is ``prepare_store`` then
   ``complete_store``, ``HIT_PENDING`` is ``prepare_store`` alone, ``MISS`` is nothing.
   ``RETRY`` is what an offload tier with an asynchronous lookup in flight answers;
   vLLM's CPU manager never does, so for a ``RETRY`` chunk the manager's ``lookup``
   answers it (every other call is the manager's own);
2. a local hit ``L > 0`` is made real: a first request with the same first ``L + 1``
   tokens is computed and finished (its own stores capped at zero tokens by
   ``kv_transfer_params["max_offload_tokens"]``), so vLLM's GPU prefix cache serves
   ``L`` tokens to the case's request; a case whose ``L`` vLLM's prefix cache does not
   serve is :class:`NotRealized`;
3. a budget is what the connector passes when groups it does not offload hold a prefix
   (``OffloadingConnector._max_loadable_tokens``): that method answers the budget;
4. the request arrives and one ``schedule()`` runs: vLLM's scheduler asks the connector
   (``get_num_new_matched_tokens``), allocates the blocks and calls
   ``update_state_after_alloc``, whose ``prepare_load`` names the load set; the request
   is then aborted and its jobs reported (:func:`~.engines.release_request`).

The observation, in the lookup family's words: the accepted boundary (``L`` plus what
the connector accepted; None: deferred), every chunk the connector looked up (in order),
the chunks loaded per group, and what vLLM raised. The family's judges (C2-C6) read it
unchanged.

**Cases that agree on what vLLM touched share its run.** The connector's answer is a
deterministic function of what its manager answered to the lookups it made, and the
load's outcome of the states of the chunks it loads. So each geometry keeps a decision
tree of the runs made so far: a case walks it with its own states (the first lookup's
chunk, its state, the next lookup's chunk...) and, when it reaches a recorded run whose
loaded chunks are in the same states, that run is its observation; otherwise vLLM runs
the case and the tree grows. Every observation is one vLLM produced for a case with the
same answer to every manager call vLLM made; ``JudgeStats`` counts both kinds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kvcontract.live.judge.engines import (
    EnginePool,
    JudgeEngine,
    NotBuilt,
    check_gaps,
    release_request,
)
from kvcontract.live.trace import TraceRequest
from kvcontract.spec.properties.lookup import LookupCase, LookupObservation
from kvcontract.vocabulary import LookupResult

RETRY_NOTE = ("RETRY (an asynchronous tier's answer, which vLLM's CPU manager never "
              "gives) is answered by the manager's lookup for that chunk")
BUDGET_NOTE = ("a budget is passed as vLLM's connector passes one: "
               "OffloadingConnector._max_loadable_tokens answers it (KV-cache groups the "
               "connector does not offload hold that prefix)")
LOCAL_HIT_NOTE = ("a local hit L is served by vLLM's GPU prefix cache after a first "
                  "request with the same first L + 1 tokens (its own stores capped at 0 "
                  "tokens)")


class NotRealized(Exception):
    """vLLM's engine cannot put the case's request in the case's situation (its GPU
    prefix cache serves another local hit, the release has no way to pass a budget):
    the case says nothing about vLLM and is left out, counted."""


@dataclass
class JudgeStats:
    """How many cases vLLM ran and how many shared a recorded run."""

    runs: int = 0
    shared: int = 0
    not_realized: int = 0


Path = tuple[tuple[int, int, str], ...]


@dataclass
class _Run:
    """One vLLM run: the lookups it made (vLLM group, chunk, answer, in order), the
    accepted boundary, the loaded chunks per geometry group and what vLLM raised."""

    lookups: Path
    hit_tokens: int | None
    loads: dict[int, tuple[int, ...]]
    raised: str | None
    load_states: tuple[str, ...]
    """The states of the loaded chunks (in ``load_keys`` order) in the case that ran."""
    load_keys: tuple[tuple[int, int], ...]


@dataclass
class _Node:
    """A point of the decision tree: the next lookup vLLM made here (None: it made no
    further lookup), the subtree per answer, and the runs that ended here."""

    query: tuple[int, int] | None = None
    children: dict[str, _Node] = field(default_factory=dict)
    ended: list[_Run] = field(default_factory=list)


class _KeyAnswers:
    """The connector's manager, answering RETRY for the chosen keys' lookups, and
    noting the keys of every ``prepare_load`` before the manager sees them (a load that
    raises is still a load set)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.retry: set[Any] = set()
        self.loading: list[list[Any]] = []

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._inner, name)
        if name == "prepare_load":
            def prepare_load(keys: Any, *args: Any, **kwargs: Any) -> Any:
                keys = list(keys)
                self.loading.append(keys)
                return attribute(keys, *args, **kwargs)

            return prepare_load
        if name != "lookup":
            return attribute

        def lookup(key: Any, *args: Any, **kwargs: Any) -> Any:
            if key in self.retry:
                LookupResultCls = _vllm_lookup_result()
                return LookupResultCls.RETRY
            return attribute(key, *args, **kwargs)

        return lookup


def _vllm_lookup_result() -> Any:
    from kvcontract.live.capabilities import vllm_names

    return vllm_names("vllm.v1.kv_offload.base", "LookupResult")


@dataclass
class _Geometry:
    """Per engine: the answer layer and the decision trees (per request shape)."""

    judge: JudgeEngine
    answers: _KeyAnswers
    trees: dict[tuple[int, int, int | None], _Node] = field(default_factory=dict)


class LookupJudge:
    """Lookup cases observed on vLLM (the module docstring)."""

    def __init__(self, pool: EnginePool) -> None:
        self.pool = pool
        self.stats = JudgeStats()
        self._geometries: dict[int, _Geometry] = {}

    def why_not(self, case: LookupCase) -> str | None:
        """Why ``case`` is not judged on vLLM (its geometry is not built, or the
        release cannot put a request in its situation); None when it is."""
        found = self.pool.get(case.geometry)
        if isinstance(found, NotBuilt):
            return found.describe()
        if case.max_hit_tokens is not None and not found.capabilities.budget_hook:
            return ("this release's connector takes no budget from the scheduler "
                    "(no _max_loadable_tokens): a budgeted lookup does not happen there")
        if case.local_hit and not found.capabilities.max_offload_tokens:
            return ("this release's requests cannot cap their own stores "
                    "(max_offload_tokens), so the local hit's first request would store "
                    "the case's chunks itself")
        return None

    def _state(self, judge: JudgeEngine) -> _Geometry:
        found = self._geometries.get(id(judge))
        if found is None:
            scheduler = judge.engine.connector_scheduler
            proxy = scheduler.manager  # the recorder's proxy (LiveRun's)
            answers = _KeyAnswers(proxy._inner)
            proxy._inner = answers
            found = _Geometry(judge, answers)
            self._geometries[id(judge)] = found
        return found

    def observe(self, case: LookupCase) -> LookupObservation:
        judge = self.pool.get(case.geometry)
        if isinstance(judge, NotBuilt):
            raise NotRealized(judge.describe())
        state = self._state(judge)
        shape = (case.num_tokens, case.local_hit, case.max_hit_tokens)
        root = state.trees.setdefault(shape, _Node())
        run = _walk(root, case, judge)
        if run is None:
            run = self._run(state, case)
            _insert(root, run)
            self.stats.runs += 1
        else:
            self.stats.shared += 1
        return _observation(case, run, judge)

    # -- one run on vLLM ------------------------------------------------------------------
    def _run(self, state: _Geometry, case: LookupCase) -> _Run:
        judge = state.judge
        session = judge.session
        engine = judge.engine
        tokens = self.pool.tokens(case.num_tokens)
        if case.local_hit:
            self._serve_local_hit(judge, tokens[:case.local_hit + 1])
        keys, context = session.offload_keys(tokens)
        chunk_of: dict[Any, tuple[int, int]] = {}
        for (g, k), found in keys.items():
            answer = _state_of(case, g, k)
            for key in found:
                chunk_of[key] = (g, k)
            _install(session, found, context, answer, state.answers)
        connector = engine.scheduler.connector
        restore: Callable[[], None] | None = None
        if case.max_hit_tokens is not None:
            budget = case.max_hit_tokens

            def bounded(request: Any, num_computed_tokens: int) -> int:
                return max(0, budget - num_computed_tokens)

            connector._max_loadable_tokens = bounded

            def restore() -> None:
                del connector._max_loadable_tokens

        observation = session.observation
        marks = (len(observation.lookups), len(observation.matches), len(observation.loads),
                 len(observation.exceptions))
        state.answers.loading.clear()
        name = f"judge-lookup-{self.stats.runs}"
        request: Any = None
        try:
            session.add_request(name, tokens, max_new_tokens=1)
            request = session.run.live.get(name)
            session.step(case.num_tokens + 1)
            check_gaps(session)
        finally:
            if restore is not None:
                restore()
            state.answers.retry.clear()
        raised = None
        if len(observation.exceptions) > marks[3]:
            found_exc = observation.exceptions[marks[3]]
            raised = f"{found_exc.type}: {found_exc.message}"
            session.stopped = False  # the case's crash is its observation, not the engine's end
        matches = [m for m in observation.matches[marks[1]:] if m.request == name]
        if not matches:
            release_request(judge, request)
            raise NotRealized("vLLM's scheduler did not look the request up in its first "
                              "step")
        match = matches[0]
        if match.local_hit != case.local_hit:
            release_request(judge, request)
            raise NotRealized(f"vLLM's GPU prefix cache served a local hit of "
                              f"{match.local_hit} tokens, not the case's {case.local_hit}")
        lookups: list[tuple[int, int, str]] = []
        for looked in observation.lookups[marks[0]:]:
            if looked.request != name or looked.step != match.step:
                continue
            lookups.append((looked.vllm_group, looked.chunk, looked.result.name))
        loads: dict[int, tuple[int, ...]] = {}
        for keys_loaded in state.answers.loading:
            for key in keys_loaded:
                if key in chunk_of:
                    g, k = chunk_of[key]
                    loads[g] = tuple(sorted(set(loads.get(g, ())) | {k}))
        release_request(judge, request)
        hit = None if match.external is None else case.local_hit + match.external
        load_keys = tuple((g, k) for g in sorted(loads) for k in loads[g])
        return _Run(tuple(lookups), hit, loads, raised,
                    tuple(_state_of(case, g, k).name for g, k in load_keys), load_keys)

    def _serve_local_hit(self, judge: JudgeEngine, prefix: list[int]) -> None:
        """Compute and finish a first request of ``prefix`` (its stores capped at 0
        tokens), so vLLM's GPU prefix cache holds its blocks."""
        session = judge.session
        name = f"judge-donor-{self.stats.runs}"
        session.run.arrive(TraceRequest(name, tuple(prefix), max_tokens=1,
                                        kv_transfer_params=(("max_offload_tokens", 0),)))
        for _ in range(4):
            session.step(len(prefix) + 1)
            check_gaps(session)
            request = session.run.live.get(name)
            if request is None or request.is_finished():
                break
        release_request(judge, session.run.live.get(name))


def _state_of(case: LookupCase, g: int, k: int) -> LookupResult:
    states = case.states.get(g, ()) if isinstance(case.states, dict) else case.states[g]
    return states[k] if k < len(states) else LookupResult.MISS


def _install(session: Any, keys: list[Any], context: Any, answer: LookupResult,
             answers: _KeyAnswers) -> None:
    """Put one chunk's keys (one per vLLM group) into vLLM's manager in ``answer``."""
    if answer is LookupResult.MISS:
        return
    if answer is LookupResult.RETRY:
        answers.retry.update(keys)
        return
    manager = session.manager
    output = manager.prepare_store(keys, context)
    if output is None:
        raise NotRealized("vLLM's offload manager has no room for the case's chunks")
    if answer is LookupResult.HIT:
        manager.complete_store(output.keys_to_store, context)


def _walk(node: _Node, case: LookupCase, judge: JudgeEngine) -> _Run | None:
    group_of = judge.engine.group_of
    while node.query is not None:
        v, k = node.query
        answer = _state_of(case, group_of[v], k).name
        child = node.children.get(answer)
        if child is None:
            return None
        node = child
    for run in node.ended:
        if tuple(_state_of(case, g, k).name for g, k in run.load_keys) == run.load_states:
            return run
    return None


def _insert(root: _Node, run: _Run) -> None:
    node = root
    for v, k, answer in run.lookups:
        if node.query is None and not node.ended:
            node.query = (v, k)
        if node.query != (v, k):
            raise RuntimeError("vLLM looked chunks up in another order for the same "
                               "answers: its lookup is not a function of them")
        node = node.children.setdefault(answer, _Node())
    if node.query is not None:
        raise RuntimeError("vLLM ended a lookup where an earlier run with the same "
                           "answers went on")
    node.ended.append(run)


def _observation(case: LookupCase, run: _Run, judge: JudgeEngine) -> LookupObservation:
    group_of = judge.engine.group_of
    seen: list[tuple[int, int]] = []
    for v, k, _ in run.lookups:
        chunk = (group_of[v], k)
        if chunk not in seen:
            seen.append(chunk)
    load_ranges = {g: (min(chunks), max(chunks) + 1) for g, chunks in run.loads.items()
                   if chunks}
    for g in range(len(case.geometry.groups)):
        load_ranges.setdefault(g, (0, 0))
    return LookupObservation(run.hit_tokens, load_ranges=load_ranges, lookups=seen,
                             error=None if run.raised is None else f"vLLM raised {run.raised}")


__all__ = ["BUDGET_NOTE", "LOCAL_HIT_NOTE", "RETRY_NOTE", "JudgeStats", "LookupJudge",
           "NotRealized"]
