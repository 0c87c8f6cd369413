"""``kvcontract explain``: a scenario or a counterexample drawn on the token axis."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from kvcontract.errors import UsageError


@click.command()
@click.option("--report", "report_path", metavar="FILE",
              help="draw witnesses of this JSON report (prove or audit)")
@click.option("--theorem", "theorems", multiple=True, metavar="ID",
              help="the result to draw, e.g. C2/first-run-covers-load (repeatable)")
@click.option("--all", "draw_all", is_flag=True,
              help="draw every counterexample of the report (the default with --report)")
@click.option("--impl", "impl_name", default=None,
              help="implementation to re-run on a witness (default: the report's target)")
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
    console = Console(width=None if sys.stdout.isatty() else 160)
    for name, scene in scenes:
        paths = [p for p in (png_path, svg_path) if p]
        if out_dir:
            paths += [str(Path(out_dir) / f"{slug(name)}.{ext}") for ext in ("png", "svg")]
        written = draw(scene, paths) if paths else []
        if not quiet:
            console.print(render_terminal(scene))
            console.print()
        for path in written:
            click.echo(f"wrote {path}")


def _report_scenes(report_path: str, theorems: tuple[str, ...],
                   impl_name: str | None) -> list[tuple[str, Any]]:
    """The scenes of a report's results: the named theorems, else every counterexample
    with a witness (an empty list when there is none)."""
    from kvcontract.impl.variants import get_implementation
    from kvcontract.tools.explain import scene_from_result
    from kvcontract.tools.reports import load_report

    from kvcontract.errors import InputFileError

    scenes: list[tuple[str, Any]] = []
    data = load_report(report_path)
    impl = get_implementation(impl_name or str(data["target"]))
    results = data.get("results", [])
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
            scenes += [(f"{r['clause']}/{r['theorem']}", scene_from_result(r, impl))
                       for r in match]
    else:
        drawable = [r for r in results
                    if r.get("verdict") == "COUNTEREXAMPLE" and r.get("witness")]
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

    if geometry_text:
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
    parsed = parse_states(states)
    for g in parsed:
        if g >= len(geometry.groups):
            raise UsageError(
                f"--states {g}=...: the geometry has {len(geometry.groups)} groups"
            )
    return build_scene(geometry, tokens, hit, local_hit, states=parsed or None)
