"""Is a surviving mutant equivalent to the original function?

Only shown, never guessed. First the rules read off the source
(:func:`syntactic_equivalence`: any function, methods and drivers included): an
assignment that cannot change a value, a change confined to messages, a flag argument
whose callee reads only its truth value; each a syntactic fact of the mutated function
(and its callee's source in the campaign's snapshot), with a Z3 proof where values are
compared. Then the comparison of the two functions, for a function each of whose
parameters has a known domain (by name: :data:`KINDS`; the multi-group loop's turn
with its scan callback uninterpreted and its flags on the loop's states,
:data:`IMPLIED_FLAGS`); methods and functions of objects (the scheduler's drivers, the
store tracker) do not qualify for it:

1. **Z3**: both functions are lifted with :class:`kvcontract.spec.symbolic.PathExplorer`
   over symbolic integers restricted to the contract's domain (sizes >= 1, windows
   >= 2, token counts and ``e`` >= 0, unbounded above), once per choice of the
   non-integer arguments (None or a number, each flag, each request status, replay
   tuples of length 0-2), and ``original != mutant`` is refuted (deterministic
   ``rlimit``). Unsat for every choice: equivalent, confirmed on a small grid (an
   encoding gap, e.g. a division by zero Z3 leaves unspecified, would show there). A
   model is replayed on ints: a real difference is the distinguishing input.
2. **Grid** (when Z3 cannot lift or decide): every argument tuple of a grid wider than
   the prover's families (sizes 1..9, windows 2..9, ``e`` 0..3, token counts 0..200,
   narrowed to fit :data:`GRID_CAP` evaluations but never below :data:`GRID_FLOOR`);
   the scans are compared on every lookup sequence up to length 7 (the prover's scan
   family stops at 6). A grid that cannot keep its floor shows nothing; a seeded
   sample of it is still searched for a distinguishing input (refutation only).

Exceptions are results: a function that raises where the other returns differs.
"""

from __future__ import annotations

import ast
import copy
import inspect
import itertools
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

SIZE = "size"
WINDOW = "window"
EXTRA = "extra"
TOKENS = "tokens"
OPT_TOKENS = "optional tokens"
ALIGN = "alignment"
INTERVAL = "interval"
FLAG = "flag"
STATUS = "status"
BLOCKS = "block tuple"
LOOKUP = "lookup"
SCAN = "scan callback"
START = "start"
END = "end"

# ``max_hit``, ``num_keys``, ``confirmed``, ``deferred``, ``eagle``, ``mamba`` and ``scan``:
# one group's turn of the multi-group lookup (``multigroup_lookup_step``).
_PARAMETERS_OF_KIND: dict[str, tuple[str, ...]] = {
    SIZE: ("block_size", "blocks_per_chunk", "tokens_per_chunk", "block_tokens",
           "chunk_tokens", "bpc", "b", "initial_window", "window"),
    WINDOW: ("sliding_window",),
    EXTRA: ("extra_retained",),
    TOKENS: ("num_computed_tokens", "num_hit_tokens", "num_local_tokens", "boundary", "hit",
             "local_hit", "num_tokens", "num_scheduled_tokens", "num_computed", "prompt_len",
             "a", "block", "prompt_horizon_chunks", "current_chunks", "segment_tokens",
             "max_hit", "num_keys"),
    OPT_TOKENS: ("final_segment_end_block", "max_offload_tokens"),
    ALIGN: ("alignment_tokens",),
    INTERVAL: ("retention_interval",),
    FLAG: ("use_eagle", "offload_prompt_only", "confirmed", "deferred", "eagle", "mamba"),
    STATUS: ("status",),
    BLOCKS: ("replay_boundary_blocks",),
    LOOKUP: ("lookup",), START: ("start",), END: ("end",), SCAN: ("scan",),
}

KINDS: dict[str, str] = {
    name: kind for kind, names in _PARAMETERS_OF_KIND.items() for name in names
}
"""Parameter name -> its domain (the contract's units, docs/CONTRACT.md section 2). A
``scan`` callback (``scan(start, stop, at, present_view)``, the group's scan in the
multi-group loop's turn) is compared as an uninterpreted function of its arguments: the
same arguments, the same answer (None or an index), whatever the keys hold."""

IMPLIED_FLAGS: tuple[tuple[str, str], ...] = (("deferred", "confirmed"),)
"""``(a, b)``: where a function takes both flags, ``a`` implies ``b`` on every state it
is called in. The multi-group loop's turn is called with "deferred at maxhit" only when
"confirmed at maxhit" (docs/CONTRACT.md 4.6: the invariant ``C6/lookup-step-converges``
proves every turn keeps, from the driver's first state, all flags False, on). A turn
equal to the original's on those states keeps the invariant too (the same outputs), so
the loop over it visits the same states: equal there is equal."""

LOWER = {SIZE: 1, WINDOW: 2, EXTRA: 0, TOKENS: 0, OPT_TOKENS: 0, ALIGN: 1, INTERVAL: 1,
         BLOCKS: 0}

WHOLE_MULTIPLES: tuple[tuple[str, str], ...] = (
    ("num_local_tokens", "block_size"),
    ("local_hit", "block_tokens"),
    ("segment_tokens", "block_tokens"),
)
"""``(a, b)``: where a function has both parameters, ``a`` is a multiple of ``b`` on the
contract's domain (docs/CONTRACT.md 13: a local hit is a GPU prefix hit, whole blocks of
every group; a store segment, ``A`` or a retention interval, is whole blocks wherever the
mask applies). Arguments outside it are never compared: a mutant that differs only there
changes nothing any caller can see."""


FINISHED_STATE: tuple[str, str, str] = ("num_computed_tokens", "num_tokens", "prompt_len")
"""Where a function takes a request's ``status`` and these three counts, a FINISHED
request is in one of the contract's two finished states (docs/CONTRACT.md 9.1, the
hypotheses of ``C10/store-steps-well-formed``): all but the final sampled slot computed
(``num_tokens = num_computed_tokens + 1``, the prompt computed), or an error finish
before the prompt's end (``num_computed_tokens < prompt_len = num_tokens``). vLLM finishes
a request in no other state; arguments outside them are never compared."""


def _finished_state(values: Mapping[str, Any]) -> Any:
    """The finished-state relation over ``values`` (ints or Z3 terms; True when a count
    is missing or the status is not FINISHED)."""
    from kvcontract.spec.arith import and_, or_
    from kvcontract.vocabulary import RequestStatus

    if values.get("status") is not RequestStatus.FINISHED or any(
            values.get(name) is None for name in FINISHED_STATE):
        return True
    computed, tokens, prompt = (values[name] for name in FINISHED_STATE)
    return or_(and_(tokens == computed + 1, computed >= prompt),
               and_(computed < prompt, tokens == prompt))


def _in_domain(kinds: Sequence[tuple[str, str]], args: Sequence[Any]) -> bool:
    values = {name: value for (name, _), value in zip(kinds, args, strict=True)}
    for a, b in WHOLE_MULTIPLES:
        x, y = values.get(a), values.get(b)
        if isinstance(x, int) and isinstance(y, int) and y > 0 and x % y:
            return False
    return bool(_finished_state(values)) and _implied(kinds, args)


