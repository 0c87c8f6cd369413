"""Is a surviving mutant equivalent to the original function?

Only shown, never guessed. A function qualifies when each of its parameters has a
known domain (by name: :data:`KINDS`); methods and functions of objects (the
scheduler's drivers, the store tracker) do not, and their survivors stay survivors.

1. **Z3**: both functions are lifted with :class:`kvcontract.proofs.symbolic.PathExplorer`
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

import inspect
import itertools
from collections.abc import Callable, Iterator, Sequence
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
START = "start"
END = "end"

KINDS: dict[str, str] = {
    "block_size": SIZE, "blocks_per_chunk": SIZE, "tokens_per_chunk": SIZE,
    "block_tokens": SIZE, "chunk_tokens": SIZE, "bpc": SIZE, "b": SIZE,
    "initial_window": SIZE, "window": SIZE,
    "sliding_window": WINDOW,
    "extra_retained": EXTRA,
    "num_computed_tokens": TOKENS, "num_hit_tokens": TOKENS, "num_local_tokens": TOKENS,
    "boundary": TOKENS, "hit": TOKENS, "local_hit": TOKENS, "num_tokens": TOKENS,
    "num_scheduled_tokens": TOKENS, "num_computed": TOKENS, "prompt_len": TOKENS,
    "a": TOKENS, "block": TOKENS, "prompt_horizon_chunks": TOKENS, "current_chunks": TOKENS,
    "segment_tokens": TOKENS,
    "final_segment_end_block": OPT_TOKENS, "max_offload_tokens": OPT_TOKENS,
    "alignment_tokens": ALIGN,
    "retention_interval": INTERVAL,
    "use_eagle": FLAG, "offload_prompt_only": FLAG,
    "status": STATUS,
    "replay_boundary_blocks": BLOCKS,
    "lookup": LOOKUP, "start": START, "end": END,
}
"""Parameter name -> its domain (the contract's units, docs/CONTRACT.md section 2)."""

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


def _in_domain(kinds: Sequence[tuple[str, str]], args: Sequence[Any]) -> bool:
    values = {name: value for (name, _), value in zip(kinds, args, strict=True)}
    for a, b in WHOLE_MULTIPLES:
        x, y = values.get(a), values.get(b)
        if isinstance(x, int) and isinstance(y, int) and y > 0 and x % y:
            return False
    return True


def _domain_text(kinds: Sequence[tuple[str, str]]) -> str:
    names = {name for name, _ in kinds}
    kept = [f"{a} a multiple of {b}" for a, b in WHOLE_MULTIPLES if a in names and b in names]
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
        if isinstance(value, tuple):
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
    raise ValueError(kind)


def _z3(original: Callable[..., Any], mutant: Callable[..., Any],
        kinds: Sequence[tuple[str, str]]) -> Equivalence:
    import z3

    from kvcontract.proofs.symbolic import LiftError

    alternatives = [_choices(k) for _, k in kinds]
    combos = list(itertools.product(*alternatives))
    if len(combos) > Z3_MAX_CHOICES:
        return Equivalence(None, "z3", f"{len(combos)} argument shapes (not tried)")
    queries = 0
    for combo in combos:
        args: list[Any] = []
        variables: list[tuple[str, Any]] = []
        domain: list[Any] = []
        for (name, kind), choice in zip(kinds, combo, strict=True):
            if isinstance(choice, tuple) and choice and choice[0] in ("int", "tuple"):
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
        concrete = _concrete(kinds, combo, model)
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
    from kvcontract.proofs.symbolic import LiftError, PathExplorer

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


def _concrete(kinds: Sequence[tuple[str, str]], combo: Sequence[Any], model: Any) -> list[Any]:
    import z3

    def value(name: str, kind: str) -> int:
        term = model.eval(z3.Int(name), model_completion=True)
        return max(int(term.as_long()), LOWER[kind])

    args: list[Any] = []
    for (name, kind), choice in zip(kinds, combo, strict=True):
        if isinstance(choice, tuple) and choice and choice[0] == "int":
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
