"""What a property is: one statement of a clause, with everything its consumers need.

A property is written once and every consumer replays the same object: the prover
decides it (:mod:`kvcontract.proofs`), the audit runs it on upstream's code, the
reproducers of ``gen-tests`` replay one witness of it by id, ``explain`` draws its
:class:`Picture`, and the fuzzer's monitor judges the system's events with it. Two
kinds exist:

* :class:`FormulaProperty` - hypotheses and a goal over named integers, built by a
  *statement* from the spec's formulas (:mod:`kvcontract.spec.arith`, so it evaluates on
  Python ints and on Z3 terms alike) and the implementation's functions, called through
  :meth:`Env.call`. Its witness is the dict of variable values.
* :class:`CaseProperty` - a judgement of one case of a finite :class:`CaseSpace` (a
  lookup-state sequence, a multi-group lookup, a store schedule): the space *observes*
  what the implementation does on the case, the property *judges* that observation
  against the spec. Its witness is the case, in the space's JSON form.

This module imports neither Z3 nor the prover: a reproducer replays a property with
nothing but the spec and the implementation.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from enum import Enum
from typing import Any, ClassVar, Generic, TypeGuard, TypeVar

from kvcontract.errors import KvContractError, WitnessError
from kvcontract.impl.bundle import Implementation
from kvcontract.spec.arith import Bool, Num
from kvcontract.spec.build import buildable
from kvcontract.spec.clauses import get_clause
from kvcontract.spec.geometry import Geometry
from kvcontract.spec.lemmas import GeneralLemma
from kvcontract.spec.lookup import LookupResult
from kvcontract.vocabulary import GroupKind, Impact


class Family(str, Enum):
    """The case families: a family is the properties of one :class:`CaseSpace`, checked
    in one pass over its cases. The one registry of family names: every per-family part
    elsewhere (scoped cases, observers, the audit's costs, witness strategies) is keyed
    by a member, and each consumer's test checks it covers the members it must. A
    ``str`` enum, so reports and JSON keep the plain name."""

    SCAN = "scan"
    LOOKUP = "lookup"
    STORE = "store"
    END_TO_END = "end-to-end"
    LIFECYCLE = "lifecycle"

    def __str__(self) -> str:
        # Messages and derived names (f"upstream-{family}") read the plain name; an
        # f-string of a str enum would otherwise print "Family.LOOKUP" (Python 3.11+).
        return self.value


class Observer(Enum):
    """A consumer other than the prover that can observe a case property on its own terms:
    each derives the properties it judges from the catalogue (``CaseProperty.observable_on``),
    never from a list of its own, so a new property is judged there or says why not."""

    UPSTREAM_LOOP = "upstream-loop"
    """The audit's run of upstream's own multi-group lookup (``_lookup_complete_chunks``,
    :mod:`kvcontract.tools.audit.lookup`): the lookup family's cases, observed on
    upstream's loop. A judge that reads what upstream's loop does not report (the EAGLE
    pops) cannot be observed there."""
    UPSTREAM_STORE_PATH = "upstream-store-path"
    """The audit's run of upstream's own store path (``_build_store_jobs``,
    :mod:`kvcontract.tools.audit.store`): the store family's cases, and with
    ``UPSTREAM_LOOP`` too the end-to-end family's (upstream's store path as producer,
    upstream's loop as consumer)."""
    MONITOR = "monitor"
    """The fuzzer's monitor of the executable system's events (:mod:`kvcontract.tools.
    monitor`): a lookup event is the lookup family's case and observation (the accepted
    hit and the load ranges; no lookup log, no trace of the loop)."""

    @property
    def families(self) -> frozenset[Family]:
        """The families whose cases this observer can give a property of."""
        return OBSERVED_FAMILIES[self]


OBSERVED_FAMILIES: dict[Observer, frozenset[Family]] = {
    Observer.UPSTREAM_LOOP: frozenset({Family.LOOKUP, Family.END_TO_END}),
    Observer.UPSTREAM_STORE_PATH: frozenset({Family.STORE, Family.END_TO_END}),
    Observer.MONITOR: frozenset({Family.LOOKUP, Family.LIFECYCLE}),
}
"""Which families each observer observes: upstream's loop the lookup family (and, with
the store path as producer, the end-to-end family), upstream's store path the store
family; the monitor a lookup event as a lookup case and a program's lifecycle trace
(:meth:`kvcontract.tools.monitor.Monitor.judge_lifecycle`) as a lifecycle case. A
property that declares an observer of another family is a ``CatalogueError``."""


class Violation(str):
    """A judge's violation message with the impact of this particular finding (a plain
    ``str`` from a judge takes its property's impact)."""

    impact: Impact

    def __new__(cls, message: str, impact: Impact) -> Violation:
        made = super().__new__(cls, message)
        made.impact = impact
        return made

    def __reduce__(self) -> tuple[Any, ...]:  # survives the prover's worker processes
        return (Violation, (str(self), self.impact))


def raised(exc: BaseException) -> Violation:
    """The finding of an implementation that raised on a case: the serving code would
    fail the request (or the scheduler step) there, whatever the clause."""
    return Violation(f"the implementation raised {type(exc).__name__}: {exc}", Impact.CRASH)


# -- latent findings: geometries vLLM does not build ------------------------------------
_BUILDABLE: dict[int, tuple[Geometry, str | None]] = {}
"""``id(geometry) -> (geometry, reason or None)``: catalogues share their geometry objects
across cases, so one check per geometry (the geometry is kept, so its id stays valid)."""


def latent_reason(geometry: Geometry | None) -> str | None:
    """Why vLLM does not build ``geometry`` (:func:`kvcontract.spec.build.buildable`), or
    None when it can (or when there is no geometry to judge)."""
    if geometry is None:
        return None
    known = _BUILDABLE.get(id(geometry))
    if known is not None and known[0] is geometry:
        return known[1]
    ok, reason = buildable(geometry)
    if len(_BUILDABLE) > 4096:
        _BUILDABLE.clear()
    _BUILDABLE[id(geometry)] = (geometry, None if ok else reason)
    return None if ok else reason


@dataclass(frozen=True)
class GradedFinding:
    """A violation with its impact, graded ``latent`` on a geometry vLLM does not build."""

    message: str
    """The judge's message; for a latent finding with why it is latent and what it would
    cost if vLLM built the geometry."""
    impact: Impact
    latent: str | None = None
    """Why the witness's geometry is not one vLLM builds (None: it is, or there is none)."""


def grade(prop: FormulaProperty | CaseProperty, message: str,
          geometry: Geometry | None) -> GradedFinding:
    """The impact of one finding on ``geometry``: the judge's, the property's or the
    clause's, unless vLLM cannot build the geometry, where it is ``latent`` (reported,
    not failed by the default ``--fail-on``): a defect no deployment can reach today."""
    impact = prop.impact_of(message)
    reason = latent_reason(geometry)
    if reason is None:
        return GradedFinding(str(message), impact)
    return GradedFinding(
        f"{message} [latent: {reason}; on a geometry vLLM built this would be "
        f"{impact.value}]", Impact.LATENT, reason)


class Env:
    """The variables of one evaluation of a statement, on plain ints.

    The prover's subclass (:class:`kvcontract.proofs.theorem.SymbolicEnv`) holds Z3
    terms instead and lifts the implementation's functions in :meth:`call`.
    """

    def __init__(self, values: Mapping[str, Num]) -> None:
        self.values = dict(values)

    def __getitem__(self, name: str) -> Any:
        return self.values[name]

    @property
    def symbolic(self) -> bool:
        return False

    def assume(self, hypotheses: Sequence[Bool]) -> None:
        """Hypotheses that prune the paths of lifted functions (nothing to do on ints)."""

    def instance(self, lemma: GeneralLemma, *args: Num) -> None:
        """An instance of a general lemma (:mod:`kvcontract.spec.lemmas`): the prover
        proves the general form once, for all values, and uses the instance like a proved
        lemma. On ints nothing happens."""

    def requires(self, lemma: GeneralLemma) -> None:
        """The statement relies on ``lemma``'s general form (e.g. facts it instantiates
        over atoms that stand for terms): the prover proves it for all values before the
        goal, and the goal is undecided if it is not. On ints nothing happens."""

    def lemma(self, fact: Bool) -> None:
        """An intermediate fact of a proof (a cut). The prover proves each lemma from the
        hypotheses and the lemmas before it, then uses them all for the goal: a chain of
        small nonlinear steps Z3 decides where the whole query is out of its reach. On
        ints nothing happens: a lemma follows from the hypotheses, and the goal is
        evaluated as stated."""

    def call(self, fn: Callable[..., Any], *args: Any, generalize: Sequence[int] = ()) -> Any:
        """``fn(*args)``: an implementation function enters a statement only through here."""
        del generalize
        return fn(*args)


Statement = Callable[[Env, Implementation], tuple[list[Bool], Bool]]
"""``statement(env, impl) -> (hypotheses, goal)``."""


@dataclass(frozen=True)
class Config:
    """Concrete parameters of one case of a case split."""

    label: str
    values: Mapping[str, int]


@dataclass
class Picture:
    """What a drawing of one witness shows (``kvcontract explain`` draws it).

    All ranges are half-open, in chunks of the row's group; a row not named keeps the
    spec's ranges at ``hit`` after ``local_hit`` (retained tokens, load set, window).
    """

    geometry: Geometry
    num_tokens: int
    hit: int | None
    local_hit: int = 0
    states: dict[int, list[LookupResult]] | None = None
    stored: dict[int, set[int]] | None = None
    """Stored chunks per group; ``None`` draws the spec's mask at the request's horizon."""
    offending: dict[int, set[int]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    windows: dict[int, tuple[int, int]] = field(default_factory=dict)
    """Checked windows that replace the spec's window of a row (a scan's keys)."""


def _constant(value: Any) -> Callable[..., Any]:
    def constant(*args: Any) -> Any:
        return value

    constant.stateless = True  # type: ignore[attr-defined]  # its closure is the constant
    return constant


HYPOTHESES_ONLY = Implementation(
    name="hypotheses-only",
    description="constant stand-ins: builds a statement's hypotheses without running code",
    get_num_skipped_tokens=_constant(0),
    retained_block_range=_constant((0, 0)),
    load_chunk_range=_constant((0, 0)),
    get_sliding_window_size_in_chunks=_constant(1),
    load_window_size_in_chunks=_constant(1),
    sliding_window_lookup=_constant(None),
    prefix_lookup=_constant(None),
    is_block_reachable=_constant(True),
    store_final_segment_end=_constant(0),
    store_replay_boundaries=_constant(()),
)
"""Every statement builds its hypotheses before (and independently of) its calls into
the implementation, so constant stand-ins yield them cheaply, concrete or symbolic."""


@dataclass(frozen=True)
class _Theorem:
    """What a property of either kind is: the theorem ``clause/name`` of the catalogue,
    stated in words by ``description`` (its own fields follow these)."""

    clause: str
    name: str
    description: str

    @property
    def theorem_id(self) -> str:
        return f"{self.clause}/{self.name}"


@dataclass(frozen=True)
class FormulaProperty(_Theorem):
    """A statement over unbounded integers (its sizes case-split when Z3 needs it)."""

    variables: tuple[str, ...]
    """Unbounded integer variables (always symbolic in a proof)."""
    statement: Statement
    configs: Callable[[], list[Config]]
    """The case split over sizes; each config fixes the remaining names."""
    domain: str
    """The case split in words, e.g. ``bs in {4..1648}, bpc in {1,2,4,8,16}``."""
    uses: tuple[str, ...]
    """The :class:`Implementation` functions the statement calls (most specific first)."""
    picture: Callable[[Mapping[str, int], Implementation], Picture] | None = None
    symbolic_sizes: tuple[str, ...] = ()
    """Size parameters to try symbolically first (PROVED for all values if it works)."""
    symbolic_rlimit: int = 3_000_000
    symbolic_fixed: tuple[tuple[str, int], ...] = ()
    """``(name, value)`` pairs the symbolic-size query fixes (the rest of a
    configuration: e.g. the kind of retention), added to its witness values."""
    symbolic_domain: str = ""
    """What the symbolic-size query's variables stand for, for a PROVED domain."""
    refine_sizes: tuple[str, ...] = ()
    """Non-empty when the symbolic-size goal is stronger than the statement on ints (a
    witness block; it needs these sizes concrete to state the clause itself): a model
    of it is not minimized as is; its sizes are fixed and the statement asked again."""
    probe_configs: int = 0
    """Configurations of the case split tried before the symbolic-size query: a defect
    shows in the smallest sizes in milliseconds, where refuting and minimizing with
    symbolic sizes takes minutes (measured: 136 s on a C7 mask theorem whose lemma chain
    makes every minimization step nonlinear)."""
    rlimit: int | None = None
    """Z3 resource budget per query of the case split (``None``: the solver's default)."""
    impact: Impact | None = None
    """What a violation costs a user (``None``: its clause's impact)."""
    geometry: Callable[[Mapping[str, int]], Geometry] | None = None
    """The geometry a witness's values describe, when they describe one that vLLM may or
    may not build (the multi-group store masks); ``None``: every witness is buildable
    (one group of any block size)."""
    group_kind: GroupKind | None = None
    """The one kind of group the statement is about when it is neither a window's (its
    variables name ``sw`` and ``e``) nor every group's: a scoped run keeps it for the
    given geometries' groups of that kind only (``GroupKind.MAMBA``: the Mamba
    retention)."""
    reads_gpu_retention: bool = False
    """The statement reads what the GPU manager retains (the spec's ``Ret``/``Load``
    with ``e``) next to the window functions it calls: an audit that has not bound
    upstream's manager (``get_num_skipped_tokens``) leaves it unchecked rather than
    present the spec's retention as upstream's."""
    kind: ClassVar[str] = "arith"

    def impact_of(self, message: str) -> Impact:
        return _impact_of(self, message)

    def geometry_of(self, values: Mapping[str, int]) -> Geometry | None:
        if self.geometry is None:
            return None
        try:
            return self.geometry(values)
        except KvContractError:  # values no geometry has: nothing to grade
            return None

    def grade(self, values: Mapping[str, int], message: str) -> GradedFinding:
        """The graded finding of a violation at ``values`` (:func:`grade`)."""
        return grade(self, message, self.geometry_of(values))

    def admissible(self, values: Mapping[str, int]) -> bool:
        """Whether the hypotheses hold for ``values`` (no implementation call)."""
        hypotheses, _ = self.statement(Env(values), HYPOTHESES_ONLY)
        return all(bool(h) for h in hypotheses)

    def violation(self, values: Mapping[str, int], impl: Implementation) -> str | None:
        """A message if the hypotheses hold on ``values`` and the goal fails, else None."""
        hypotheses, goal = self.statement(Env(values), impl)
        if not all(bool(h) for h in hypotheses) or bool(goal):
            return None
        shown = ", ".join(f"{k}={v}" for k, v in values.items())
        return f"{self.description} fails for {shown}"

    def witness(self, values: Mapping[str, int]) -> dict[str, Any]:
        return {"kind": self.kind, "theorem": self.theorem_id,
                "values": {k: int(v) for k, v in values.items()}}

    def decode(self, witness: Mapping[str, Any]) -> dict[str, int]:
        """The variable values of a witness, validated."""
        values = witness.get("values")
        if not isinstance(values, Mapping):
            raise WitnessError(f"{self.theorem_id}: the witness has no 'values' object")
        decoded: dict[str, int] = {}
        for key, value in values.items():
            if not isinstance(value, int) or isinstance(value, bool):
                raise WitnessError(
                    f"{self.theorem_id}: witness value {key}={value!r} is not an integer")
            decoded[str(key)] = value
        missing = [v for v in self.variables if v not in decoded]
        if missing:
            raise WitnessError(f"{self.theorem_id}: the witness lacks {', '.join(missing)}")
        return decoded

    def replay(self, witness: Mapping[str, Any], impl: Implementation) -> str | None:
        """Replay a witness on ``impl``: the violation, or None when the property holds.

        Raises :class:`WitnessError` when the witness is malformed or lies outside the
        property's domain (its hypotheses fail), since then it proves nothing.
        """
        values = self.decode(witness)
        try:
            hypotheses, goal = self.statement(Env(values), impl)
        except KeyError as exc:
            raise WitnessError(f"{self.theorem_id}: the witness lacks {exc}") from None
        if not all(bool(h) for h in hypotheses):
            raise WitnessError(f"{self.theorem_id}: the witness lies outside the domain")
        if bool(goal):
            return None
        shown = ", ".join(f"{k}={v}" for k, v in values.items())
        return f"{self.description} fails for {shown}"

    def draw(self, witness: Mapping[str, Any], impl: Implementation) -> Picture:
        if self.picture is None:
            raise WitnessError(f"{self.theorem_id} has no picture")
        return self.picture(self.decode(witness), impl)


# -- a case's fields in a witness ---------------------------------------------------------
def fields_set(case: Any, *names: str) -> dict[str, Any]:
    """The fields ``names`` of the dataclass ``case`` that differ from their defaults, in
    that order: what a witness holds of them (only when set, so the witnesses written
    before a field existed stay valid)."""
    defaults = {f.name: f.default for f in fields(case)}
    return {name: getattr(case, name) for name in names
            if getattr(case, name) != defaults[name]}


def is_count(value: Any, least: int = 0) -> TypeGuard[int]:
    """Whether ``value`` is an integer (a bool is not one) of at least ``least``."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def count_field(key: str, value: Any) -> int:
    """``value``, the field ``key`` of a case read back: ValueError unless an integer
    >= 0."""
    if not is_count(value):
        raise ValueError(f"{key} must be an integer >= 0, not {value!r}")
    return value


def optional_count_field(key: str, value: Any) -> int | None:
    """``value``, the field ``key`` of a case read back: ValueError unless None or an
    integer >= 0."""
    if value is None:
        return None
    if not is_count(value):
        raise ValueError(f"{key} must be None or an integer >= 0, not {value!r}")
    return value


CaseT = TypeVar("CaseT")
ObservationT = TypeVar("ObservationT")


@dataclass(frozen=True)
class CaseSpace(Generic[CaseT, ObservationT]):
    """A finite domain of cases, enumerated in increasing size, and how to observe an
    implementation on one of them.

    The properties of one space form a *family*: the prover checks them in one pass, so
    the observation of a case (the implementation's run) and the spec's answer are
    computed once per case, not once per property.
    """

    family: str
    """A :class:`Family` for the catalogue's spaces; a space the audit derives from one
    to observe upstream's code is named after it (``upstream-lookup``,
    ``engine-store``)."""
    cases: Callable[[], Iterable[CaseT]]
    describe: Callable[[], str]
    to_json: Callable[[CaseT], dict[str, Any]]
    from_json: Callable[[Mapping[str, Any]], CaseT]
    observe: Callable[[CaseT, Implementation], ObservationT]
    """Run the implementation on a case (memoized per case: see :class:`LastCase`)."""
    geometry_of: Callable[[CaseT], Geometry | None] | None = None
    """The geometry of a case, graded by :func:`grade` (``None``: cases have none)."""
    driver: str = ""
    """How ``observe`` runs an implementation, in words (the audit's ``via`` label of its
    properties on bound code); empty: it calls the implementation's functions directly."""
    drivers: tuple[str, ...] = ()
    """The functions of :mod:`kvcontract.impl.scheduler` ``observe`` calls (qualnames,
    ``Class.*`` for every method): with the properties' ``uses``, what a property
    exercises (``kvcontract mutate`` maps mutants to the theorems that reach them)."""
    shares: tuple[CaseSpace[Any, Any], Callable[[Any], bool]] | None = None
    """``(base space, accepts)`` for a space derived from another's cases (the audit's
    ``upstream-*`` spaces): its cases are the base space's that ``accepts`` keeps, in
    the base's order, so the audit walks both families over the same cases once."""
    not_on_bound_code: str = ""
    """Why the space's cases say nothing about a target whose functions are bound into
    ``driver`` (its driver is kvcontract's, and the clause is about the target's own
    driver): the audit leaves the space's properties unchecked with this reason. Empty:
    the cases run on bound code like on kvcontract's own."""

    def decode(self, witness: Mapping[str, Any]) -> CaseT:
        try:
            return self.from_json(witness)
        except WitnessError:
            raise
        except (KvContractError, KeyError, TypeError, ValueError, AttributeError) as exc:
            raise WitnessError(
                f"a {self.family} witness cannot be read: {type(exc).__name__}: {exc}"
            ) from None


Judge = Callable[[Any, Any], "str | None"]
"""``judge(case, observation) -> violation message | None``."""


@dataclass(frozen=True)
class CaseProperty(_Theorem):
    """A judgement of every case of a finite space."""

    space: CaseSpace[Any, Any]
    judge: Judge
    uses: tuple[str, ...]
    """Every :class:`Implementation` function a case's observation runs, the space's
    driver's included (a report locates a finding at the first one a variant replaced,
    so the most specific first)."""
    picture: Callable[[Any, Implementation], Picture] | None = None
    impact: Impact | None = None
    """What a violation costs a user (``None``: its clause's impact, unless the judge
    returns a :class:`Violation` with its own)."""
    observable_on: frozenset[Observer] = frozenset()
    """The consumers besides the prover that judge this property (:class:`Observer`):
    the audit on upstream's own loop or store path, the fuzzer's monitor. Declared
    here, read by each of them; empty: the prover (and the audit over kvcontract's
    driver) only."""
    domain_note: str = ""
    """What the property's domain is beyond its space's, where it differs (a judge that
    decides only some of the cases): appended to the space's text, so a scoped run's
    space keeps it. Empty: the space's domain is the property's."""
    relevant: Callable[[Any], bool] | None = None
    """The cases the judge decides anything on (None: every case). On the others it is
    vacuous by its statement, so :meth:`check` answers None without observing the case:
    a walk kept going by this property alone (every other one of its family decided)
    costs a predicate per case, not a run of the implementation or of vLLM's engine."""
    kind: ClassVar[str] = "exhaustive"

    def impact_of(self, message: str) -> Impact:
        return _impact_of(self, message)

    @property
    def family(self) -> str:
        return self.space.family

    @property
    def domain(self) -> str:
        described = self.space.describe()
        return f"{described}; {self.domain_note}" if self.domain_note else described

    def check(self, case: Any, impl: Implementation) -> str | None:
        """Observe ``impl`` on ``case`` and judge it (nothing outside :attr:`relevant`)."""
        if self.relevant is not None and not self.relevant(case):
            return None
        return self.judge(case, self.space.observe(case, impl))

    def geometry_of(self, case: Any) -> Geometry | None:
        geometry_of = self.space.geometry_of
        return None if geometry_of is None else geometry_of(case)

    def grade(self, case: Any, message: str) -> GradedFinding:
        """The graded finding of a violation on ``case`` (:func:`grade`)."""
        return grade(self, message, self.geometry_of(case))

    def witness(self, case: Any) -> dict[str, Any]:
        return {"kind": self.kind, "theorem": self.theorem_id, **self.space.to_json(case)}

    def replay(self, witness: Mapping[str, Any], impl: Implementation) -> str | None:
        """Replay a witness on ``impl``: the violation, or None when the property holds."""
        return self.check(self.space.decode(witness), impl)

    def draw(self, witness: Mapping[str, Any], impl: Implementation) -> Picture:
        if self.picture is None:
            raise WitnessError(f"{self.theorem_id} has no picture")
        return self.picture(self.space.decode(witness), impl)


Property = FormulaProperty | CaseProperty


def _impact_of(prop: FormulaProperty | CaseProperty, message: str) -> Impact:
    """The impact of one finding: the judge's own, else the property's, else the
    clause's."""
    if isinstance(message, Violation):
        return message.impact
    if prop.impact is not None:
        return prop.impact
    default: Impact = get_clause(prop.clause).impact
    return default


ResultT = TypeVar("ResultT")


class LastCase(Generic[CaseT, ResultT]):
    """A one-entry memo of ``compute(case, impl)``: the properties of a family judge one
    case after another, so the implementation's run and the spec's answer for a case are
    computed once, not once per property (a failure is remembered and raised again)."""

    def __init__(self, compute: Callable[[CaseT, Any], ResultT]) -> None:
        self.compute = compute
        self.key: tuple[Any, Any] | None = None
        self.value: Any = None
        self.error: BaseException | None = None

    def __call__(self, case: CaseT, impl: Any = None) -> ResultT:
        if self.key is None or self.key[0] is not case or self.key[1] is not impl:
            self.key, self.value, self.error = (case, impl), None, None
            try:
                self.value = self.compute(case, impl)
            except Exception as exc:
                self.error = exc
        if self.error is not None:
            raise self.error
        value: ResultT = self.value
        return value
