"""Pictures of a scenario on the token axis (``kvcontract explain``).

A counterexample says "group 1 must load chunk 0, which is MISS"; a reviewer needs to
*see* why chunk 0 is in the load set and nowhere in the checked window. This module
builds a :class:`Scene` (one row per KV-cache group: its blocks and chunks, the store
alignment segments, the retained token range, the load set, the window the lookup
checks, the stored chunks, the missing and pending chunks, and the offending chunks of a
counterexample) and draws it as PNG/SVG (matplotlib, Agg backend) or in the terminal
(rich).

Every range in a scene comes from the spec's own functions
(:mod:`kvcontract.spec.retention`, :mod:`kvcontract.spec.multigroup`,
:mod:`kvcontract.spec.reachability`, :mod:`kvcontract.spec.lookup`); nothing here
re-derives a formula. What a witness highlights (its offending chunks, notes, the
checked window of a scan) is the property's own :class:`Picture`
(:mod:`kvcontract.spec.properties`): no branch per theorem lives here.

A picture that carries a ``timeline`` (the lifecycle clauses C13-C15: rows of
``(step, request, what happened)``, :class:`~kvcontract.spec.properties.lifecycle.
TimelinePicture`) is a *timeline scene*: the witness is drawn along scheduler steps,
one lane per request, the steps a violation names highlighted, instead of along the
token axis.

An audit's theorem of upstream's own store path (``upstream-store-*``, C12's
``upstream-*``) is drawn from what that path did on the witness (:func:`observed_picture`):
the binding has no store horizon of its own to run kvcontract's store path with. A
witness whose picture cannot be drawn says why in one line: a system program or a fuzz
difference has none (exit 2); re-running the code on it failed (a function the target
does not bind, a call that raises or hangs: :class:`NoPicture`, exit 3). An audit
report's pictures re-run upstream code, so ``kvcontract explain`` computes them in a
sandbox child under the audit's limits (``tools/audit/sandbox``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvcontract.errors import InputFileError, UsageError
from kvcontract.impl.bundle import Implementation
from kvcontract.inputs import parse_json, read_text_file
from kvcontract.spec import multigroup
from kvcontract.spec import reachability as spec_reach
from kvcontract.spec import retention as spec_ret
from kvcontract.spec.arith import cdiv
from kvcontract.spec.geometry import Geometry, GroupSpec
from kvcontract.spec.lookup import HIT, HIT_PENDING, MISS, RETRY, LookupResult
from kvcontract.spec.properties import (
    CaseProperty,
    Picture,
    Property,
    UnknownPropertyError,
    WitnessError,
    get_property,
)
from kvcontract.vocabulary import EXIT_UNKNOWN

MAX_DRAWN_CHUNKS = 96
"""Rows longer than this are cropped to the interesting region (pictures stay legible)."""
MAX_SCENE_CHUNKS = 1_000_000
"""The most chunks a scene spans (the store mask is evaluated per chunk: ~4 s)."""


@dataclass
class Row:
    """One KV-cache group of a scene, all ranges half-open, in chunks unless named."""

    index: int
    group: GroupSpec
    chunk_tokens: int
    block_tokens: int
    num_chunks: int
    retained_tokens: tuple[int, int] | None = None
    load_chunks: tuple[int, int] | None = None
    window_chunks: tuple[int, int] | None = None
    stored: set[int] = field(default_factory=set)
    states: dict[int, LookupResult] = field(default_factory=dict)
    offending: set[int] = field(default_factory=set)

    @property
    def label(self) -> str:
        return f"g{self.index} {self.group.describe()}"

    def missing(self) -> list[int]:
        return sorted(k for k, s in self.states.items() if s == MISS)

    def pending(self) -> list[int]:
        return sorted(k for k, s in self.states.items() if s == HIT_PENDING)


@dataclass
class Scene:
    """Everything one picture shows."""

    title: str
    geometry: Geometry
    num_tokens: int
    hit: int | None
    local_hit: int
    rows: list[Row]
    notes: list[str] = field(default_factory=list)
    timeline: list[tuple[int, str, str]] = field(default_factory=list)
    """``(step, request, what happened)`` of a lifecycle witness, in step order (empty:
    a token-axis scene)."""
    offending_steps: set[int] = field(default_factory=set)

    def offending(self) -> list[tuple[int, int]]:
        return sorted((row.index, k) for row in self.rows for k in row.offending)

    def view(self) -> tuple[int, int]:
        """The token range drawn: everything, or a crop around what matters."""
        end = max(
            [self.num_tokens, self.hit or 0]
            + [r.num_chunks * r.chunk_tokens for r in self.rows]
        )
        widest = min(r.chunk_tokens for r in self.rows)
        if end // widest <= MAX_DRAWN_CHUNKS:
            return 0, end
        # What matters: the boundary, the offending chunks and the sliding-window ranges
        # (a full-attention prefix spans everything and would defeat the crop).
        marks = [m for m in (self.hit, self.local_hit) if m]
        for row in self.rows:
            if row.group.is_swa:
                for rng in (row.load_chunks, row.window_chunks):
                    if rng:
                        marks += [rng[0] * row.chunk_tokens, rng[1] * row.chunk_tokens]
            marks += [k * row.chunk_tokens for k in row.offending]
            marks += [(k + 1) * row.chunk_tokens for k in row.offending]
        if not marks:
            return 0, MAX_DRAWN_CHUNKS * widest
        lo = max(0, min(marks) - 4 * widest)
        hi = min(end, max(marks) + 4 * widest)
        if (hi - lo) // widest > MAX_DRAWN_CHUNKS:
            lo = hi - MAX_DRAWN_CHUNKS * widest  # keep the end near the boundary
        return (lo // widest) * widest, hi


# -- building scenes ------------------------------------------------------------------
def build_scene(
    geometry: Geometry,
    num_tokens: int,
    hit: int | None,
    local_hit: int = 0,
    states: Mapping[int, Sequence[LookupResult]] | None = None,
    stored: Mapping[int, set[int]] | None = None,
    offending: Mapping[int, set[int]] | None = None,
    title: str = "",
    notes: Sequence[str] = (),
) -> Scene:
    """A scene for a geometry and a boundary, with the spec's ranges filled in.

    ``stored`` defaults to the spec's store mask at the request's complete-chunk horizon
    (what a correct producer stores for a finished request of ``num_tokens`` tokens).
    """
    if num_tokens < 0 or (hit is not None and hit < 0) or local_hit < 0:
        raise UsageError("token counts cannot be negative")
    if hit is not None and hit < local_hit:
        raise UsageError(f"the hit {hit} is below the local hit {local_hit}")
    longest = max([num_tokens, hit or 0]) // min(geometry.chunk_tokens(g) for g in geometry.groups)
    if longest > MAX_SCENE_CHUNKS:
        raise UsageError(
            f"{max([num_tokens, hit or 0])} tokens are {longest} chunks of the finest group: "
            f"a scene covers at most {MAX_SCENE_CHUNKS:,} chunks (the spec's store mask is "
            "evaluated per chunk); use fewer tokens"
        )
    rows = []
    for g, group in enumerate(geometry.groups):
        tpc = geometry.chunk_tokens(group)
        row = Row(
            index=g, group=group, chunk_tokens=tpc, block_tokens=geometry.block_tokens(group),
            num_chunks=multigroup.complete_chunks(geometry, group, num_tokens),
        )
        if hit is not None and hit > 0:
            if group.is_swa:
                assert group.sliding_window is not None
                lo, hi = spec_ret.retained_token_range(
                    hit, group.sliding_window, group.extra_retained_tokens
                )
                row.retained_tokens = (int(lo), int(hi))
                w_lo, w_hi = spec_reach.demanded_chunk_range(
                    hit, group.sliding_window, group.extra_retained_tokens, tpc,
                    geometry.drops_eagle_block(group),
                )
                row.window_chunks = (max(int(w_lo), local_hit // tpc), int(w_hi))
            else:
                row.retained_tokens = (0, hit)
                row.window_chunks = (local_hit // tpc, int(cdiv(hit, tpc)))
            if hit > local_hit:
                row.load_chunks = multigroup.load_range(geometry, group, hit, local_hit)
        if states is not None and g in states:
            row.states = dict(enumerate(states[g]))
        if stored is not None:
            row.stored = set(stored.get(g, set()))
        else:
            row.stored = _spec_stored(geometry, group, row.num_chunks)
        if offending is not None:
            row.offending = set(offending.get(g, set()))
        row.num_chunks = max(
            [row.num_chunks, *(k + 1 for k in row.states), *(k + 1 for k in row.offending)]
            + ([row.load_chunks[1]] if row.load_chunks else [])
            + ([row.window_chunks[1]] if row.window_chunks else [])
        )
        rows.append(row)
    return Scene(title or geometry.describe(), geometry, num_tokens, hit, local_hit, rows,
                 list(notes))


def _spec_stored(geometry: Geometry, group: GroupSpec, horizon_chunks: int) -> set[int]:
    """Chunks the spec's store mask keeps at a final horizon of ``horizon_chunks``."""
    if not group.is_swa:
        return set(range(horizon_chunks))
    assert group.sliding_window is not None
    block_tokens = geometry.block_tokens(group)
    rule = spec_reach.mask_rule(geometry.alignment_tokens, block_tokens,
                                geometry.retention_interval)
    need = spec_reach.store_need_blocks(group.sliding_window, group.extra_retained_tokens,
                                        block_tokens, geometry.drops_eagle_block(group))
    bpc = geometry.blocks_per_chunk
    return {
        c for c in range(horizon_chunks)
        if spec_reach.chunk_is_stored(c, bpc, rule, need, geometry.drops_eagle_block(group),
                                      horizon_chunks * bpc)
    }


