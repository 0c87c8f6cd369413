"""What a campaign mutates and which theorems judge each mutated function.

A target is a set of module sources, read once (a snapshot: the campaign never reads
the files again and never writes them), installed in every child process under their
module names, and the functions of them that are mutated:

* ``--impl reference``: every function of ``impl/reference.py`` and ``impl/scheduler.py``;
* ``--impl VARIANT``: the variant's own functions in ``impl/variants.py`` (and their
  helpers there), the reference functions it still runs, and ``impl/scheduler.py``;
* ``module:FILE.py``: the functions of that file, which stands in for
  ``impl/reference.py`` or ``impl/scheduler.py`` (whichever names it defines): the
  original module runs first and the file's definitions replace its names, so a file
  may hold one patched function or a whole copy.

Which theorems can kill a mutant of a function is read from the static call graph of
the sources: a property exercises the bundle functions it ``uses`` and, for the case
families, the scheduler's drivers its space declares (``CaseSpace.drivers``:
``lookup_complete_chunks`` for the lookup family, ``StoreTracker`` for the store family),
and everything those
call (``impl.f`` / ``self.impl.f`` resolve to the target bundle's function ``f``). A
function no property reaches is judged by every theorem that runs implementation code
("unsure: all clauses").
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields

from kvcontract.proofs.sources import (
    REFERENCE_MODULE,
    SCHEDULER_MODULE,
    CallGraph,
    ImplementationSources,
    Node,
    resolve_sources,
    snapshot,
)
from kvcontract.tools.mutate.operators import MutationPoint, enumerate_points


@dataclass
class Target(ImplementationSources):
    """The modules of one campaign and the functions it mutates (``mutable``)."""

    def points(self, only_functions: Iterable[str] | None = None) -> list[MutationPoint]:
        """Every mutation point, in a deterministic order (module, then source order)."""
        wanted = set(only_functions) if only_functions else None
        points: list[MutationPoint] = []
        for m in self.modules:
            if m.name not in self.mutable:
                continue
            names = self.mutable[m.name]
            only = names if wanted is None else (
                wanted if names is None else names & wanted
            )
            points.extend(enumerate_points(m.source, m.name, m.display, only))
        return points


def resolve_target(spec: str) -> Target:
    """``NAME`` (a registered implementation) or ``module:FILE.py``
    (:func:`~kvcontract.proofs.sources.resolve_sources`); raises UsageError."""
    found = resolve_sources(spec)
    return Target(**{f.name: getattr(found, f.name) for f in fields(found)})


@dataclass(frozen=True)
class Judges:
    """The theorems that can kill mutants of one function."""

    theorems: tuple[str, ...]
    clauses: tuple[str, ...]
    mapped: bool
    """False when no property reaches the function (every theorem runs)."""


def theorem_map(target: Target) -> dict[str, Judges]:
    """Function qualname (per mutated module: ``module:qualname``) -> its judges."""
    from kvcontract.proofs.runner import catalog
    from kvcontract.spec.properties import CaseProperty

    modules = list(target.modules)
    names = {m.name for m in modules}
    for extra in (REFERENCE_MODULE, SCHEDULER_MODULE):
        if extra not in names:  # a module: file stands for one; the other is read too
            modules.append(snapshot(extra))
    graph = CallGraph(modules, target.field_functions)
    theorems = catalog()
    reach: list[set[Node]] = []
    runs_code: list[bool] = []
    for prop in theorems:
        roots: set[Node] = {target.field_functions[u] for u in prop.uses
                            if u in target.field_functions}
        if isinstance(prop, CaseProperty):
            # The scheduler functions the space's observe calls (``CaseSpace.drivers``).
            for pattern in prop.space.drivers:
                roots |= graph.expand(SCHEDULER_MODULE, pattern)
        reach.append(graph.closure(roots))
        runs_code.append(bool(roots))
    every = tuple(t.theorem_id for t, runs in zip(theorems, runs_code, strict=True) if runs)
    mapping: dict[str, Judges] = {}
    for module, chosen in target.mutable.items():
        for qualname in (graph.defined.get(module, set()) if chosen is None else chosen):
            node = (module, qualname)
            ids = tuple(t.theorem_id for t, r in zip(theorems, reach, strict=True) if node in r)
            mapped = bool(ids)
            ids = ids or every
            clauses = sorted({i.split("/", 1)[0] for i in ids}, key=lambda c: int(c[1:]))
            mapping[f"{module}:{qualname}"] = Judges(ids, tuple(clauses), mapped)
    return mapping
