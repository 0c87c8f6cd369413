"""``kvcontract explain``: a scenario or a counterexample drawn on the token axis."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import click

from kvcontract.errors import UsageError
from kvcontract.tools.commands._common import (
    check_int,
    check_output_file,
    check_output_folder,
    check_report_witnesses,
    make_console,
)


@click.command()
@click.option("--report", "report_path", metavar="FILE",
              help="draw witnesses of this JSON report (prove or audit)")
@click.option("--theorem", "theorems", multiple=True, metavar="ID",
              help="the result to draw, e.g. C2/first-run-covers-load (repeatable)")
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
def explain(report_path: str | None, theorems: tuple[str, ...], draw_all: bool,
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
        stray = [name for name, given in (("--theorem", bool(theorems)), ("--all", draw_all),
                                          ("--impl", impl_name is not None)) if given]
        if stray:
            raise UsageError(f"{', '.join(stray)}: only with --report FILE (they choose "
                             "which results of a report to draw, and on what)")
    scenes: list[tuple[str, Any]]
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


def _report_scenes(report_path: str, theorems: tuple[str, ...],
                   impl_name: str | None) -> list[tuple[str, Any]]:
    """The scenes of a report's results: the named theorems, else every counterexample
    with a witness (an empty list when there is none)."""
    from kvcontract.api import load_implementation
    from kvcontract.errors import InputFileError, KvContractError
    from kvcontract.impl.variants import VARIANTS
    from kvcontract.tools.explain import scene_from_result
    from kvcontract.tools.reports import load_report, normalize

    scenes: list[tuple[str, Any]] = []
    data = load_report(report_path)
    if impl_name is not None:
        impl = load_implementation(impl_name)
    else:
        try:
            impl = load_implementation(str(data["target"]))
        except KvContractError:
            raise UsageError(
                f"the report's target {data['target']!r} is not a registered implementation; "
                f"give --impl NAME ({', '.join(VARIANTS)}) or module:FILE.py to re-run its "
                "witnesses on"
            ) from None
    results = normalize(data)["results"]  # a fuzz report's differences as results too
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
            check_report_witnesses(data, report_path, match)
            scenes += [(f"{r['clause']}/{r['theorem']}", scene_from_result(r, impl))
                       for r in match]
    else:
        drawable = [r for r in results
                    if r.get("verdict") == "COUNTEREXAMPLE" and r.get("witness")]
        check_report_witnesses(data, report_path, drawable)
        for r in drawable:
            scenes.append((f"{r['clause']}/{r['theorem']}", scene_from_result(r, impl)))
    return scenes


def _flag_scene(geometry_text: str | None, fa_block: int | None, swa_block: int | None,
                sliding_window: int | None, extra: int, bpc: int, eagle: bool,
                retention: int | None, tokens: int | None, hit: int | None, local_hit: int,
                states: tuple[str, ...]) -> Any:
    """The scene the geometry and lookup options describe."""
    from kvcontract.spec.geometry import Geometry, fa, swa
    from kvcontract.tools.explain import build_scene, parse_geometry, parse_states
    from kvcontract.vocabulary import GroupKind

    for option, value, low in (("--fa-block", fa_block, 1), ("--swa-block", swa_block, 1),
                               ("--sliding-window", sliding_window, 1), ("--e", extra, 0),
                               ("--bpc", bpc, 1), ("--retention", retention, 0),
                               ("--tokens", tokens, 0), ("--hit", hit, 0),
                               ("--local", local_hit, 0)):
        check_int(option, value, low=low)
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
    parsed = parse_states(states)
    for g in parsed:
        if g >= len(geometry.groups):
            raise UsageError(
                f"--states {g}=...: the geometry has {len(geometry.groups)} groups "
                f"(0 to {len(geometry.groups) - 1})"
            )
    return build_scene(geometry, tokens, hit, local_hit, states=parsed or None)