# -- scenes from witnesses ----------------------------------------------------------------
def scene_of_picture(picture: Picture, title: str) -> Scene:
    """The scene of a property's :class:`~kvcontract.spec.properties.Picture`."""
    scene = build_scene(
        picture.geometry, picture.num_tokens, picture.hit, picture.local_hit,
        states=picture.states, stored=picture.stored, offending=picture.offending,
        title=title, notes=picture.notes,
    )
    for row in scene.rows:
        if row.index in picture.windows:
            row.window_chunks = picture.windows[row.index]
    # A picture may carry a timeline of steps (the lifecycle clauses): read as data, so
    # no branch per theorem or per kind of picture lives here.
    scene.timeline = list(getattr(picture, "timeline", []) or [])
    scene.offending_steps = set(getattr(picture, "offending_steps", set()) or set())
    return scene


def scene_from_result(result: Mapping[str, Any], impl: Implementation,
                      prop: Property | None = None,
                      observe: Callable[[Any], Any] | None = None) -> Scene:
    """The scene of one report result's witness, offending chunks highlighted: the
    property named by the result (or ``prop``: an audit's own theorem of upstream code,
    ``upstream-lookup-*``) draws its own witness
    (:meth:`~kvcontract.spec.properties.base.FormulaProperty.draw`).

    Raises :class:`UsageError` when the witness has no picture (no witness, or a fuzz
    program, which carries a list of operations rather than one scenario).
    """
    witness = result.get("witness")
    theorem_id = f"{result.get('clause')}/{result.get('theorem')}"
    if not witness:
        raise UsageError(f"{theorem_id} has no witness to draw (verdict {result.get('verdict')})")
    kind = witness.get("kind")
    if kind == "system":
        raise UsageError(
            f"{theorem_id}: a witness of kind 'system' is a program of the executable "
            "system, not one scenario, so it has no token-axis picture (the audit runs it "
            "again; `kvcontract fuzz` runs the seed scenarios)")
    if kind not in ("arith", "exhaustive"):
        raise UsageError(
            f"{theorem_id}: a witness of kind {kind!r} has no token-axis picture "
            "(fuzz differences carry a program: `kvcontract gen-tests --report` makes it a "
            "pytest reproducer, `kvcontract fuzz` runs it again)"
        )
    try:
        if prop is None:
            prop = get_property(theorem_id)
        picture = _picture(prop, witness, impl, observe)
    except (UnknownPropertyError, WitnessError) as exc:
        if isinstance(exc, NoPicture):
            raise
        raise UsageError(f"{theorem_id}: {exc}") from None
    title = f"{theorem_id} ({impl.name}): {result.get('message', '')}"
    return scene_of_picture(picture, title)


