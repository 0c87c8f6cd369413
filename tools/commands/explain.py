"""``kvcontract explain``: a scenario or a counterexample drawn on the token axis."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import click

from kvcontract.errors import UsageError
from kvcontract.options import check_int
from kvcontract.tools.commands._common import (
    bind_report_target,
    check_output_file,
    check_output_folder,
    check_report_witnesses,
    load_replay_report,
    report_implementation,
)
from kvcontract.tools.reports.console import make_console


@click.command()
@click.option("--report", "report_path", metavar="FILE",
              help="draw witnesses of this JSON report (prove or audit)")
@click.option("--theorem", "theorems", multiple=True, metavar="ID",
              help="the result to draw, e.g. C2/first-run-covers-load (repeatable)")
@click.option("--defect", "defect_ids", multiple=True, metavar="ID",
              help="the headline witness of this defect of the report, e.g. D2852527febac "
                   "(repeatable; the report's summary names each defect's id)")
@click.option("--all", "draw_all", is_flag=True,
              help="draw every counterexample of the report (the default with --report)")
@click.option("--impl", "impl_name", default=None,
              help="implementation to re-run on a witness: a registered name or "
                   "module:FILE.py (default: the report's target)")
@click.option("--geometry", "geometry_text", metavar="JSON|FILE",
              help="geometry as inline JSON or a JSON file (Geometry.to_dict shape)")
@click.option("--fa-block", type=int, default=None, help="full-attention group block size")
@click.option("--swa-block", type=int, default=None, help="sliding-window group block size")
@click.option("--sliding-window", type=int, default=None, help="sliding window (tokens)")
@click.option("--e", "extra", type=int, default=0, show_default=True,
              help="extra retained tokens (MTP)")
@click.option("--bpc", type=int, default=1, show_default=True, help="GPU blocks per chunk")
@click.option("--eagle", is_flag=True, help="the SWA group is an EAGLE group")
@click.option("--retention", type=int, default=None, help="prefix-cache retention interval")
@click.option("--tokens", type=int, default=None, help="tokens of the request")
@click.option("--hit", type=int, default=None, help="the boundary N (accepted hit, tokens)")
@click.option("--local", "local_hit", type=int, default=0, show_default=True,
              help="local GPU hit L (tokens)")
@click.option("--states", "states", multiple=True, metavar="G=LETTERS",
              help="lookup states of group G, one letter per chunk: H hit, P pending, "
                   "M miss, R retry (repeatable)")
@click.option("--png", "png_path", metavar="FILE", help="write a PNG picture here")
@click.option("--svg", "svg_path", metavar="FILE", help="write an SVG picture here")
@click.option("--out", "out_dir", metavar="DIR",
              help="write NAME.png and NAME.svg per drawn scene into DIR")
@click.option("--quiet", is_flag=True, help="no terminal rendering")
def explain(report_path: str | None, theorems: tuple[str, ...], defect_ids: tuple[str, ...],
            draw_all: bool,
            impl_name: str | None, geometry_text: str | None, fa_block: int | None,
            swa_block: int | None, sliding_window: int | None, extra: int, bpc: int,
            eagle: bool, retention: int | None, tokens: int | None, hit: int | None,
            local_hit: int, states: tuple[str, ...], png_path: str | None,
            svg_path: str | None, out_dir: str | None, quiet: bool) -> None:
    """Draw a scenario or a counterexample on the token axis (terminal, PNG, SVG)."""
    from kvcontract.tools.explain import draw, render_terminal, slug

    # Every input is validated before anything is drawn (issue #11).
    for option, path, suffix in (("--png", png_path, ".png"), ("--svg", svg_path, ".svg")):
        if path is not None:
            check_output_file(option, path)
            if Path(path).suffix.lower() != suffix:
                raise UsageError(f"{option} {path}: the file name must end in {suffix}")
    if out_dir is not None:
        check_output_folder("--out", out_dir)
    geometry_given = [name for name, value in (
        ("--geometry", geometry_text), ("--fa-block", fa_block), ("--swa-block", swa_block),
        ("--sliding-window", sliding_window), ("--retention", retention),
        ("--tokens", tokens), ("--hit", hit), ("--states", states or None),
    ) if value is not None] + [name for name, given in (
        ("--e", extra != 0), ("--bpc", bpc != 1), ("--eagle", eagle),
        ("--local", local_hit != 0),
    ) if given]
    if report_path and geometry_given:
        raise UsageError(
            f"--report draws the report's witnesses; {', '.join(geometry_given)} describe "
            "a scenario of your own: give one or the other"
        )
    if not report_path:
        stray = [name for name, given in (("--theorem", bool(theorems)),
                                          ("--defect", bool(defect_ids)), ("--all", draw_all),
                                          ("--impl", impl_name is not None)) if given]
        if stray:
            raise UsageError(f"{', '.join(stray)}: only with --report FILE (they choose "
                             "which results of a report to draw, and on what)")
    scenes: list[tuple[str, Any]]
    if report_path and defect_ids:
        theorems = (*theorems, *defect_theorems(report_path, defect_ids))
    if report_path and theorems:
        theorems = _print_live_lifecycle(report_path, theorems)
        if not theorems:
            return
    if report_path:
        scenes = _report_scenes(report_path, theorems, impl_name)
        if not scenes:
            click.echo(f"{report_path}: no counterexample to draw")
            return
    else:
        scenes = [("scenario", _flag_scene(
            geometry_text, fa_block, swa_block, sliding_window, extra, bpc, eagle, retention,
            tokens, hit, local_hit, states,
        ))]
    if (png_path or svg_path) and len(scenes) > 1:
        raise UsageError(f"{len(scenes)} scenes to draw: use --out DIR instead of --png/--svg")
    console = make_console()
    for name, scene in scenes:
        paths = [p for p in (png_path, svg_path) if p]
        if out_dir:
            paths += [str(Path(out_dir) / f"{slug(name)}.{ext}") for ext in ("png", "svg")]
        written = draw(scene, paths) if paths else []
        if not quiet:
            console.print(render_terminal(scene))
            console.print()
        for picture in written:
            click.echo(f"wrote {picture}")


def _print_live_lifecycle(report_path: str, theorems: tuple[str, ...]) -> tuple[str, ...]:
    """Print the audit's live lifecycle findings among ``theorems`` (``Cn/live-NAME``: a
    scenario run on vLLM itself, nothing to draw on the token axis): the scenario, its
    outcome, its findings and the command that replays it; the other theorems are
    returned to be drawn."""
    data = load_replay_report(report_path)
    rows = {f"{r.get('clause')}/{r.get('theorem')}": r for r in data.get("results") or []
            if isinstance(r, Mapping)
            and (r.get("witness") or {}).get("kind") == "live-lifecycle"}
    rest: list[str] = []
    for theorem in theorems:
        row = rows.get(theorem)
        if row is None:
            rest.append(theorem)
            continue
        witness = row["witness"]
        click.echo(f"{theorem}: {row.get('verdict')} ({row.get('impact')}), {row.get('live')}")
        click.echo(f"  scenario {witness.get('scenario')}: {witness.get('outcome')}")
        for finding in witness.get("findings") or []:
            click.echo(f"  - {finding}")
        click.echo(f"  replay: kvcontract live --scenario {witness.get('scenario')}")
    return tuple(rest)


def defect_theorems(report_path: str, defect_ids: tuple[str, ...]) -> list[str]:
    """The headline theorem of each named defect of a report (``defects``: an audit's, or
    a prove report's); an input error names an unknown id and the report's ids."""
    from kvcontract.errors import InputFileError

    data = load_replay_report(report_path)
    defects = {str(d.get("id")): d for d in data.get("defects") or []
               if isinstance(d, Mapping)}
    if not defects:
        raise InputFileError(report_path, "the report lists no defects (an audit or prove "
                                          "report with counterexamples has them): use "
                                          "--theorem ID")
    drawable = {f"{r.get('clause')}/{r.get('theorem')}" for r in data.get("results") or []
                if isinstance(r, Mapping) and r.get("verdict") == "COUNTEREXAMPLE"
                and isinstance(r.get("witness"), Mapping)
                and r["witness"].get("kind") in ("arith", "exhaustive")}
    found = []
    for wanted in defect_ids:
        defect = defects.get(wanted)
        if defect is None:
            raise UsageError(f"--defect {wanted}: not a defect of {report_path}; its defects: "
                             f"{', '.join(defects)}")
        headline = str(defect["witness"]["theorem"])
        # A headline without a picture (a system program): the defect's first theorem
        # that has one, else the headline (refused, saying why).
        pictured = [t for t in defect.get("theorems") or [] if t in drawable]
        found.append(headline if headline in drawable or not pictured else str(pictured[0]))
    return found


def _report_scenes(report_path: str, theorems: tuple[str, ...],
                   impl_name: str | None) -> list[tuple[str, Any]]:
    """The scenes of a report's results: the named theorems, else every counterexample
    with a witness that has a picture (an empty list when there is none).

    Any report kvcontract writes: a prove, fuzz or merge report replays on its target,
    an audit report on ``builtin:NAME``'s implementation, or on the upstream functions
    of ``vllm:PATH``/``module:FILE.py`` bound again (the audit's own theorems of
    upstream code included); ``--impl`` replays on another implementation instead."""
    from kvcontract.api import load_implementation
    from kvcontract.errors import InputFileError, KvContractError
    from kvcontract.impl.variants import VARIANTS
    from kvcontract.tools.explain import scene_from_result
    from kvcontract.tools.reports import normalize

    data = load_replay_report(report_path)
    name, upstream = report_implementation(data)
    bound = None
    if impl_name is not None:
        impl = load_implementation(impl_name)
    elif upstream is not None:
        bound = bind_report_target(upstream, report_path)
        impl = bound.implementation
    else:
        try:
            impl = load_implementation(str(name))
        except KvContractError:
            raise UsageError(
                f"the report's target {data['target']!r} is not a registered implementation; "
                f"give --impl NAME ({', '.join(VARIANTS)}) or module:FILE.py to re-run its "
                "witnesses on"
            ) from None
    results = normalize(data)["results"]  # a fuzz report's differences as results too
    # who judged each row (an audit's: vLLM's engine, its functions or stand-ins)
    judged = {(r.get("clause"), r.get("theorem")): r.get("judge")
              for r in data.get("results") or [] if isinstance(r, Mapping)}

    def scene(result: Mapping[str, Any]) -> tuple[str, Any]:
        theorem_id = f"{result['clause']}/{result['theorem']}"
        witness = result.get("witness")
        drawable = isinstance(witness, Mapping) and witness.get("kind") in ("arith",
                                                                            "exhaustive")
        # A witness without a picture (a system program, a fuzz difference) is refused by
        # scene_from_result saying why, before its theorem is looked up (a system row
        # names a scenario, not a theorem of the catalogue).
        prop = _theorem(theorem_id, bound) if drawable else None
        observe = None
        if bound is not None and prop is not None and \
                judged.get((result.get("clause"), result.get("theorem"))) == "engine":
            from kvcontract.tools.audit.on_engine import engine_observer

            observe = engine_observer(bound, prop)  # drawn where the audit judged it
        return theorem_id, scene_from_result(result, impl, prop, observe)

    def check(rows: list[Mapping[str, Any]]) -> None:
        if bound is None:
            check_report_witnesses(data, report_path, rows)
        else:
            _check_upstream_witnesses(report_path, rows, bound)

    wanted_rows: list[Mapping[str, Any]] = []
    if theorems:
        for wanted in theorems:
            match = [r for r in results
                     if wanted in (f"{r.get('clause')}/{r.get('theorem')}", r.get("theorem"))]
            if not match:
                known = [f"{r.get('clause')}/{r.get('theorem')}" for r in results
                         if r.get("witness")]
                raise InputFileError(
                    report_path,
                    f"no result for theorem {wanted!r}; results with a witness: "
                    + (", ".join(known) or "none"),
                )
            check(match)
            wanted_rows += match
    else:
        found = [r for r in results if r.get("verdict") == "COUNTEREXAMPLE" and r.get("witness")]
        drawable = [r for r in found if r["witness"].get("kind") in ("arith", "exhaustive")]
        if found and not drawable:
            scene(found[0])  # refused, saying why (a system program has no picture)
        for r in found:
            if r not in drawable:
                click.echo(f"{r['clause']}/{r['theorem']}: not drawn: a witness of kind "
                           f"{r['witness'].get('kind')!r} is a program of the executable "
                           "system, not one scenario (replay it with `kvcontract fuzz` or "
                           "the audit)", err=True)
        check(drawable)
        wanted_rows += drawable
    # Every counterexample (no --theorem): one whose picture cannot be drawn is named on
    # stderr and the others are drawn; a named one that cannot be drawn is the error.
    skip = not theorems
    if bound is None:
        scenes, skipped = _scenes(wanted_rows, scene, skip)
    else:
        scenes, skipped = _sandboxed_scenes(wanted_rows, scene, skip)
    if skipped and not scenes:
        from kvcontract.tools.explain import NoPicture

        raise NoPicture(skipped[0] if len(skipped) == 1 else
                        f"none of {len(skipped)} counterexamples drawn; {skipped[0]}")
    for line in skipped:
        click.echo(f"{line} (not drawn)", err=True)
    return scenes


def _scenes(rows: list[Mapping[str, Any]], scene: Any,
            skip: bool) -> tuple[list[tuple[str, Any]], list[str]]:
    """The scenes of ``rows``, and why each one skipped has none (``skip``: a picture
    that cannot be drawn, :class:`~kvcontract.tools.explain.NoPicture`, is skipped
    instead of raised)."""
    from kvcontract.tools.explain import NoPicture

    scenes: list[tuple[str, Any]] = []
    skipped: list[str] = []
    for row in rows:
        try:
            scenes.append(scene(row))
        except NoPicture as exc:
            if not skip:
                raise
            skipped.append(str(exc))
    return scenes, skipped


EXPLAIN_CALL_TIMEOUT = 10.0
"""Seconds of CPU time one upstream call may use while a picture re-runs it (the audit's
default ``--timeout``): a call past it makes the picture undecided (exit 3)."""

EXPLAIN_CPU_SECONDS = 900.0
"""CPU seconds the child that draws an audit report's pictures may use (a safety net)."""


def _sandboxed_scenes(rows: list[Mapping[str, Any]], scene: Any,
                      skip: bool) -> tuple[list[tuple[str, Any]], list[str]]:
    """:func:`_scenes` of an audit report of upstream code, computed in a sandbox child:
    a picture re-runs the bound upstream functions on its witness, and upstream code
    runs only in a child under the audit's limits (``tools/audit/sandbox``). An error of
    the child is raised here as it was raised there (exit 2 or 3); a child that did not
    finish (a hang, a crash) is undecided, exit 3."""
    from kvcontract.errors import KvContractError
    from kvcontract.tools.audit.sandbox import run_jobs
    from kvcontract.tools.explain import NoPicture

    def job() -> dict[str, Any]:
        try:
            scenes, skipped = _scenes(rows, scene, skip)
        except KvContractError as exc:
            return {"error": str(exc), "exit_code": getattr(exc, "exit_code", None)}
        return {"scenes": scenes, "skipped": skipped, "error": None}

    outcome = run_jobs([("pictures", job)], workers=1, job_timeout=EXPLAIN_CPU_SECONDS,
                       call_timeout=EXPLAIN_CALL_TIMEOUT)["pictures"]
    if not outcome.ok or outcome.value is None:
        raise NoPicture("no picture: re-running the bound code on the witnesses did not "
                        "finish: " + (outcome.error or "no result").splitlines()[0])
    value = outcome.value
    if value["error"] is not None:
        if value["exit_code"] == NoPicture.exit_code:
            raise NoPicture(str(value["error"]))
        raise UsageError(str(value["error"]))
    return list(value["scenes"]), list(value["skipped"])


def _theorem(theorem_id: str, bound: Any) -> Any:
    """The audit's theorem of that id on bound upstream code (None: the catalogue's)."""
    if bound is None:
        return None
    from kvcontract.tools.audit.reproduce import find_theorem

    return find_theorem(theorem_id, bound)


def _check_upstream_witnesses(report_path: str, rows: list[Mapping[str, Any]],
                              bound: Any) -> None:
    """Each witness of an audit report of upstream code is one of the audit's theorems
    on that code and decodes (else an input error naming the file and the theorem)."""
    from kvcontract.errors import InputFileError, UnknownPropertyError, WitnessError

    for row in rows:
        witness = row.get("witness")
        theorem_id = f"{row.get('clause')}/{row.get('theorem')}"
        if not isinstance(witness, Mapping) or witness.get("kind") not in (
                "arith", "exhaustive"):
            continue  # scene_from_result says why it has no picture
        try:
            from kvcontract.tools.audit.reproduce import decoded_theorem

            decoded_theorem(theorem_id, witness, bound)
        except (UsageError, WitnessError, UnknownPropertyError) as exc:
            raise InputFileError(report_path, f"{theorem_id}: cannot be replayed on "
                                              f"{bound.target.spec}: {exc}") from None


_WHAT = {"--fa-block": "tokens per block", "--swa-block": "tokens per block",
         "--sliding-window": "tokens", "--e": "extra retained tokens",
         "--bpc": "GPU blocks per chunk", "--retention": "tokens; 0 is vLLM's default",
         "--tokens": "the prompt's length in tokens", "--hit": "the boundary N in tokens",
         "--local": "the local GPU hit in tokens"}
"""What each scene option counts, for its range error."""


def _flag_scene(geometry_text: str | None, fa_block: int | None, swa_block: int | None,
                sliding_window: int | None, extra: int, bpc: int, eagle: bool,
                retention: int | None, tokens: int | None, hit: int | None, local_hit: int,
                states: tuple[str, ...]) -> Any:
    """The scene the geometry and lookup options describe."""
    from kvcontract.spec import multigroup
    from kvcontract.spec.geometry import Geometry, fa, swa
    from kvcontract.tools.explain import build_scene, parse_geometry, parse_states
    from kvcontract.vocabulary import GroupKind

    for option, value, low in (("--fa-block", fa_block, 1), ("--swa-block", swa_block, 1),
                               ("--sliding-window", sliding_window, 1), ("--e", extra, 0),
                               ("--bpc", bpc, 1), ("--retention", retention, 0),
                               ("--tokens", tokens, 1), ("--hit", hit, 0),
                               ("--local", local_hit, 0)):
        check_int(option, value, low=low, what=_WHAT.get(option, ""))
    if geometry_text:
        flags = [name for name, value in (
            ("--fa-block", fa_block), ("--swa-block", swa_block),
            ("--sliding-window", sliding_window), ("--retention", retention),
        ) if value is not None] + [name for name, given in (
            ("--e", extra != 0), ("--bpc", bpc != 1), ("--eagle", eagle)) if given]
        if flags:
            raise UsageError(f"--geometry describes the whole geometry; drop "
                             f"{', '.join(flags)} (or drop --geometry)")
        geometry = parse_geometry(geometry_text)
    else:
        if swa_block is None or sliding_window is None:
            raise UsageError(
                "give --geometry, or --swa-block and --sliding-window (and optionally "
                "--fa-block, --e, --bpc, --eagle, --retention), or --report"
            )
        groups = ([fa(fa_block)] if fa_block is not None else []) + [
            swa(swa_block, sliding_window, extra, eagle=eagle)
        ]
        geometry = Geometry(tuple(groups), blocks_per_chunk=bpc,
                            retention_interval=retention)
    if tokens is None:
        raise UsageError("--tokens N is required with a geometry")
    if hit is not None and hit > tokens:
        raise UsageError(f"--hit {hit} is larger than the prompt (--tokens {tokens}): a hit "
                         "covers at most the prompt's tokens")
    if local_hit > tokens:
        raise UsageError(f"--local {local_hit} is larger than the prompt (--tokens {tokens})")
    if hit is not None and local_hit > hit:
        raise UsageError(f"--local {local_hit} is larger than --hit {hit}: the boundary N "
                         "includes the local hit")
    step = math.lcm(*(geometry.block_tokens(g) for g in geometry.groups),
                    *(geometry.chunk_tokens(g) for g in geometry.groups
                      if g.kind is GroupKind.MAMBA))
    if local_hit % step:
        raise UsageError(
            f"--local {local_hit} is not a multiple of {step} tokens: a GPU prefix-cache "
            "hit ends on a block boundary of every group (and on a chunk of a Mamba group)"
        )
    chunks = {g: multigroup.complete_chunks(geometry, group, tokens)
              for g, group in enumerate(geometry.groups)}
    if not any(chunks.values()):
        finest = min(geometry.chunk_tokens(g) for g in geometry.groups)
        raise UsageError(
            f"--tokens {tokens}: the prompt holds no complete chunk (the finest group's "
            f"chunk is {finest} tokens), so the scene would be empty; give --tokens "
            f"{finest} or more"
        )
    parsed = parse_states(states)
    for g, letters in parsed.items():
        if g >= len(geometry.groups):
            raise UsageError(
                f"--states {g}=...: the geometry has {len(geometry.groups)} groups "
                f"(0 to {len(geometry.groups) - 1})"
            )
        if not letters:
            raise UsageError(f"--states {g}=: no letters; give one letter per chunk "
                             f"(group {g} has {chunks[g]} complete chunks)")
        if len(letters) > chunks[g]:
            tpc = geometry.chunk_tokens(geometry.groups[g])
            raise UsageError(
                f"--states {g}=...: {len(letters)} states, but group {g} has "
                f"{chunks[g]} complete chunks of {tpc} tokens in the {tokens}-token prompt "
                f"(give at most {chunks[g]} letters, or more --tokens)"
            )
    return build_scene(geometry, tokens, hit, local_hit, states=parsed or None)