def _domain_text(kinds: Sequence[tuple[str, str]]) -> str:
    names = {name for name, _ in kinds}
    kept = [f"{a} a multiple of {b}" for a, b in WHOLE_MULTIPLES if a in names and b in names]
    kept += [f"{a} implies {b} (the loop's invariant)" for a, b in IMPLIED_FLAGS
             if a in names and b in names]
    if {"status", *FINISHED_STATE} <= names:
        kept.append("a finished request all but its final sampled slot computed, or "
                    "finished by an error before its prompt's end")
    kept += [f"{name} uninterpreted" for name, kind in kinds if kind == SCAN]
    return f" ({', '.join(kept)}: the contract's domain)" if kept else ""

Z3_RLIMIT = 5_000_000
"""Per equality query (deterministic)."""
Z3_MAX_CHOICES = 128
GRID_CAP = 1_500_000
"""Most argument tuples a grid compares (both functions run on each)."""
GRID_WIDE = {SIZE: 9, WINDOW: 9, EXTRA: 3, TOKENS: 200}
"""Upper ends of the wide grid (sizes 1..9, windows 2..9, e 0..3, tokens 0..200)."""
GRID_FLOOR = {SIZE: 6, WINDOW: 9, EXTRA: 3, TOKENS: 40}
"""The narrowest grid that may still show equivalence (wider than the prover's
exhaustive families, whose sequences are at most 6-12 chunks)."""
SCAN_LENGTH = 7
SEARCH_SAMPLES = 200_000
"""Seeded samples of the wide grid tried for a difference when it is too big to exhaust."""


@dataclass
class Equivalence:
    """The outcome of one comparison."""

    equivalent: bool | None
    """True: shown equal on the domain; False: a distinguishing input; None: not shown."""
    method: str
    detail: str
    distinguishing_input: dict[str, Any] | None = None
    evaluations: int = 0
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"equivalent": self.equivalent, "method": self.method, "detail": self.detail,
                "distinguishing_input": self.distinguishing_input,
                "evaluations": self.evaluations}