class NoPicture(WitnessError):
    """A witness whose picture cannot be drawn here: re-running the code it needs
    failed (a function the target does not bind, a call that raises or hangs on the
    witness). The command line exits 3 (undecided), one line naming why."""

    exit_code = EXIT_UNKNOWN


def _picture(prop: Property, witness: Mapping[str, Any], impl: Implementation,
             observe: Callable[[Any], Any] | None = None) -> Picture:
    """``prop``'s picture of ``witness`` on ``impl``; an audit's theorem of upstream's
    own store path (``upstream-store-*``, C12's ``upstream-*``) drawn from what that
    path did (:func:`observed_picture`), never from kvcontract's store path over the
    binding (which lacks the store horizon: upstream computes it inside
    ``_build_store_jobs``). ``observe``: where the audit judged the row (vLLM's engine),
    the observation of a case there."""
    from kvcontract.tools.audit.upstream_calls import MissingRole, StandInGap, UpstreamError

    theorem_id = prop.theorem_id
    try:
        if isinstance(prop, CaseProperty) and prop.name.startswith("upstream-"):
            observed = observed_picture(prop, prop.space.decode(witness), impl, observe)
            if observed is not None:
                return observed
        return prop.draw(witness, impl)
    except (UnknownPropertyError, WitnessError):
        raise
    except MissingRole as exc:
        raise NoPicture(f"{theorem_id}: no picture: drawing it re-runs a function "
                        f"{impl.name} does not bind: {exc}") from None
    except (StandInGap, UpstreamError) as exc:
        raise NoPicture(f"{theorem_id}: no picture: re-running the bound code on the "
                        f"witness did not finish: {exc}") from None
    except Exception as exc:  # the code under test fails on its own witness
        raise NoPicture(f"{theorem_id}: no picture: {impl.name} raises "
                        f"{type(exc).__name__} on the witness: {exc}") from None