def parameter_kinds(fn: Callable[..., Any]) -> list[tuple[str, str]] | None:
    """``[(name, kind)]`` for every parameter, or None when one has no known domain."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return None
    kinds = []
    for p in params:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) or p.name not in KINDS:
            return None
        kinds.append((p.name, KINDS[p.name]))
    names = [k for _, k in kinds]
    if names.count(SCAN) > 1:
        return None
    if LOOKUP in names and not (START in names and END in names):
        return None
    if (START in names or END in names) and LOOKUP not in names:
        return None
    return kinds


def compare(original: Callable[..., Any], mutant: Callable[..., Any]) -> Equivalence:
    """Z3 first, then the grid (see the module docstring)."""
    kinds = parameter_kinds(original)
    if kinds is None or parameter_kinds(mutant) != kinds:
        return Equivalence(None, "none", "a parameter has no known domain (not shown)")
    if any(k == LOOKUP for _, k in kinds):
        return _scan_grid(original, mutant, kinds)
    outcome = _z3(original, mutant, kinds)
    if outcome.equivalent is False:
        return outcome
    if any(k == SCAN for _, k in kinds):
        # No grid of callbacks: Z3 over the uninterpreted scan decides alone (its
        # domain has every size >= 1, so no division Z3 leaves unspecified).
        return outcome
    if outcome.equivalent is True:
        check = _grid(original, mutant, kinds, sanity=True)
        if check.equivalent is False:
            check.notes.append("Z3 said equal; the grid disagrees (encoding gap)")
            return check
        outcome.evaluations += check.evaluations
        return outcome
    grid = _grid(original, mutant, kinds)
    grid.notes = [*outcome.notes, *grid.notes]
    return grid


# -- concrete runs ----------------------------------------------------------------------
def _run(fn: Callable[..., Any], args: Sequence[Any]) -> tuple[str, Any]:
    try:
        value = fn(*args)
    except Exception as exc:  # a crash is a behaviour too
        return ("raises", type(exc).__name__)
    return ("value", value)


def _same(a: tuple[str, Any], b: tuple[str, Any]) -> bool:
    if a[0] != b[0]:
        return False
    if a[0] == "raises":
        return bool(a[1] == b[1])
    return bool(_normal(a[1]) == _normal(b[1]))


def _normal(value: Any) -> Any:
    if isinstance(value, tuple):
        return tuple(_normal(v) for v in value)
    if isinstance(value, bool):
        return int(value)
    return value


def _describe_args(kinds: Sequence[tuple[str, str]], args: Sequence[Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for (name, _), value in zip(kinds, args, strict=True):
        if isinstance(value, _ModelScan):
            out[name] = repr(value)
        elif isinstance(value, tuple):
            out[name] = list(value)
        elif hasattr(value, "value") and not isinstance(value, (int, bool)):
            out[name] = str(value.value)
        else:
            out[name] = value
    return out


# -- Z3 -----------------------------------------------------------------------------------
def _choices(kind: str) -> list[Any]:
    """The alternatives of one parameter: concrete values, or ``("int", n)``: n fresh
    symbolic integers (a tuple when the kind is a tuple)."""
    from kvcontract.vocabulary import RequestStatus

    if kind in (SIZE, WINDOW, EXTRA, TOKENS):
        return [("int", 1)]
    if kind in (OPT_TOKENS, ALIGN):
        return [None, ("int", 1)]
    if kind == INTERVAL:
        return [None, 0, ("int", 1)]
    if kind == FLAG:
        return [False, True]
    if kind == STATUS:
        return list(RequestStatus)
    if kind == BLOCKS:
        return [(), ("tuple", 1), ("tuple", 2)]
    if kind == SCAN:
        return [("scan", 0)]
    raise ValueError(kind)


def _implied(kinds: Sequence[tuple[str, str]], combo: Sequence[Any]) -> bool:
    """Whether a choice of the flags keeps :data:`IMPLIED_FLAGS`."""
    values = {name: value for (name, _), value in zip(kinds, combo, strict=True)}
    return all(not (values.get(a) is True and values.get(b) is False)
               for a, b in IMPLIED_FLAGS)


class _UninterpretedScan:
    """``scan(start, stop, at, present_view)`` as two uninterpreted functions of the
    arguments: whether it answers (else None) and what; the view is a separate function
    per value (the step passes it as a Python bool)."""

    def __init__(self, name: str) -> None:
        import z3

        ints = [z3.IntSort()] * 3
        self.answers = [z3.Function(f"{name}_answers{v}", *ints, z3.BoolSort()) for v in (0, 1)]
        self.value = [z3.Function(f"{name}_value{v}", *ints, z3.IntSort()) for v in (0, 1)]

    def __call__(self, start: Any, stop: Any, at: Any, present_view: Any) -> Any:
        from kvcontract.spec.symbolic import SymBool, SymInt, _term

        view = 1 if present_view else 0
        args = [_term(start), _term(stop), _term(at)]
        if SymBool(self.answers[view](*args)):
            return SymInt(self.value[view](*args))
        return None


class _ModelScan:
    """A scan answering as a model of :class:`_UninterpretedScan` says (a replay)."""

    def __init__(self, scan: _UninterpretedScan, model: Any) -> None:
        self.scan, self.model = scan, model

    def __call__(self, start: Any, stop: Any, at: Any, present_view: Any) -> Any:
        import z3

        view = 1 if present_view else 0
        args = [z3.IntVal(int(start)), z3.IntVal(int(stop)), z3.IntVal(int(at))]
        if z3.is_true(self.model.eval(self.scan.answers[view](*args), model_completion=True)):
            return self.model.eval(self.scan.value[view](*args),
                                   model_completion=True).as_long()
        return None

    def __repr__(self) -> str:
        return "an uninterpreted scan"


def _z3(original: Callable[..., Any], mutant: Callable[..., Any],
        kinds: Sequence[tuple[str, str]]) -> Equivalence:
    import z3

    from kvcontract.spec.symbolic import LiftError

    alternatives = [_choices(k) for _, k in kinds]
    combos = [c for c in itertools.product(*alternatives) if _implied(kinds, c)]
    if len(combos) > Z3_MAX_CHOICES:
        return Equivalence(None, "z3", f"{len(combos)} argument shapes (not tried)")
    queries = 0
    for combo in combos:
        args: list[Any] = []
        variables: list[tuple[str, Any]] = []
        domain: list[Any] = []
        scans: dict[str, _UninterpretedScan] = {}
        for (name, kind), choice in zip(kinds, combo, strict=True):
            if isinstance(choice, tuple) and choice and choice[0] == "scan":
                scans[name] = _UninterpretedScan(name)
                args.append(scans[name])
            elif isinstance(choice, tuple) and choice and choice[0] in ("int", "tuple"):
                count = choice[1]
                terms = [z3.Int(f"{name}{i}" if choice[0] == "tuple" else name)
                         for i in range(count)]
                domain += [t >= LOWER[kind] for t in terms]
                variables += [(str(t), t) for t in terms]
                args.append(tuple(terms) if choice[0] == "tuple" else terms[0])
            else:
                args.append(choice)
        symbolic = {name: arg for (name, _), arg in zip(kinds, args, strict=True)
                    if isinstance(arg, z3.ArithRef)}
        for multiple, divisor in WHOLE_MULTIPLES:
            if multiple in symbolic and divisor in symbolic:
                domain.append(symbolic[multiple] % symbolic[divisor] == 0)
        finished = _finished_state({name: arg for (name, _), arg in zip(kinds, args,
                                                                        strict=True)})
        if finished is not True:
            domain.append(finished)
        try:
            left, right = _lift(original, args, domain), _lift(mutant, args, domain)
            differ = _differs(left, right)
        except (LiftError, z3.Z3Exception, RecursionError, ZeroDivisionError) as exc:
            return Equivalence(None, "z3", f"cannot lift or compare: {exc}",
                               notes=[f"z3: {exc}"])
        except Exception as exc:  # the mutant raises on a symbolic run
            return Equivalence(None, "z3", f"lifting raised {type(exc).__name__}",
                               notes=[f"z3: {type(exc).__name__}: {exc}"])
        solver = z3.Solver()
        solver.set("rlimit", Z3_RLIMIT)
        solver.add(*domain)
        solver.add(differ)
        verdict = solver.check()
        queries += 1
        if verdict == z3.unsat:
            continue
        if verdict == z3.unknown:
            return Equivalence(None, "z3", f"unknown ({solver.reason_unknown()})",
                               notes=["z3: unknown"])
        model = solver.model()
        concrete = _concrete(kinds, combo, model, scans)
        a, b = _run(original, concrete), _run(mutant, concrete)
        if not _same(a, b):
            return Equivalence(False, "z3", f"differs: original {a[1]!r}, mutant {b[1]!r}",
                               _describe_args(kinds, concrete), queries)
        return Equivalence(None, "z3", "a model that does not replay on ints",
                           notes=["z3: model did not replay"])
    return Equivalence(True, "z3", f"proved equal for all values of the domain "
                       f"({len(combos)} argument shapes){_domain_text(kinds)}",
                       evaluations=queries)


def _lift(fn: Callable[..., Any], args: Sequence[Any], domain: Sequence[Any]) -> Any:
    """Lift without feasibility queries (fast: a dead branch only adds an If), and with
    them when that yields too many paths."""
    from kvcontract.spec.symbolic import LiftError, PathExplorer

    try:
        return PathExplorer(domain).lift(fn, args)
    except LiftError:
        return PathExplorer(domain, prune=True).lift(fn, args)


def _differs(left: Any, right: Any) -> Any:
    import z3

    if isinstance(left, tuple) or isinstance(right, tuple):
        if not (isinstance(left, tuple) and isinstance(right, tuple)) or len(left) != len(right):
            return z3.BoolVal(True)
        return z3.Or(*[_differs(a, b) for a, b in zip(left, right, strict=True)] or
                     [z3.BoolVal(False)])
    if left is None or right is None:
        return z3.BoolVal(left is not right)
    if isinstance(left, z3.BoolRef) != isinstance(right, z3.BoolRef):
        left = z3.If(left, 1, 0) if isinstance(left, z3.BoolRef) else left
        right = z3.If(right, 1, 0) if isinstance(right, z3.BoolRef) else right
    return left != right


def _concrete(kinds: Sequence[tuple[str, str]], combo: Sequence[Any], model: Any,
              scans: dict[str, _UninterpretedScan] | None = None) -> list[Any]:
    import z3

    def value(name: str, kind: str) -> int:
        term = model.eval(z3.Int(name), model_completion=True)
        return max(int(term.as_long()), LOWER[kind])

    args: list[Any] = []
    for (name, kind), choice in zip(kinds, combo, strict=True):
        if isinstance(choice, tuple) and choice and choice[0] == "scan":
            args.append(_ModelScan((scans or {})[name], model))
        elif isinstance(choice, tuple) and choice and choice[0] == "int":
            args.append(value(name, kind))
        elif isinstance(choice, tuple) and choice and choice[0] == "tuple":
            args.append(tuple(value(f"{name}{i}", kind) for i in range(choice[1])))
        else:
            args.append(choice)
    return args


# -- grids ----------------------------------------------------------------------------
def _values(kind: str, top: dict[str, int], sanity: bool) -> list[Any]:
    from kvcontract.vocabulary import RequestStatus

    size = range(1, top[SIZE] + 1)
    tokens = range(0, top[TOKENS] + 1)
    if kind == SIZE:
        return list(size)
    if kind == WINDOW:
        return list(range(2, top[WINDOW] + 1))
    if kind == EXTRA:
        return list(range(0, top[EXTRA] + 1))
    if kind == TOKENS:
        return list(tokens)
    if kind == OPT_TOKENS:
        return [None, *tokens]
    if kind == ALIGN:
        return [None, *range(1, top[TOKENS] + 1)]
    if kind == INTERVAL:
        return [None, 0, *range(1, top[TOKENS] + 1)]
    if kind == FLAG:
        return [False, True]
    if kind == STATUS:
        return list(RequestStatus)
    if kind == BLOCKS:
        short = range(0, min(top[TOKENS], 12) + 1)
        return [(), *((b,) for b in short)] + (
            [] if sanity else [(a, b) for a in range(0, 6) for b in range(a, 9)]
        )
    raise ValueError(kind)


def _grid_plan(kinds: Sequence[tuple[str, str]], sanity: bool
               ) -> tuple[dict[str, int], list[list[Any]]] | None:
    token_params = sum(1 for _, k in kinds if k in (TOKENS, OPT_TOKENS, ALIGN, INTERVAL))
    top = dict(GRID_WIDE) if not sanity else {SIZE: 5, WINDOW: 6, EXTRA: 2, TOKENS: 12}
    floor = dict(GRID_FLOOR) if not sanity else dict(top)
    if token_params > 1 and not sanity:
        top[TOKENS] = 64
    while True:
        values = [_values(k, top, sanity) for _, k in kinds]
        total = 1
        for v in values:
            total *= len(v)
        if total <= GRID_CAP:
            return top, values
        # Narrow the widest dimension that is still above its floor.
        shrinkable = [k for k in (TOKENS, SIZE, EXTRA, WINDOW) if top[k] > floor[k]]
        if not shrinkable:
            return None
        kind = shrinkable[0]
        top[kind] = max(floor[kind], top[kind] * 3 // 4)


def _grid_text(kinds: Sequence[tuple[str, str]], top: dict[str, int]) -> str:
    used = {k for _, k in kinds}
    parts = []
    if SIZE in used:
        parts.append(f"sizes 1..{top[SIZE]}")
    if WINDOW in used:
        parts.append(f"windows 2..{top[WINDOW]}")
    if EXTRA in used:
        parts.append(f"e 0..{top[EXTRA]}")
    if used & {TOKENS, OPT_TOKENS, ALIGN, INTERVAL}:
        parts.append(f"token counts 0..{top[TOKENS]}")
    if used & {OPT_TOKENS, ALIGN, INTERVAL}:
        parts.append("None")
    if FLAG in used:
        parts.append("both flags")
    if STATUS in used:
        parts.append("every status")
    if BLOCKS in used:
        parts.append("replay tuples of length 0-2")
    return ", ".join(parts)


def _grid(original: Callable[..., Any], mutant: Callable[..., Any],
          kinds: Sequence[tuple[str, str]], sanity: bool = False) -> Equivalence:
    plan = _grid_plan(kinds, sanity)
    if plan is None:
        if sanity:
            return Equivalence(None, "grid", "no sanity grid (too many arguments)")
        found = _search(original, mutant, kinds)
        if found is not None:
            return found
        return Equivalence(None, "grid", f"the grid would exceed {GRID_CAP:,} tuples even at "
                           f"its floor, and {SEARCH_SAMPLES:,} sampled tuples found no "
                           "difference (not shown)", evaluations=SEARCH_SAMPLES)
    top, values = plan
    count = 0
    for args in itertools.product(*values):
        if not _in_domain(kinds, args):
            continue
        count += 1
        a, b = _run(original, args), _run(mutant, args)
        if not _same(a, b):
            return Equivalence(False, "grid", f"differs: original {a[1]!r}, mutant {b[1]!r}",
                               _describe_args(kinds, args), count)
    return Equivalence(True, "grid", f"equal on every argument tuple of {_grid_text(kinds, top)}"
                       f"{_domain_text(kinds)} ({count:,} tuples)", evaluations=count)


def _search(original: Callable[..., Any], mutant: Callable[..., Any],
            kinds: Sequence[tuple[str, str]]) -> Equivalence | None:
    """Refutation only: a seeded sample of the wide grid (a difference found is real; no
    difference shows nothing)."""
    import random

    values = [_values(k, dict(GRID_FLOOR), sanity=False) for _, k in kinds]
    sizes = [len(v) for v in values]
    rng = random.Random(0)
    total = 1
    for n in sizes:
        total *= n
    for count in range(1, SEARCH_SAMPLES + 1):
        index = rng.randrange(total)
        args = []
        for v, n in zip(values, sizes, strict=True):
            index, digit = divmod(index, n)
            args.append(v[digit])
        if not _in_domain(kinds, args):
            continue
        a, b = _run(original, args), _run(mutant, args)
        if not _same(a, b):
            return Equivalence(False, "sample", f"differs: original {a[1]!r}, mutant {b[1]!r}",
                               _describe_args(kinds, args), count)
    return None


def _sequences(max_length: int) -> Iterator[tuple[Any, ...]]:
    from kvcontract.vocabulary import LookupResult

    results = list(LookupResult)
    for length in range(max_length + 1):
        yield from itertools.product(results, repeat=length)


def _scan_grid(original: Callable[..., Any], mutant: Callable[..., Any],
               kinds: Sequence[tuple[str, str]]) -> Equivalence:
    """The scans: every lookup sequence up to :data:`SCAN_LENGTH`, start 0 and 2, every
    window pair up to 4."""
    from kvcontract.vocabulary import LookupResult

    others = [(n, k) for n, k in kinds if k not in (LOOKUP, START, END)]
    if any(k != SIZE for _, k in others):
        return Equivalence(None, "grid", "scan with parameters of unknown domain")
    count = 0
    for seq in _sequences(SCAN_LENGTH):
        for start in (0, 2):
            def lookup(idx: int, seq: tuple[Any, ...] = seq, start: int = start) -> Any:
                k = idx - start
                return seq[k] if 0 <= k < len(seq) else LookupResult.MISS

            for extra in itertools.product(range(1, 5), repeat=len(others)):
                it = iter(extra)
                args: list[Any] = []
                for _, kind in kinds:
                    if kind == LOOKUP:
                        args.append(lookup)
                    elif kind == START:
                        args.append(start)
                    elif kind == END:
                        args.append(start + len(seq))
                    else:
                        args.append(next(it))
                count += 1
                a, b = _run(original, args), _run(mutant, args)
                if not _same(a, b):
                    shown = {"sequence": [r.name for r in seq], "start": start,
                             **{n: v for (n, _), v in zip(others, extra, strict=True)}}
                    return Equivalence(False, "grid",
                                       f"differs: original {a[1]!r}, mutant {b[1]!r}",
                                       shown, count)
    return Equivalence(True, "grid", f"equal on every lookup sequence up to length "
                       f"{SCAN_LENGTH} (start 0 and 2, windows 1..4) ({count:,} runs)",
                       evaluations=count)


# -- rules read off the source (no run) ---------------------------------------------------
# A survivor whose change the source itself shows to be invisible: an assignment that
# cannot change a value, a value that only reaches a message, an argument whose callee
# reads only its truth value. Each rule is a syntactic fact about the mutated function
# (and, for an argument, its callee's source in the campaign's snapshot) plus, where
# values are compared, a Z3 proof; none runs the code. They hold for the integer code
# the operators mutate (ints and flags: ``<`` and ``<=`` differ only at equality).

MESSAGE_FIELDS: dict[str, frozenset[str]] = {
    "LookupOutcome": frozenset({"reason"}),
    "StoreTracker": frozenset({"unstorable"}),
}
"""Fields (class -> attributes) that are reports for people, never behaviour: a lookup's
``reason`` (why it deferred or answered the local hit) and the chunks a store step found
unstorable (C10 judges what is offered, never this self-report: docs/CONTRACT.md, C9).
Setting one, or adding to one, is a message. Nothing the contract observes reads them
(no observation, judge, monitor or system code: ``tests/tools/test_mutate.py`` scans
the package); the object's class is read off the source (``self`` in a method of the
class, or a local bound once to ``Class(...)``)."""

UPDATE_METHODS: frozenset[str] = frozenset({"add", "append", "extend", "update", "discard"})
"""Methods that add to a collection: called on a message field, they are messages too."""

LOGGING_CALLS: frozenset[str] = frozenset({
    "debug", "info", "warning", "warn", "error", "exception", "critical", "log", "print",
})
"""Calls whose arguments are messages: ``print(...)``, ``logger.info(...)``,
``warnings.warn(...)`` (the called name, or the attribute called)."""

_TOTAL = (ast.Name, ast.Constant, ast.Attribute, ast.BoolOp, ast.Compare, ast.IfExp,
          ast.JoinedStr, ast.FormattedValue, ast.Tuple, ast.Load, ast.boolop, ast.cmpop,
          ast.unaryop)
"""Expressions whose evaluation cannot raise on integers and flags (no call, no index,
no division: ``+``, ``-``, ``*`` and the unary operators are checked apart)."""
_TOTAL_BINOPS = (ast.Add, ast.Sub, ast.Mult)
_GENERATOR_CONSUMERS = frozenset({
    "extend", "list", "tuple", "set", "sorted", "any", "all", "sum", "min", "max", "frozenset",
})
"""Callees that exhaust a generator argument at once (it cannot outlive the call)."""


@dataclass(frozen=True)
class SourceIndex:
    """The sources a rule may read besides the mutated function's: the campaign's module
    snapshots (``module -> (source, base_source)``) and which function each bundle field
    holds (``field -> (module, qualname)``, :attr:`Target.field_functions`)."""

    modules: dict[str, tuple[str, str | None]]
    fields: dict[str, tuple[str, str]]

    def function(self, module: str, qualname: str
                 ) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
        """The definition of ``module.qualname`` in the snapshot (an overlay file's own
        definition first, then its base's)."""
        from kvcontract.proofs.sources import functions

        entry = self.modules.get(module)
        if entry is None:
            return None
        for text in entry:
            if text is None:
                continue
            found = dict(functions(ast.parse(text))).get(qualname)
            if found is not None:
                return found
        return None


def syntactic_equivalence(source: str, point: Any, index: SourceIndex | None = None
                          ) -> Equivalence | None:
    """An :class:`Equivalence` shown from the source (method ``syntactic``), or None when
    no rule applies. ``source`` is the text the point was enumerated from."""
    from kvcontract.tools.mutate.operators import locate

    try:
        found = locate(source, point)
    except (ValueError, SyntaxError):
        return None
    parents = {id(child): parent for parent in ast.walk(found.tree)
               for child in ast.iter_child_nodes(parent)}
    for rule in (_idempotent_assignment, _message_only, _message_branch, _flag_argument,
                 _unread_argument):
        detail = rule(found, parents, index)
        if detail is not None:
            return Equivalence(True, "syntactic", detail)
    return None


def _dump(node: ast.AST) -> str:
    return ast.dump(node, annotate_fields=False, include_attributes=False)


def _is_total(node: ast.AST) -> bool:
    """Evaluating ``node`` cannot raise (on integers and flags) and has no effect."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.BinOp):
            if not isinstance(sub.op, _TOTAL_BINOPS):
                return False
        elif isinstance(sub, ast.UnaryOp):
            continue
        elif isinstance(sub, ast.FormattedValue):
            if sub.format_spec is not None:
                return False
        elif isinstance(sub, ast.operator):
            continue
        elif not isinstance(sub, _TOTAL):
            return False
    return True


def _statement(node: ast.AST, parents: dict[int, ast.AST]) -> ast.stmt | None:
    current: ast.AST | None = node
    while current is not None and not isinstance(current, ast.stmt):
        current = parents.get(id(current))
    return current


def _within(node: ast.AST, root: ast.AST | None) -> bool:
    return root is not None and any(sub is node for sub in ast.walk(root))


# (a) an assignment that cannot change a value ------------------------------------------
_STRICTNESS = ({ast.Lt, ast.LtE}, {ast.Gt, ast.GtE})


def _idempotent_assignment(found: Any, parents: dict[int, ast.AST],
                           index: SourceIndex | None) -> str | None:
    """``if y > x: x = y`` with ``>`` turned ``>=`` (or back, or ``<``/``<=``), the
    comparison being the whole test or one conjunct of an ``and``: the two tests differ
    only where ``x == y``, where assigning ``y`` to ``x`` leaves ``x``'s value as it was
    (``y`` is re-evaluated without effect: names, constants, attributes and ``+ - *``)."""
    node, new = found.node, found.replacement
    if not (isinstance(node, ast.Compare) and isinstance(new, ast.Compare)
            and len(node.ops) == 1 and len(new.ops) == 1):
        return None
    if {type(node.ops[0]), type(new.ops[0])} not in _STRICTNESS:
        return None
    guard = parents.get(id(node))
    test: ast.AST = node
    if isinstance(guard, ast.BoolOp) and isinstance(guard.op, ast.And):
        # One conjunct of the test: the others are the same code in both; those after
        # it run in one form and not the other at equality, so they must be total.
        later = guard.values[[id(v) for v in guard.values].index(id(node)) + 1:]
        if not all(_is_total(v) for v in later):
            return None
        test, guard = guard, parents.get(id(guard))
    if not isinstance(guard, ast.If) or guard.test is not test or guard.orelse:
        return None
    if len(guard.body) != 1 or not isinstance(guard.body[0], ast.Assign):
        return None
    assign = guard.body[0]
    if len(assign.targets) != 1 or not isinstance(assign.targets[0], ast.Name):
        return None
    target = assign.targets[0].id
    operands = {_dump(node.left), _dump(node.comparators[0])}
    if operands != {_dump(ast.Name(id=target, ctx=ast.Load())), _dump(assign.value)}:
        return None
    if not _is_total(assign.value):
        return None
    shown = ast.unparse(assign.value)
    return (f"idempotent assignment: `{ast.unparse(node)}` and `{ast.unparse(new)}` differ "
            f"only where {target} == {shown}, where `{target} = {shown}` leaves {target} "
            "as it was (a syntactic fact; integers)")


# (b) differences confined to messages ----------------------------------------------------
def _message_field(target: ast.expr, found: Any) -> bool:
    """``target`` is ``obj.attr`` for a declared message field (:data:`MESSAGE_FIELDS`)."""
    if not (isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name)):
        return False
    owner = target.value.id
    if owner == "self" and "." in found.qualname:
        cls_name: str | None = found.qualname.split(".")[0]
    else:
        cls = _class_of(owner, found.function, found.tree)
        cls_name = None if cls is None else cls.name
    return cls_name is not None and target.attr in MESSAGE_FIELDS.get(cls_name, frozenset())


def _call_name(call: ast.Call) -> str | None:
    func = call.func
    return func.id if isinstance(func, ast.Name) else (
        func.attr if isinstance(func, ast.Attribute) else None)


def _arguments(call: ast.Call) -> ast.Tuple:
    return ast.Tuple(elts=[*call.args, *(k.value for k in call.keywords)], ctx=ast.Load())


def _message_part(stmt: ast.stmt, found: Any) -> ast.AST | None:
    """The part of ``stmt`` that is only a message: the arguments of the exception a
    ``raise`` builds, an ``assert``'s message, a logging call's arguments, the value set
    to (or added to) a message field (:data:`MESSAGE_FIELDS`)."""
    if isinstance(stmt, ast.Raise) and isinstance(stmt.exc, ast.Call):
        return _arguments(stmt.exc)
    if isinstance(stmt, ast.Assert):
        return stmt.msg
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
        call = stmt.value
        if _call_name(call) in LOGGING_CALLS:
            return _arguments(call)
        if (isinstance(call.func, ast.Attribute) and call.func.attr in UPDATE_METHODS
                and _message_field(call.func.value, found)):
            return _arguments(call)
    if isinstance(stmt, (ast.Assign, ast.AnnAssign)):
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
        if len(targets) == 1 and _message_field(targets[0], found):
            return stmt.value
    return None


def _is_message_statement(stmt: ast.stmt, found: Any) -> bool:
    """``stmt`` does nothing but write a message (never a ``raise`` or ``assert``: those
    change the control flow), and writing it cannot raise."""
    if isinstance(stmt, (ast.Raise, ast.Assert)):
        return False
    part = _message_part(stmt, found)
    return part is not None and _is_total(part)


def _message_only(found: Any, parents: dict[int, ast.AST],
                  index: SourceIndex | None) -> str | None:
    """The change lies in a message (:func:`_message_part`), or in the value of a local
    name that only messages read before the block returns or raises; and the changed
    expression raises exactly where the original does (:func:`_raises_alike`)."""
    node = found.node
    stmt = _statement(node, parents)
    if stmt is None:
        return None
    message = _message_part(stmt, found)
    if _within(node, message):
        why = _raises_alike(found, parents, message)
        if why is None:
            return None
        return (f"message only: the change is in the message of `{_head(stmt)}` ({why}; "
                "a syntactic fact)")
    if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
            and isinstance(stmt.targets[0], ast.Name) and _within(node, stmt.value)):
        return None
    name = stmt.targets[0].id
    flow = _flows_only_to_messages(name, stmt, parents, found)
    if flow is None:
        return None
    why = _raises_alike(found, parents, stmt.value)
    if why is None:
        return None
    return (f"message only: `{name}` is read only by {flow} before the block ends ({why}; "
            "a syntactic fact)")


def _message_branch(found: Any, parents: dict[int, ast.AST],
                    index: SourceIndex | None) -> str | None:
    """The change is in the test of an ``if`` whose branches only write messages
    (:func:`_is_message_statement`): it decides whether a message is written, nothing
    else; and the test raises in neither form (:func:`_is_total`)."""
    node = found.node
    guard = _guarding_if(node, parents)
    if guard is None:
        return None
    branches = [*guard.body, *guard.orelse]
    if not all(_is_message_statement(stmt, found) for stmt in branches):
        return None
    changed = _replaced(guard.test, node, found.replacement)
    if not (_is_total(guard.test) and _is_total(changed)):
        return None
    return (f"message only: `if {ast.unparse(guard.test)}` guards only "
            + ", ".join(f"`{_head(stmt)}`" for stmt in branches)
            + " (a message; the test cannot raise: a syntactic fact)")


def _head(stmt: ast.stmt) -> str:
    return ast.unparse(stmt).splitlines()[0][:60]


def _flows_only_to_messages(name: str, stmt: ast.stmt, parents: dict[int, ast.AST],
                            found: Any) -> str | None:
    """Where the value bound by ``stmt`` can be read: the statements after it in its
    block, which must end the function (``return``/``raise``, no ``break``/``continue``,
    no generator), read ``name`` only in messages and not bind it again; and no nested
    scope of the function may capture ``name`` (a closure would read it later)."""
    block = _block_of(stmt, parents)
    if block is None:
        return None
    rest = block[block.index(stmt) + 1:]
    if not rest or not isinstance(rest[-1], (ast.Return, ast.Raise)):
        return None
    readers: list[str] = []
    for later in rest:
        for sub in ast.walk(later):
            if isinstance(sub, (ast.Break, ast.Continue, ast.Yield, ast.YieldFrom, ast.Await,
                                ast.Global, ast.Nonlocal)):
                return None
            if isinstance(sub, ast.Name) and sub.id == name:
                if not isinstance(sub.ctx, ast.Load):
                    return None
                holder = _statement(sub, parents)
                if holder is None or not _within(sub, _message_part(holder, found)):
                    return None
                readers.append(_head(holder))
    if not readers or _captured(name, found.function, parents):
        return None
    return ", ".join(f"`{r}`" for r in dict.fromkeys(readers))


def _block_of(stmt: ast.stmt, parents: dict[int, ast.AST]) -> list[ast.stmt] | None:
    parent = parents.get(id(stmt))
    if parent is None:
        return None
    for field_name in ("body", "orelse", "finalbody", "handlers"):
        block = getattr(parent, field_name, None)
        if isinstance(block, list) and any(s is stmt for s in block):
            return block
    return None


def _captured(name: str, fn: ast.AST, parents: dict[int, ast.AST]) -> bool:
    """Whether a nested scope of ``fn`` reads ``name`` as a free variable, so that it may
    read the binding later than its statement: a nested function or lambda, or a
    generator expression that is not exhausted at once (the sole argument of a consumer,
    :data:`_GENERATOR_CONSUMERS`); list, set and dict comprehensions run at once. A
    scope that binds ``name`` itself (a parameter, an assignment, a loop target) reads
    its own."""
    for sub in ast.walk(fn):
        if sub is fn or not isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef,
                                             ast.Lambda, ast.GeneratorExp)):
            continue
        if not _free_in(name, sub):
            continue
        if isinstance(sub, ast.GeneratorExp):
            call = parents.get(id(sub))
            callee = None
            if isinstance(call, ast.Call) and call.args == [sub] and not call.keywords:
                func = call.func
                callee = func.id if isinstance(func, ast.Name) else (
                    func.attr if isinstance(func, ast.Attribute) else None)
            if callee in _GENERATOR_CONSUMERS:
                continue
        return True
    return False


def _free_in(name: str, scope: ast.AST) -> bool:
    """``name`` is read in ``scope`` and not bound there (Python makes a name bound
    anywhere in a scope local to all of it)."""
    bound: set[str] = set()
    if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
        args = scope.args
        bound |= {a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)}
        bound |= {a.arg for a in (args.vararg, args.kwarg) if a is not None}
    read = False
    for sub in ast.walk(scope):
        if isinstance(sub, ast.Name) and sub.id == name:
            if isinstance(sub.ctx, ast.Load):
                read = True
            else:
                bound.add(name)
    return read and name not in bound


def _raises_alike(found: Any, parents: dict[int, ast.AST], root: ast.AST | None
                  ) -> str | None:
    """Why the original and the changed ``root`` raise in the same cases, or None.

    Either both are total (:func:`_is_total`: no call, index or division), or the change
    is the index of a subscript whose object's declared type is a tuple of fixed length
    ``n`` with both indices in ``[-n, n)``: the object is evaluated alike (the same
    code), and neither index leaves it (the declared types are what mypy checks)."""
    if root is None:
        return None
    node, new = found.node, found.replacement
    if _is_total(root) and _is_total(new):
        return "no operation in it can raise"
    subscript = parents.get(id(node))
    if not (isinstance(subscript, ast.Subscript) and subscript.slice is node
            and isinstance(node, ast.Constant) and isinstance(new, ast.Constant)
            and type(node.value) is int and type(new.value) is int):
        return None
    declared = _declared_type(subscript.value, found.function, found.tree)
    length = _tuple_length(declared)
    if declared is None or length is None or not all(
            -length <= k < length for k in (node.value, new.value)):
        return None
    return (f"`{ast.unparse(subscript.value)}` is declared `{ast.unparse(declared)}`: "
            f"indices {node.value} and {new.value} are both within it")


def _tuple_length(declared: ast.expr | None) -> int | None:
    """``n`` for a declared ``tuple[A1, ..., An]`` (not ``tuple[A, ...]``)."""
    if not (isinstance(declared, ast.Subscript) and isinstance(declared.value, ast.Name)
            and declared.value.id in ("tuple", "Tuple")):
        return None
    items = declared.slice.elts if isinstance(declared.slice, ast.Tuple) else [declared.slice]
    if any(isinstance(i, ast.Constant) and i.value is Ellipsis for i in items):
        return None
    return len(items)


def _declared_type(expr: ast.expr, fn: ast.FunctionDef | ast.AsyncFunctionDef,
                   tree: ast.Module) -> ast.expr | None:
    """The declared type of ``expr`` from the module's annotations: ``v.attr`` of a local
    ``v`` bound once to ``C(...)`` (or a parameter annotated ``C``) for a class ``C`` of
    the module whose body annotates ``attr``; an element of a declared ``list[X]``,
    ``Sequence[X]`` or fixed tuple. None when any step is not declared."""
    if isinstance(expr, ast.Subscript):
        outer = _declared_type(expr.value, fn, tree)
        if not (isinstance(outer, ast.Subscript) and isinstance(outer.value, ast.Name)):
            return None
        if outer.value.id in ("list", "List", "Sequence", "MutableSequence"):
            return outer.slice
        length = _tuple_length(outer)
        if (length is not None and isinstance(expr.slice, ast.Constant)
                and type(expr.slice.value) is int and -length <= expr.slice.value < length):
            items = outer.slice.elts if isinstance(outer.slice, ast.Tuple) else [outer.slice]
            return items[expr.slice.value]
        return None
    if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name):
        cls = _class_of(expr.value.id, fn, tree)
        if cls is None:
            return None
        for item in cls.body:
            if (isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
                    and item.target.id == expr.attr):
                return item.annotation
    return None


def _class_of(name: str, fn: ast.FunctionDef | ast.AsyncFunctionDef, tree: ast.Module
              ) -> ast.ClassDef | None:
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    for arg in (*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs):
        if arg.arg == name:
            ann = arg.annotation
            return classes.get(ann.id) if isinstance(ann, ast.Name) else None
    bindings = [n for n in ast.walk(fn)
                if isinstance(n, ast.Name) and n.id == name and not isinstance(n.ctx, ast.Load)]
    if len(bindings) != 1:
        return None
    assigns = [n for n in ast.walk(fn) if isinstance(n, ast.Assign)
               and any(t is bindings[0] for t in n.targets)]
    if len(assigns) != 1 or len(assigns[0].targets) != 1:
        return None
    value = assigns[0].value
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name):
        return classes.get(value.func.id)
    return None


# (c) an argument whose callee reads only its truth value ---------------------------------
def _flag_argument(found: Any, parents: dict[int, ast.AST],
                   index: SourceIndex | None) -> str | None:
    """The change is inside an argument of a call to a function of the snapshot (a
    bundle field ``impl.f`` / ``self.impl.f``, or a function of the same module) whose
    parameter is read only as a truth value (the test of an ``if``, a conditional
    expression, ``while``, ``assert``, under ``not``/``and``/``or`` there); and Z3 proves
    that the original and the changed argument have the same truth value for every
    truth value of the names in it (which the argument reads only as truth values)."""
    if index is None:
        return None
    node = found.node
    argument, call = None, None
    current: ast.AST = node
    while True:
        parent = parents.get(id(current))
        if parent is None or isinstance(parent, ast.stmt):
            return None
        if isinstance(parent, ast.Call) and (
                any(a is current for a in parent.args)
                or any(k.value is current for k in parent.keywords)):
            argument, call = current, parent
            break
        current = parent
    callee = _resolve_callee(call.func, found, index)
    if callee is None:
        return None
    module, qualname, fn = callee
    parameter = _parameter_for(call, argument, fn)
    if parameter is None or not _read_only_as_truth(parameter, fn):
        return None
    changed = _replaced(argument, node, found.replacement)
    if not _same_truth(argument, changed):
        return None
    return (f"flag argument: {qualname} ({module}) reads its parameter `{parameter}` only "
            f"as a truth value, and `{ast.unparse(argument)}` and `{ast.unparse(changed)}` "
            "have the same truth value for every value of the names in them (Z3)")


# (d) a value only parameters the target never reads receive ----------------------------
_BINDINGS = (ast.Assign, ast.AugAssign, ast.AnnAssign)


def _bound_name(stmt: ast.stmt) -> str | None:
    """The one local name a plain binding statement binds (``x = e``, ``x += e``,
    ``x: T = e``), or None."""
    if isinstance(stmt, ast.Assign):
        targets = stmt.targets
        return targets[0].id if len(targets) == 1 and isinstance(targets[0], ast.Name) else None
    if isinstance(stmt, (ast.AugAssign, ast.AnnAssign)) and isinstance(stmt.target, ast.Name):
        return None if stmt.value is None else stmt.target.id
    return None


def _guarding_if(node: ast.AST, parents: dict[int, ast.AST]) -> ast.If | None:
    """The ``if`` whose test holds ``node`` (no other statement between them), or None."""
    current: ast.AST = node
    while True:
        parent = parents.get(id(current))
        if parent is None or (isinstance(parent, ast.stmt) and not isinstance(parent, ast.If)):
            return None
        if isinstance(parent, ast.If):
            return parent if parent.test is current else None
        current = parent


def _binding_guard(node: ast.AST, parents: dict[int, ast.AST]) -> ast.If | None:
    """The ``if`` whose test holds ``node``, when it has no ``else`` and its body only
    binds local names (:func:`_bound_name`)."""
    guard = _guarding_if(node, parents)
    if guard is None or guard.orelse:
        return None
    return guard if all(_bound_name(stmt) is not None for stmt in guard.body) else None


def _unread_parameter(use: ast.Name, parents: dict[int, ast.AST], found: Any,
                      index: SourceIndex) -> str | None:
    """``callee(parameter)`` when ``use`` is itself an argument of a call to a function of
    the snapshot whose definition never reads that parameter, else None."""
    call = parents.get(id(use))
    if not (isinstance(call, ast.Call) and (any(a is use for a in call.args)
                                            or any(k.value is use for k in call.keywords))):
        return None
    callee = _resolve_callee(call.func, found, index)
    if callee is None:
        return None
    _, qualname, fn = callee
    parameter = _parameter_for(call, use, fn)
    if parameter is None or any(
            isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
            and n.func.id in ("locals", "vars", "eval", "exec") for n in ast.walk(fn)):
        return None
    if any(isinstance(n, ast.Name) and n.id == parameter for n in ast.walk(fn)):
        return None
    return f"{qualname}({parameter})"


def _unread_argument(found: Any, parents: dict[int, ast.AST],
                     index: SourceIndex | None) -> str | None:
    """The change is in the value of a plain binding of a local name, or in the test of
    an ``if`` whose body only binds local names; and every read of every name such a
    change can reach is either another such binding (whose value is total, or a test
    that is) or, by itself, an argument of a call to a function of the snapshot (a
    bundle field of the campaign's target, or a function of the same module) whose
    definition never reads that parameter; no nested scope captures those names; and
    the changed expression raises exactly where the original does. The values differ,
    and only where the target never looks (e.g. the null count a placement driver hands
    an implementation whose slot ignores it)."""
    if index is None:
        return None
    node, function = found.node, found.function
    stmt = _statement(node, parents)
    if stmt is None:
        return None
    guard = _binding_guard(node, parents)
    root: ast.AST | None
    if guard is not None:
        root, reached = guard.test, {_bound_name(s) for s in guard.body}
    elif (isinstance(stmt, _BINDINGS) and _bound_name(stmt) is not None
          and _within(node, stmt.value)):
        root, reached = stmt.value, {_bound_name(stmt)}
    else:
        return None
    why = _raises_alike(found, parents, root)
    if why is None:
        return None
    if any(isinstance(n, (ast.Global, ast.Nonlocal)) for n in ast.walk(function)):
        return None
    names: set[str] = {n for n in reached if n is not None}
    receivers: list[str] = []
    frontier = list(names)
    while frontier:
        name = frontier.pop()
        if _captured(name, function, parents):
            return None
        for use in ast.walk(function):
            if not (isinstance(use, ast.Name) and use.id == name
                    and isinstance(use.ctx, ast.Load)):
                continue
            receiver = _unread_parameter(use, parents, found, index)
            if receiver is not None:
                receivers.append(receiver)
                continue
            holder = _statement(use, parents)
            tested = _binding_guard(use, parents)
            if tested is not None and _is_total(tested.test):
                bound = {_bound_name(s) for s in tested.body}
            elif (isinstance(holder, _BINDINGS) and _bound_name(holder) is not None
                  and holder.value is not None and _is_total(holder.value)
                  and _within(use, holder.value)):
                bound = {_bound_name(holder)}
            else:
                return None
            for more in bound:
                if more is not None and more not in names:
                    names.add(more)
                    frontier.append(more)
    if not receivers:
        return None
    shown = ", ".join(f"`{n}`" for n in sorted(names))
    read_by = ", ".join(dict.fromkeys(receivers))
    return (f"unread argument: {shown} reach(es) only {read_by}, a parameter the target's "
            f"definition never reads ({why}; a syntactic fact)")


def _resolve_callee(func: ast.expr, found: Any, index: SourceIndex
                    ) -> tuple[str, str, ast.FunctionDef | ast.AsyncFunctionDef] | None:
    from kvcontract.proofs.sources import functions, is_impl_reference

    if isinstance(func, ast.Attribute) and is_impl_reference(func.value):
        where = index.fields.get(func.attr)
        if where is None:
            return None
        fn = index.function(*where)
        return None if fn is None else (where[0], where[1], fn)
    if isinstance(func, ast.Name):
        own = dict(functions(found.tree)).get(func.id)
        if own is not None and own is not found.function:
            return "this module", func.id, own
    return None


def _parameter_for(call: ast.Call, argument: ast.AST,
                   fn: ast.FunctionDef | ast.AsyncFunctionDef) -> str | None:
    if any(isinstance(a, ast.Starred) for a in call.args) or any(
            k.arg is None for k in call.keywords):
        return None
    positional = [*fn.args.posonlyargs, *fn.args.args]
    for i, a in enumerate(call.args):
        if a is argument:
            return positional[i].arg if i < len(positional) else None
    for k in call.keywords:
        if k.value is argument:
            names = {a.arg for a in (*positional, *fn.args.kwonlyargs)}
            return k.arg if k.arg in names else None
    return None


def _truth_positions(root: ast.AST) -> set[int]:
    """Ids of the nodes of ``root`` whose value is used only as a truth value."""
    marked: set[int] = set()
    stack: list[ast.AST] = []
    for sub in ast.walk(root):
        if isinstance(sub, (ast.If, ast.IfExp, ast.While, ast.Assert)):
            stack.append(sub.test)
        elif isinstance(sub, ast.comprehension):
            stack.extend(sub.ifs)
    while stack:
        test = stack.pop()
        marked.add(id(test))
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            stack.append(test.operand)
        elif isinstance(test, ast.BoolOp):
            stack.extend(test.values)
    return marked


def _read_only_as_truth(parameter: str, fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    uses = [n for n in ast.walk(fn) if isinstance(n, ast.Name) and n.id == parameter]
    if any(isinstance(n, (ast.Global, ast.Nonlocal)) for n in ast.walk(fn)):
        return False
    if any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
           and n.func.id in ("locals", "vars", "eval", "exec") for n in ast.walk(fn)):
        return False
    positions = _truth_positions(fn)
    return bool(uses) and all(isinstance(n.ctx, ast.Load) and id(n) in positions
                              for n in uses)


def _replaced(root: ast.AST, node: ast.AST, replacement: ast.AST) -> ast.AST:
    """A copy of ``root`` with ``node`` (inside it) replaced by ``replacement``."""
    if root is node:
        return copy.deepcopy(replacement)
    twin_root = copy.deepcopy(root)
    twins = dict(zip((id(n) for n in ast.walk(root)), ast.walk(twin_root), strict=True))
    target = twins[id(node)]
    for parent in ast.walk(twin_root):
        for name, value in ast.iter_fields(parent):
            if value is target:
                setattr(parent, name, copy.deepcopy(replacement))
                return twin_root
            if isinstance(value, list):
                for k, item in enumerate(value):
                    if item is target:
                        value[k] = copy.deepcopy(replacement)
                        return twin_root
    raise ValueError("the changed node is not inside the argument")


def _same_truth(original: ast.AST, changed: ast.AST) -> bool:
    """Z3: ``bool(original) == bool(changed)`` for every truth value of the names and
    attributes in them, which both read only as truth values; constants are integers."""
    import z3

    flags: dict[str, Any] = {}

    def as_bool(e: ast.AST) -> Any:
        if isinstance(e, (ast.Name, ast.Attribute)):
            key = _dump(e)
            return flags.setdefault(key, z3.Bool(f"flag{len(flags)}"))
        if isinstance(e, ast.UnaryOp) and isinstance(e.op, ast.Not):
            return z3.Not(as_bool(e.operand))
        if isinstance(e, ast.BoolOp):
            parts = [as_bool(v) for v in e.values]
            return z3.And(*parts) if isinstance(e.op, ast.And) else z3.Or(*parts)
        return as_int(e) != 0

    def as_int(e: ast.AST) -> Any:
        if isinstance(e, ast.Constant) and isinstance(e.value, int):
            return z3.IntVal(int(e.value))
        if isinstance(e, ast.IfExp):
            return z3.If(as_bool(e.test), as_int(e.body), as_int(e.orelse))
        if isinstance(e, ast.UnaryOp) and isinstance(e.op, ast.USub):
            return -as_int(e.operand)
        if isinstance(e, ast.BinOp) and isinstance(e.op, _TOTAL_BINOPS):
            left, right = as_int(e.left), as_int(e.right)
            if isinstance(e.op, ast.Add):
                return left + right
            if isinstance(e.op, ast.Sub):
                return left - right
            return left * right
        raise _Untranslatable

    try:
        differ = as_bool(original) != as_bool(changed)
    except _Untranslatable:
        return False
    solver = z3.Solver()
    solver.set("rlimit", Z3_RLIMIT)
    solver.add(differ)
    return bool(solver.check() == z3.unsat)


class _Untranslatable(Exception):
    """An argument outside the flag rule's expressions."""