def observed_picture(prop: CaseProperty, case: Any, impl: Implementation,
                     observe: Callable[[Any], Any] | None = None) -> Picture | None:
    """The picture of a store or end-to-end case as ``prop``'s own observation saw it
    (upstream's executed store path, upstream's lookup as the consumer), against the
    spec's ranges; None for another kind of case. Offending chunks as the catalogue's
    pictures mark them: a store path's offers that differ from the spec's or repeat;
    a consumer's reads at the boundary shown that are not HIT."""
    from kvcontract.spec.properties.end_to_end import EndToEndCase, manager_state, promise
    from kvcontract.spec.properties.store import StoreCase, store_expected_offers

    if not isinstance(case, (StoreCase, EndToEndCase)):
        return None
    observation = observe(case) if observe is not None else prop.space.observe(case, impl)
    who = "vLLM's engine" if observe is not None else f"{impl.name}'s"
    geometry = case.geometry
    if isinstance(case, StoreCase):
        stored: dict[int, set[int]] = {}
        offending: dict[int, set[int]] = {}
        notes = [f"prefill steps {list(case.steps)}, then {case.ending}; the offers are "
                 f"{who} store path as executed"]
        for g, tracker in enumerate(observation.trackers):
            expected = store_expected_offers(case, g)
            stored[g] = expected
            offered: set[int] = set()
            repeated: set[int] = set()
            for offer in tracker.offers:
                repeated |= offered & set(offer)
                offered |= set(offer)
            wrong = (offered ^ expected) | repeated
            if wrong:
                offending[g] = wrong
                notes.append(f"group {g}: offered {sorted(offered)}, the spec stores "
                             f"{sorted(expected)}")
        return Picture(geometry, case.prompt_len, None, 0, stored=stored,
                       offending=offending, notes=notes)
    promised = promise(case)
    hit = observation.hit_tokens
    shown = hit if hit is not None and hit > promised else promised
    tokens = case.consumer.num_tokens
    states = {g: [manager_state(observation, g, k)
                  for k in range(multigroup.complete_chunks(geometry, group, tokens))]
              for g, group in enumerate(geometry.groups)}
    bad: dict[int, set[int]] = {}
    for g, group in enumerate(geometry.groups):
        if not shown:
            break
        lo, hi = multigroup.read_range(geometry, group, shown, 0)
        unread = {k for k in range(lo, hi) if manager_state(observation, g, k) != HIT}
        if unread:
            bad[g] = unread
    return Picture(geometry, tokens, shown, 0, states=states, offending=bad,
                   notes=[f"promised hit {promised}, accepted {hit} ({who} "
                          "store path and lookup as executed)"])


# -- terminal -------------------------------------------------------------------------------
_CELL = {HIT: ("H", "green"), HIT_PENDING: ("P", "yellow"), MISS: ("M", "red"),
         RETRY: ("R", "magenta")}


def render_timeline(scene: Scene) -> Any:
    """A rich renderable of a timeline scene: one line per event, grouped by step, the
    steps a violation names marked ``!`` in red, then the notes (program, findings)."""
    from rich.console import Group
    from rich.text import Text

    parts: list[Any] = [Text(scene.title, style="bold")]
    requests = sorted({request for _, request, _ in scene.timeline})
    parts.append(Text(f"{len({s for s, _, _ in scene.timeline})} steps, requests "
                      f"{', '.join(requests)}; ! marks a step a violation names",
                      style="dim"))
    width = max((len(r) for r in requests), default=1)
    previous: int | None = None
    for step, request, text in scene.timeline:
        offending = step in scene.offending_steps
        head = f"{'!' if offending else ' '} step {step:>3} " if step != previous \
            else " " * 11
        previous = step
        line = Text(head, style="bold red" if offending else "bold")
        style = "red" if "RAISED" in text else ("yellow" if "deferred" in text else "")
        line.append(f"{request:<{width}}  ", style="cyan")
        line.append(text, style=style)
        parts.append(line)
    for note in scene.notes:
        parts.append(Text(note))
    return Group(*parts)


def render_terminal(scene: Scene) -> Any:
    """A rich renderable: one line of chunk cells per group, then a legend and findings
    (a timeline scene: :func:`render_timeline`)."""
    from rich.console import Group
    from rich.text import Text

    if scene.timeline:
        return render_timeline(scene)

    lo, hi = scene.view()
    parts: list[Any] = [Text(scene.title, style="bold")]
    facts = [f"tokens {scene.num_tokens}"]
    if scene.hit is not None:
        facts.append(f"boundary N={scene.hit}")
    facts.append(f"local hit L={scene.local_hit}")
    if scene.geometry.alignment_tokens is not None:
        facts.append(f"alignment A={scene.geometry.alignment_tokens}")
    if lo or hi < max(r.num_chunks * r.chunk_tokens for r in scene.rows):
        facts.append(f"showing tokens [{lo}, {hi})")
    parts.append(Text(", ".join(facts), style="dim"))
    width = max(len(r.label) for r in scene.rows)
    for row in scene.rows:
        line = Text(f"{row.label:<{width}} ")
        first, last = lo // row.chunk_tokens, -(-hi // row.chunk_tokens)
        if first:
            line.append("… ", style="dim")
        for k in range(first, min(last, row.num_chunks)):
            char, colour = _CELL.get(row.states.get(k, HIT if not row.states else MISS),
                                     ("·", "white"))
            if not row.states:
                char, colour = ("s", "cyan") if k in row.stored else ("·", "white")
            style = colour
            in_window = row.window_chunks is not None and \
                row.window_chunks[0] <= k < row.window_chunks[1]
            in_load = row.load_chunks is not None and row.load_chunks[0] <= k < row.load_chunks[1]
            if in_load:
                style += " underline"
            if in_window:
                style += " bold"
            if k in row.offending:
                style = "bold white on red"
                char = "!"
            line.append(_bracket(row.window_chunks, k), style="bold")
            line.append(char, style=style)
        drawn_end = min(last, row.num_chunks)
        if row.window_chunks and row.window_chunks[0] < row.window_chunks[1] == drawn_end:
            line.append("]", style="bold")
        parts.append(line)
        details = []
        if row.retained_tokens:
            details.append(f"retained tokens [{row.retained_tokens[0]}, {row.retained_tokens[1]})")
        if row.load_chunks:
            details.append(f"load chunks [{row.load_chunks[0]}, {row.load_chunks[1]})")
        if row.window_chunks:
            details.append(f"checked [{row.window_chunks[0]}, {row.window_chunks[1]})")
        if row.missing():
            details.append(f"missing {_compact(row.missing())}")
        if row.pending():
            details.append(f"pending {_compact(row.pending())}")
        if row.stored and row.group.is_swa:
            details.append(f"stored {_compact(sorted(row.stored))}")
        parts.append(Text(" " * (width + 1) + "; ".join(details), style="dim"))
    parts.append(Text(
        "legend: H hit  P pending  M missing  R retry  s stored (spec)  [ ] checked window  "
        "underline load set  ! offending", style="dim"))
    for g, k in scene.offending():
        row = scene.rows[g]
        state = row.states.get(k)
        shown = f" ({state.name})" if state is not None else ""
        parts.append(Text(
            f"offending chunk: group {g} chunk {k}{shown}, tokens "
            f"[{k * row.chunk_tokens}, {(k + 1) * row.chunk_tokens})", style="bold red"))
    for note in scene.notes:
        parts.append(Text(note))
    return Group(*parts)


def _bracket(window: tuple[int, int] | None, k: int) -> str:
    """The separator before cell ``k``: opens or closes the checked window."""
    if window is None or window[0] >= window[1]:
        return " "
    if k == window[0]:
        return "["
    if k == window[1]:
        return "]"
    return " "


def _compact(values: Sequence[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``{0-2, 5}``: long sets stay on one line."""
    if not values:
        return "{}"
    runs: list[str] = []
    start = prev = values[0]
    for v in [*values[1:], None]:
        if v is not None and v == prev + 1:
            prev = v
            continue
        runs.append(str(start) if start == prev else f"{start}-{prev}")
        if v is not None:
            start = prev = v
    return "{" + ", ".join(runs) + "}"


# -- matplotlib -----------------------------------------------------------------------------
_FACE = {HIT: "#7fc97f", HIT_PENDING: "#fdc086", MISS: "#f0f0f0", RETRY: "#beaed4"}


def draw(scene: Scene, paths: Sequence[str | Path]) -> list[Path]:
    """Draw the scene into each path (format from the suffix: .png or .svg)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch, Rectangle

    for path in paths:
        if Path(path).suffix.lower() not in (".png", ".svg"):
            raise UsageError(f"cannot draw {path}: the picture formats are .png and .svg")
    if scene.timeline:
        return _draw_timeline(scene, paths)
    lo, hi = scene.view()
    rows = scene.rows
    plt.rcParams["svg.hashsalt"] = "kvcontract"  # stable ids: identical SVG on every run
    fig, ax = plt.subplots(figsize=(12, 1.6 + 1.1 * len(rows)))
    try:
        for y, row in enumerate(reversed(rows)):
            tpc = row.chunk_tokens
            if row.retained_tokens:
                a, b = max(lo, row.retained_tokens[0]), min(hi, row.retained_tokens[1])
                if b > a:
                    ax.add_patch(Rectangle((a, y - 0.42), b - a, 0.84, color="#cfe2f3", zorder=0))
            for k in range(lo // tpc, min(row.num_chunks, -(-hi // tpc))):
                state = row.states.get(k)
                face = _FACE.get(state, "white") if state is not None else "white"
                if state is None and row.states:
                    face = "#f0f0f0"
                ax.add_patch(Rectangle((k * tpc, y - 0.3), tpc, 0.6, facecolor=face,
                                       edgecolor="#555555", linewidth=0.6, zorder=2))
                if state == MISS or (state is None and row.states):
                    ax.text(k * tpc + tpc / 2, y, "×", ha="center", va="center", fontsize=8,
                            color="#888888", zorder=3)
                if state == HIT_PENDING:
                    ax.text(k * tpc + tpc / 2, y, "P", ha="center", va="center", fontsize=7,
                            zorder=3)
                if k in row.stored:
                    ax.plot(k * tpc + tpc / 2, y + 0.38, marker="s", markersize=3,
                            color="#3d85c6", zorder=3)
                if k in row.offending:
                    ax.add_patch(Rectangle((k * tpc, y - 0.36), tpc, 0.72, fill=False,
                                           edgecolor="red", linewidth=2.5, zorder=5))
                    ax.text(k * tpc + tpc / 2, y - 0.52, f"chunk {k}", ha="center",
                            va="top", fontsize=7, color="red", zorder=5)
            blocks = (hi - lo) // row.block_tokens
            if row.block_tokens < tpc and blocks <= 400:
                first_block = -(-lo // row.block_tokens)
                for b in range(first_block, hi // row.block_tokens + 1):
                    x = b * row.block_tokens
                    if x % tpc:
                        ax.plot([x, x], [y - 0.3, y - 0.15], color="#999999", linewidth=0.5,
                                zorder=3)
            if row.load_chunks and row.load_chunks[1] > row.load_chunks[0]:
                a, b = row.load_chunks[0] * tpc, row.load_chunks[1] * tpc
                ax.add_patch(Rectangle((a, y - 0.3), b - a, 0.6, fill=False, edgecolor="#1f4e9c",
                                       linewidth=2, zorder=4))
            if row.window_chunks and row.window_chunks[1] > row.window_chunks[0]:
                a, b = row.window_chunks[0] * tpc, row.window_chunks[1] * tpc
                ax.add_patch(Rectangle((a, y - 0.4), b - a, 0.8, fill=False, edgecolor="black",
                                       linestyle="--", linewidth=1.2, zorder=4))
        align = scene.geometry.alignment_tokens
        if align and (hi - lo) // align <= 200:
            for x in range(-(-lo // align) * align, hi + 1, align):
                ax.axvline(x, color="#aaaaaa", linestyle=":", linewidth=0.8, zorder=1)
        if scene.hit is not None:
            ax.axvline(scene.hit, color="red", linewidth=1.2, zorder=6)
        if scene.local_hit:
            ax.axvline(scene.local_hit, color="green", linestyle="--", linewidth=1.2, zorder=6)
        ax.set_yticks(range(len(rows)))
        ax.set_yticklabels([r.label for r in reversed(rows)], fontsize=8)
        ax.set_xlim(lo, hi)
        ax.set_ylim(-0.9, len(rows) - 0.3)
        ax.set_xlabel("token")
        _set_title(ax, scene)
        legend = [
            Patch(facecolor=_FACE[HIT], edgecolor="#555555", label="HIT"),
            Patch(facecolor=_FACE[HIT_PENDING], edgecolor="#555555", label="pending"),
            Patch(facecolor=_FACE[MISS], edgecolor="#555555", label="missing"),
            Patch(facecolor="#cfe2f3", label="retained tokens"),
            Patch(fill=False, edgecolor="#1f4e9c", linewidth=2, label="load set"),
            Patch(fill=False, edgecolor="black", linestyle="--", label="checked window"),
            Line2D([], [], marker="s", color="#3d85c6", linestyle="", markersize=4,
                   label="stored (spec)"),
            Patch(fill=False, edgecolor="red", linewidth=2, label="offending"),
            Line2D([], [], color="red", label="boundary N"),
            Line2D([], [], color="#aaaaaa", linestyle=":", label="alignment A"),
        ]
        ax.legend(handles=legend, loc="upper center",
                  bbox_to_anchor=(0.5, -0.25 - 0.05 / len(rows)), ncol=5, fontsize=7,
                  frameon=False)
        return _save(fig, scene, paths)
    finally:
        plt.close(fig)


def _set_title(ax: Any, scene: Scene) -> None:
    title = scene.title if len(scene.title) <= 140 else scene.title[:139] + "…"
    ax.set_title(title, fontsize=9, loc="left")


def _save(fig: Any, scene: Scene, paths: Sequence[str | Path]) -> list[Path]:
    """The figure of ``scene``, its notes at the foot, laid out and written to every
    path (SVG or PNG by the suffix)."""
    if scene.notes:
        fig.text(0.01, 0.005, "\n".join(scene.notes)[:600], fontsize=7, va="bottom")
    fig.tight_layout()
    written = []
    for path in paths:
        target = Path(path)
        try:
            if target.parent != Path(""):
                target.parent.mkdir(parents=True, exist_ok=True)
            if target.suffix.lower() == ".svg":
                fig.savefig(target, format="svg", metadata={"Date": None})
            else:
                fig.savefig(target, format="png", dpi=110, metadata={"Software": None})
        except OSError as exc:
            raise UsageError(f"cannot write {path}: {exc.strerror or exc}") from None
        written.append(target)
    return written


def _draw_timeline(scene: Scene, paths: Sequence[str | Path]) -> list[Path]:
    """A timeline scene as swim lanes: x the scheduler step, one lane per request, each
    event a labelled mark (deferrals yellow, exceptions red), named steps shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    requests = sorted({request for _, request, _ in scene.timeline})
    lane = {request: i for i, request in enumerate(reversed(requests))}
    steps = [s for s, _, _ in scene.timeline]
    plt.rcParams["svg.hashsalt"] = "kvcontract"
    fig, ax = plt.subplots(figsize=(12, 2.2 + 1.3 * len(requests)))
    try:
        for step in sorted(scene.offending_steps):
            ax.axvspan(step - 0.45, step + 0.45, color="#f4cccc", zorder=0)
        placed: dict[tuple[int, str], int] = {}
        last_text: dict[tuple[str, int], str] = {}
        for step, request, text in scene.timeline:
            height = placed.get((step, request), 0)
            placed[(step, request)] = height + 1
            colour = "#cc0000" if "RAISED" in text else (
                "#e69138" if "deferred" in text else "#3d85c6")
            y = lane[request] + 0.14 * height - 0.3
            ax.plot(step, y, marker="o", markersize=4, color=colour, zorder=3)
            # A label the lane showed at the same height one step before (a deferral
            # repeated step after step) is drawn once: the marks say it goes on.
            if last_text.get((request, height)) != text:
                ax.text(step + 0.06, y + 0.03, text[:30], fontsize=5.5, rotation=18,
                        va="bottom", zorder=4)
            last_text[(request, height)] = text
        ax.set_yticks(range(len(requests)))
        ax.set_yticklabels(list(reversed(requests)), fontsize=8)
        ax.set_xlim(min(steps, default=0) - 0.6, max(steps, default=0) + 1.6)
        ax.set_ylim(-0.7, len(requests) - 0.2)
        ax.set_xlabel("scheduler step")
        _set_title(ax, scene)
        return _save(fig, scene, paths)
    finally:
        plt.close(fig)


# -- command-line inputs ----------------------------------------------------------------------
def parse_geometry(text: str) -> Geometry:
    """A geometry from inline JSON or a JSON file (``Geometry.to_dict`` shape)."""
    stripped = text.strip()
    source = "--geometry"
    if not stripped.startswith("{"):
        source = text
        stripped = read_text_file(text, "a geometry")
    data = parse_json(stripped, source, "a geometry")
    if isinstance(data, dict) and "geometry" in data and "groups" not in data:
        data = data["geometry"]
    if not isinstance(data, dict):
        raise InputFileError(source, "a geometry is a JSON object with a 'groups' list")
    problem = geometry_problem(data)
    if problem is not None:
        raise InputFileError(source, problem)
    return Geometry.from_dict(data)


def geometry_problem(data: Any) -> str | None:
    """What :meth:`Geometry.from_dict` would accept but no geometry means (a non-boolean
    ``eagle``, an ``extra`` that is not an object), or None."""
    if not isinstance(data, Mapping):
        return None  # from_dict reports it
    groups = data.get("groups")
    for index, group in enumerate(groups if isinstance(groups, list) else []):
        if isinstance(group, Mapping) and not isinstance(group.get("eagle", False), bool):
            return f"groups[{index}].eagle must be true or false, not {group['eagle']!r}"
    if "extra" in data and not isinstance(data["extra"], Mapping):
        return f"'extra' must be an object, not {data['extra']!r}"
    return None


_STATE_LETTERS = {"H": HIT, "P": HIT_PENDING, "M": MISS, "R": RETRY}


def parse_states(specs: Sequence[str]) -> dict[int, list[LookupResult]]:
    """``--states G=HHMP`` (one letter per chunk: H hit, P pending, M miss, R retry)."""
    states: dict[int, list[LookupResult]] = {}
    for spec in specs:
        group, sep, letters = spec.partition("=")
        if not sep or not group.strip().isdigit():
            raise UsageError(f"--states {spec!r}: expected GROUP=LETTERS, e.g. 1=HHMP")
        bad = sorted({ch for ch in letters.upper() if ch not in _STATE_LETTERS})
        if bad:
            raise UsageError(
                f"--states {spec!r}: unknown letters {bad}; use H (hit), P (pending), "
                "M (miss), R (retry)"
            )
        if int(group) in states:
            raise UsageError(f"--states {spec!r}: group {int(group)} is given twice")
        states[int(group)] = [_STATE_LETTERS[ch] for ch in letters.upper()]
    return states


def slug(text: str) -> str:
    """A file-name-safe form of a theorem id."""
    import re

    return re.sub(r"[^A-Za-z0-9]+", "_", text).strip("_").lower()
