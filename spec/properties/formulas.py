"""Formula properties: retention, windows and load sets (C1, C2, C4), and store
reachability (C7, C8), for unbounded token counts, windows and extra-retained tokens.

Each statement names its hypotheses (the domain) and its goal; ``impl`` functions are
the implementation under test (called through :meth:`Env.call`), ``spec`` functions the
ground truth (what a token attends and retains). Each property's picture (what
``explain`` highlights for a witness) is written next to its statement.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping

from kvcontract.impl.bundle import Implementation
from kvcontract.spec import retention as spec_ret
from kvcontract.spec.arith import (
    Bool,
    Num,
    and_,
    any_of,
    cdiv,
    floordiv,
    implies,
    in_range,
    max_,
    or_,
)
from kvcontract.spec.geometry import Geometry, fa, swa
from kvcontract.spec.models import list_presets, preset_geometries
from kvcontract.spec.properties import domains
from kvcontract.spec.properties.base import Config, Env, FormulaProperty, Picture
from kvcontract.spec.reachability import demanded_chunk_range


def _swa_hyps(env: Env) -> list[Bool]:
    return [env["bs"] >= 1, env["sw"] >= 2, env["e"] >= 0]


# -- C1 ---------------------------------------------------------------------------
def retained_blocks_exact(env: Env, impl: Implementation) -> tuple[list[Bool], Bool]:
    n, i, bs, sw, e = env["n"], env["i"], env["bs"], env["sw"], env["e"]
    hyps = [*_swa_hyps(env), n >= 0, i >= 0]
    env.assume(hyps)
    first, end = env.call(impl.retained_block_range, n, bs, sw, e)
    kept_from, kept_to = spec_ret.retained_token_range(n, sw, e)
    holds_retained_token = and_(i * bs < kept_to, (i + 1) * bs > kept_from)
    # Block indices start at 0: a range starting below it names blocks that do not exist
    # (the membership test alone only looks at blocks >= 0).
    return hyps, and_(first >= 0, in_range(i, first, end) == holds_retained_token)


def load_set_exact(env: Env, impl: Implementation) -> tuple[list[Bool], Bool]:
    hit, local_blocks, c = env["N"], env["Lb"], env["c"]
    bs, bpc, sw, e = env["bs"], env["bpc"], env["sw"], env["e"]
    local = local_blocks * bs
    hyps = [*_swa_hyps(env), bpc >= 1, local_blocks >= 0, hit > local, c >= 0]
    env.assume(hyps)
    lo, hi = env.call(impl.load_chunk_range, hit, local, bs, bpc, sw, e)
    ret_lo, ret_hi = spec_ret.retained_block_range(hit, bs, sw, e)
    fresh_lo = max_(local_blocks, ret_lo)
    chunk_has_fresh_block = and_(c * bpc < ret_hi, c * bpc + bpc > fresh_lo)
    return hyps, in_range(c, lo, hi) == chunk_has_fresh_block


def allocation_bound(env: Env, impl: Implementation) -> tuple[list[Bool], Bool]:
    hit, local_blocks = env["N"], env["Lb"]
    bs, bpc, sw, e = env["bs"], env["bpc"], env["sw"], env["e"]
    local = local_blocks * bs
    hyps = [*_swa_hyps(env), bpc >= 1, local_blocks >= 0, hit > local]
    env.assume(hyps)
    window = env.call(impl.get_sliding_window_size_in_chunks, sw, e, bs * bpc)
    return hyps, spec_ret.allocation_bound_holds(hit, local, bs, bpc, sw, e, window)


# -- C2 ---------------------------------------------------------------------------
def first_run_covers_load(env: Env, impl: Implementation) -> tuple[list[Bool], Bool]:
    hit, local_blocks = env["N"], env["Lb"]
    bs, bpc, sw, e = env["bs"], env["bpc"], env["sw"], env["e"]
    tpc = bs * bpc
    local = local_blocks * bs
    hyps = [*_swa_hyps(env), bpc >= 1, local_blocks >= 0, hit > local]
    env.assume(hyps)
    end = cdiv(hit, tpc)
    window = env.call(impl.load_window_size_in_chunks, hit, sw, e, tpc)
    checked_from = max_(floordiv(local, tpc), end - window)
    lo, hi = env.call(impl.load_chunk_range, hit, local, bs, bpc, sw, e)
    return hyps, and_(lo >= checked_from, hi <= end)


def later_run_covers_load(env: Env, impl: Implementation) -> tuple[list[Bool], Bool]:
    j, local_blocks = env["j"], env["Lb"]
    bs, bpc, sw, e = env["bs"], env["bpc"], env["sw"], env["e"]
    tpc = bs * bpc
    local = local_blocks * bs
    hit = j * tpc
    hyps = [*_swa_hyps(env), bpc >= 1, local_blocks >= 0, hit > local]
    env.assume(hyps)
    window = env.call(impl.get_sliding_window_size_in_chunks, sw, e, tpc)
    checked_from = max_(floordiv(local, tpc), j - window)
    lo, hi = env.call(impl.load_chunk_range, hit, local, bs, bpc, sw, e)
    return hyps, and_(lo >= checked_from, hi <= j)


# -- C4 ---------------------------------------------------------------------------
def load_window_not_over_demanding(env: Env, impl: Implementation) -> tuple[list[Bool], Bool]:
    hit, bs, bpc, sw, e = env["N"], env["bs"], env["bpc"], env["sw"], env["e"]
    tpc = bs * bpc
    hyps = [*_swa_hyps(env), bpc >= 1, hit > 0]
    env.assume(hyps)
    window = env.call(impl.load_window_size_in_chunks, hit, sw, e, tpc)
    lo, hi = spec_ret.load_chunk_range(hit, 0, bs, bpc, sw, e)
    # Once history was skipped the load set is a window ending at the last chunk; the
    # lookup must not demand more chunks than that set holds.
    return hyps, or_(spec_ret.skipped_tokens(hit, sw, e) == 0, window <= hi - lo)


def window_not_over_demanding(env: Env, impl: Implementation) -> tuple[list[Bool], Bool]:
    j, bs, bpc, sw, e = env["j"], env["bs"], env["bpc"], env["sw"], env["e"]
    tpc = bs * bpc
    hit = j * tpc
    hyps = [*_swa_hyps(env), bpc >= 1, j >= 1]
    env.assume(hyps)
    window = env.call(impl.get_sliding_window_size_in_chunks, sw, e, tpc)
    lo, hi = spec_ret.load_chunk_range(hit, 0, bs, bpc, sw, e)
    return hyps, or_(spec_ret.skipped_tokens(hit, sw, e) == 0, window <= hi - lo)


# -- C7 / C8: store reachability ----------------------------------------------------
def _mask_env(env: Env) -> tuple[int, int, int, bool, int | None]:
    retention = env["R"]
    return (
        env["A"],
        env["B"],
        env["bpc"],
        bool(env["eagle"]),
        (None if retention < 0 else retention),
    )


def _chunk_stored(
    env: Env,
    impl: Implementation,
    chunk: Num,
    final_end_chunk: Num,
    replay_blocks: tuple[Num, ...],
) -> Bool:
    align, block_tokens, bpc, eagle, retention = _mask_env(env)
    return any_of(
        [
            env.call(
                impl.is_block_reachable,
                chunk * bpc + k,
                align,
                block_tokens,
                env["sw"],
                env["e"],
                eagle,
                retention,
                final_end_chunk * bpc,
                replay_blocks,
                bpc,
                generalize=(1, 2),
            )
            for k in range(bpc)
        ]
    )


def _residue_hyps(env: Env, index: Num) -> list[Bool]:
    """``index = L * q + j`` for the configuration's residue ``j`` (see below)."""
    period, residue, quotient = env["L"], env["j"], env["q"]
    return [index == period * quotient + residue, quotient >= 0]


def _boundary_residues(
    configs: list[Config], step_tokens: Callable[[Mapping[str, int]], int]
) -> list[Config]:
    """Split each configuration by the boundary index modulo ``L``.

    Boundaries ``k * step`` fall at ``L = tpc / gcd(step, tpc)`` different offsets inside
    a chunk, repeating with period ``L`` in ``k``. Fixing ``k mod L`` (a complete case
    split: ``k = L*q + j``, ``q >= 0``, every ``j < L``) makes the chunk arithmetic of
    the boundary linear in ``q``; measured on FA 528 / SWA 64 / bpc 4, Z3 then needs
    1.8M resources over the four residues instead of 5-60M (or unknown at 100M,
    depending on the seed) for the unsplit query.
    """
    split = []
    for config in configs:
        values = config.values
        step = step_tokens(values)
        tpc = values["B"] * values["bpc"]
        period = tpc // math.gcd(step, tpc) if step > 0 else 1
        for residue in range(period):
            split.append(
                Config(
                    f"{config.label}, index = {period}q+{residue}",
                    {**values, "L": period, "j": residue},
                )
            )
    return split


def _segment_tokens(values: Mapping[str, int]) -> int:
    return values["A"] if values["R"] < 0 else values["R"]


def _alignment_tokens(values: Mapping[str, int]) -> int:
    return values["A"]


def _residue_configs(eagle: bool, retention: str,
                     step_tokens: Callable[[Mapping[str, int]], int]) -> list[Config]:
    """The mask configurations of ``eagle``/``retention``, split by the residue of the
    boundary index (:func:`_boundary_residues`) for boundaries ``k * step_tokens``."""
    return _boundary_residues(_mask_configs(eagle, retention), step_tokens)


def segment_boundaries_supplied(env: Env, impl: Implementation) -> tuple[list[Bool], Bool]:
    """Every chunk a segment boundary ``k * S <= H`` demands is stored at horizon H."""
    align, block_tokens, bpc, eagle, retention = _mask_env(env)
    tpc = block_tokens * bpc
    segment = align if retention is None else retention
    k, horizon_chunks, c, sw, e = env["k"], env["Hc"], env["c"], env["sw"], env["e"]
    boundary = k * segment
    hyps: list[Bool] = [
        sw >= 2,
        e >= 0,
        k >= 1,
        horizon_chunks >= 1,
        c >= 0,
        *_residue_hyps(env, k),
    ]
    if segment == 0:
        hyps.append(False)  # no segment boundaries without segments (replay only)
    lo, hi = demanded_chunk_range(boundary, sw, e, tpc, eagle)
    hyps += [boundary <= horizon_chunks * tpc, in_range(c, lo, hi), hi <= horizon_chunks]
    env.assume(hyps)
    return hyps, _chunk_stored(env, impl, c, horizon_chunks, ())


def final_boundary_supplied(env: Env, impl: Implementation) -> tuple[list[Bool], Bool]:
    """Every chunk the final horizon (finish/abort) demands is stored (non-EAGLE)."""
    _align, block_tokens, bpc, eagle, retention = _mask_env(env)
    tpc = block_tokens * bpc
    horizon_chunks, c, sw, e = env["Hc"], env["c"], env["sw"], env["e"]
    hyps: list[Bool] = [sw >= 2, e >= 0, horizon_chunks >= 1, c >= 0]
    if eagle or retention == 0:
        hyps.append(False)  # EAGLE has no final boundary: its peek chunk never exists
    lo, hi = demanded_chunk_range(horizon_chunks * tpc, sw, e, tpc, False)
    hyps += [in_range(c, lo, hi)]
    env.assume(hyps)
    return hyps, _chunk_stored(env, impl, c, horizon_chunks, ())


def replay_boundary_supplied(env: Env, impl: Implementation) -> tuple[list[Bool], Bool]:
    """With a retention interval, the replay boundary's demand is stored."""
    align, block_tokens, bpc, eagle, retention = _mask_env(env)
    tpc = block_tokens * bpc
    horizon_chunks, c, sw, e, r = env["Hc"], env["c"], env["sw"], env["e"], env["r"]
    hyps: list[Bool] = [
        sw >= 2,
        e >= 0,
        horizon_chunks >= 1,
        c >= 0,
        r >= 1,
        *_residue_hyps(env, r),
    ]
    if retention is None:
        hyps.append(False)  # replay boundaries only exist with a retention interval
    boundary = r * align
    lo, hi = demanded_chunk_range(boundary, sw, e, tpc, eagle)
    hyps += [boundary <= horizon_chunks * tpc, in_range(c, lo, hi), hi <= horizon_chunks]
    env.assume(hyps)
    replay_blocks = (floordiv(boundary, block_tokens),)
    return hyps, _chunk_stored(env, impl, c, horizon_chunks, replay_blocks)


def stored_blocks_demanded(env: Env, impl: Implementation) -> tuple[list[Bool], Bool]:
    """A block the mask marks below the horizon is demanded by a reachable boundary.

    The reachable boundaries are the segment boundaries up to the horizon and the final
    horizon itself. Symbolically the goal names one witness boundary, the end of the
    block's segment (a stronger goal, so proving it proves the clause). On plain ints
    (the replay of a solver model) every reachable boundary is tried, so a model that
    only defeats the witness is not reported as a counterexample (it becomes UNKNOWN).
    """
    align, block_tokens, bpc, eagle, retention = _mask_env(env)
    tpc = block_tokens * bpc
    i, horizon_chunks, sw, e = env["i"], env["Hc"], env["sw"], env["e"]
    hyps: list[Bool] = [sw >= 2, e >= 0, horizon_chunks >= 1, i >= 0, i < horizon_chunks * bpc]
    if eagle or retention is not None:
        hyps.append(False)  # domain: non-EAGLE, segments of A (see ARCHITECTURE.md)
    env.assume(hyps)
    marked = env.call(
        impl.is_block_reachable,
        i,
        align,
        block_tokens,
        sw,
        e,
        eagle,
        retention,
        horizon_chunks * bpc,
        (),
        generalize=(1, 2),
    )
    per = align // block_tokens
    chunk = floordiv(i, bpc)
    segment_end = (floordiv(i, per) + 1) * align
    seg_lo, seg_hi = demanded_chunk_range(segment_end, sw, e, tpc, False)
    fin_lo, fin_hi = demanded_chunk_range(horizon_chunks * tpc, sw, e, tpc, False)
    demanded = or_(
        and_(segment_end <= horizon_chunks * tpc, in_range(chunk, seg_lo, seg_hi)),
        in_range(chunk, fin_lo, fin_hi),
    )
    if isinstance(horizon_chunks, int) and isinstance(i, int):
        boundaries = [k * align for k in range(1, horizon_chunks * tpc // align + 1)]
        demanded = any(
            in_range(chunk, *demanded_chunk_range(b, sw, e, tpc, False))
            for b in [*boundaries, horizon_chunks * tpc]
        )
    return hyps, implies(marked, demanded)


@functools.cache
def _preset_mask_sizes() -> tuple[tuple[int, int, int], ...]:
    """``(A, B, bpc)`` of every SWA group of every model preset (bpc 1, 4 and 16) where
    the mask applies (A a multiple of B) and the size grid lacks it: the mask theorems'
    sizes are split, not symbolic (the block mask's ``%`` and ``//`` by the period and
    the block size are nonlinear in symbolic sizes), so the presets are added by name."""
    grid = {(c.values["A"], c.values["B"], c.values["bpc"])
            for c in domains.mask_configs(False, "none")}
    sizes: set[tuple[int, int, int]] = set()
    for name in list_presets():
        for _label, geometry in preset_geometries(name):
            align = geometry.alignment_tokens
            for group in geometry.groups:
                if not group.is_swa or align is None:
                    continue
                block = geometry.block_tokens(group)
                key = (align, block, geometry.blocks_per_chunk)
                if align % block == 0 and key not in grid:
                    sizes.add(key)
    return tuple(sorted(sizes))


def _mask_configs(eagle: bool, retention: str) -> list[Config]:
    """The size grid of :func:`domains.mask_configs` and the presets' sizes it lacks."""
    configs: list[Config] = list(domains.mask_configs(eagle, retention))
    for align, block, bpc in _preset_mask_sizes():
        interval = {"none": -1, "zero": 0, "interval": 2 * align}[retention]
        configs.append(Config(
            f"preset A={align}, SWA bs={block}, bpc={bpc}, eagle={eagle}, "
            f"retention={retention}",
            {"A": align, "B": block, "bpc": bpc, "eagle": int(eagle), "R": interval}))
    return configs


MASK_DOMAIN = (domains.MASK_DOMAIN + ", and the (A, SWA bs, bpc) of every model preset "
               "(sizes split: the mask's % and // by symbolic sizes are nonlinear)")


def _w(name: str) -> tuple[str, ...]:
    return tuple(name.split())


# -- pictures: what a witness of each property highlights ------------------------------
def _swa_scene(v: Mapping[str, int]) -> tuple[Geometry, int, int, int, int, int, int, int]:
    """The one-group geometry of a retention/window witness and its numbers."""
    bs, bpc, sw, e = v["bs"], v.get("bpc", 1), v["sw"], v["e"]
    tpc = bs * bpc
    local = v.get("Lb", 0) * bs
    hit = v["N"] if "N" in v else (v["j"] * tpc if "j" in v else v["n"])
    return Geometry((swa(bs, sw, e),), blocks_per_chunk=bpc), hit, local, bs, bpc, sw, e, tpc


def _swa_picture(v: Mapping[str, int], offending: set[int], note: str) -> Picture:
    geometry, hit, local, *_ = _swa_scene(v)
    return Picture(geometry, max(hit, 1), hit, local, offending={0: offending}, notes=[note])


def _picture_retained(v: Mapping[str, int], impl: Implementation) -> Picture:
    _, hit, _, bs, bpc, sw, e, _ = _swa_scene(v)
    first, end = (int(x) for x in impl.retained_block_range(hit, bs, sw, e))
    return _swa_picture(v, {v["i"] // bpc},
                        f"the implementation keeps blocks [{first}, {end}); block {v['i']}")


def _picture_load_set(v: Mapping[str, int], impl: Implementation) -> Picture:
    _, hit, local, bs, bpc, sw, e, _ = _swa_scene(v)
    lo, hi = (int(x) for x in impl.load_chunk_range(hit, local, bs, bpc, sw, e))
    return _swa_picture(v, {v["c"]}, f"the implementation loads chunks [{lo}, {hi})")


def _picture_allocation(v: Mapping[str, int], impl: Implementation) -> Picture:
    _, hit, local, bs, bpc, sw, e, _ = _swa_scene(v)
    lo, hi = (int(x) for x in spec_ret.load_chunk_range(hit, local, bs, bpc, sw, e))
    return _swa_picture(v, set(range(lo, hi)), "the fresh blocks of this hit exceed W * bpc + 1")


def _picture_covers(first_run: bool) -> Callable[[Mapping[str, int], Implementation], Picture]:
    def picture(v: Mapping[str, int], impl: Implementation) -> Picture:
        _, hit, local, bs, bpc, sw, e, tpc = _swa_scene(v)
        if first_run:
            window = int(impl.load_window_size_in_chunks(hit, sw, e, tpc))
        else:
            window = int(impl.get_sliding_window_size_in_chunks(sw, e, tpc))
        end = int(cdiv(hit, tpc))
        checked_from = max(local // tpc, end - window)
        lo, hi = (int(x) for x in impl.load_chunk_range(hit, local, bs, bpc, sw, e))
        return _swa_picture(v, set(range(lo, checked_from)) | set(range(end, hi)),
                            f"the implementation checks chunks [{checked_from}, {end}) "
                            f"(window {window}) but loads [{lo}, {hi})")

    return picture


def _picture_window(load_window: bool) -> Callable[[Mapping[str, int], Implementation], Picture]:
    def picture(v: Mapping[str, int], impl: Implementation) -> Picture:
        _, hit, _, bs, bpc, sw, e, tpc = _swa_scene(v)
        if load_window:
            window = int(impl.load_window_size_in_chunks(hit, sw, e, tpc))
        else:
            window = int(impl.get_sliding_window_size_in_chunks(sw, e, tpc))
        lo, hi = (int(x) for x in spec_ret.load_chunk_range(hit, 0, bs, bpc, sw, e))
        return _swa_picture(v, set(range(hi - window, lo)),
                            f"the implementation demands {window} chunks ending at chunk "
                            f"{hi}; the load set is only [{lo}, {hi})")

    return picture


def mask_geometry(v: Mapping[str, int]) -> Geometry:
    """The geometry of a store-mask witness: an FA group of block ``A / bpc`` (which makes
    the alignment ``A``) and the SWA group of block ``B``."""
    retention = None if v["R"] < 0 else v["R"]
    return Geometry(
        (fa(v["A"] // v["bpc"]), swa(v["B"], v["sw"], v["e"], eagle=bool(v["eagle"]))),
        blocks_per_chunk=v["bpc"], retention_interval=retention,
    )


def _picture_mask(v: Mapping[str, int], impl: Implementation) -> Picture:
    """A store-mask witness: FA block A/bpc gives the alignment A; chunk c is demanded
    by the witness's boundary and never stored."""
    del impl
    retention = None if v["R"] < 0 else v["R"]
    geometry = mask_geometry(v)
    tpc = v["B"] * v["bpc"]
    horizon = v["Hc"]
    if "k" in v:
        boundary = v["k"] * (v["A"] if retention is None else retention)
    elif "r" in v:
        boundary = v["r"] * v["A"]
    else:
        boundary = horizon * tpc
    offending = {v["c"]} if "c" in v else {v["i"] // v["bpc"]}
    note = (f"chunk {v['c']} is demanded by boundary {boundary} and never stored" if "c" in v
            else f"block {v['i']} is stored but no reachable boundary demands it")
    return Picture(geometry, horizon * tpc, boundary, 0, offending={1: offending},
                   notes=[note])


SWA_LOAD = ("load_chunk_range",)
MASK = ("is_block_reachable",)


def formula_properties() -> list[FormulaProperty]:
    chunk = domains.chunk_configs
    properties = [
        FormulaProperty(
            "C1",
            "retained-blocks-exact",
            "Ret(n) holds exactly the blocks with a token the next token attends or retains",
            _w("n i sw e"),
            retained_blocks_exact,
            domains.block_configs,
            domains.BLOCK_DOMAIN,
            uses=("retained_block_range", "get_num_skipped_tokens"),
            picture=_picture_retained,
            symbolic_sizes=("bs",),
        ),
        FormulaProperty(
            "C1",
            "load-set-exact",
            "Load(N, L) holds exactly the chunks with a fresh retained block",
            _w("N Lb c sw e"),
            load_set_exact,
            chunk,
            domains.CHUNK_DOMAIN,
            uses=SWA_LOAD,
            picture=_picture_load_set,
            symbolic_sizes=("bs", "bpc"),
        ),
        FormulaProperty(
            "C1",
            "allocation-bound",
            "fresh blocks of a hit never exceed W * bpc + 1",
            _w("N Lb sw e"),
            allocation_bound,
            chunk,
            domains.CHUNK_DOMAIN,
            uses=("get_sliding_window_size_in_chunks",),
            picture=_picture_allocation,
            symbolic_sizes=("bs", "bpc"),
        ),
        FormulaProperty(
            "C2",
            "first-run-covers-load",
            "the window checked for a candidate boundary N covers Load(N, L)",
            _w("N Lb sw e"),
            first_run_covers_load,
            chunk,
            domains.CHUNK_DOMAIN,
            uses=("load_window_size_in_chunks", "load_chunk_range"),
            picture=_picture_covers(first_run=True),
            symbolic_sizes=("bs", "bpc"),
        ),
        FormulaProperty(
            "C2",
            "later-run-covers-load",
            "a W-window ending at chunk j covers Load(j * tpc, L)",
            _w("j Lb sw e"),
            later_run_covers_load,
            chunk,
            domains.CHUNK_DOMAIN,
            uses=("get_sliding_window_size_in_chunks", "load_chunk_range"),
            picture=_picture_covers(first_run=False),
            symbolic_sizes=("bs", "bpc"),
        ),
        FormulaProperty(
            "C4",
            "load-window-exact",
            "lw(N) demands no chunk outside Load(N, 0) once history is skipped",
            _w("N sw e"),
            load_window_not_over_demanding,
            chunk,
            domains.CHUNK_DOMAIN,
            uses=("load_window_size_in_chunks",),
            picture=_picture_window(load_window=True),
            symbolic_sizes=("bs", "bpc"),
        ),
        FormulaProperty(
            "C4",
            "window-exact",
            "W demands no chunk outside the load set of an aligned boundary",
            _w("j sw e"),
            window_not_over_demanding,
            chunk,
            domains.CHUNK_DOMAIN,
            uses=("get_sliding_window_size_in_chunks",),
            picture=_picture_window(load_window=False),
            symbolic_sizes=("bs", "bpc"),
        ),
    ]
    for eagle in (False, True):
        for retention in ("none", "interval"):
            tag = f"{'eagle' if eagle else 'plain'}-{retention}"
            properties.append(
                FormulaProperty(
                    "C7",
                    f"segment-boundaries-supplied[{tag}]",
                    "every chunk a segment boundary demands is stored",
                    _w("k Hc c sw e q"),
                    segment_boundaries_supplied,
                    functools.partial(_residue_configs, eagle, retention, _segment_tokens),
                    MASK_DOMAIN + f", eagle={eagle}, retention={retention}",
                    uses=MASK,
                    picture=_picture_mask,
                    geometry=mask_geometry,
                )
            )
    # Only dense retention keeps a final tail (``reachability.keeps_final_tail``): under
    # an interval the final partial segment is served at its replay boundaries alone.
    for retention in ("none",):
        properties.append(
            FormulaProperty(
                "C7",
                f"final-boundary-supplied[{retention}]",
                "every chunk the final horizon demands is stored",
                _w("Hc c sw e"),
                final_boundary_supplied,
                functools.partial(_mask_configs, False, retention),
                MASK_DOMAIN + f", eagle=False, retention={retention}",
                uses=MASK,
                picture=_picture_mask,
                geometry=mask_geometry,
            )
        )
    for eagle in (False, True):
        for retention in ("zero", "interval"):
            properties.append(
                FormulaProperty(
                    "C7",
                    f"replay-boundary-supplied[{'eagle' if eagle else 'plain'}-{retention}]",
                    "every chunk the replay boundary demands is stored",
                    _w("r Hc c sw e q"),
                    replay_boundary_supplied,
                    functools.partial(_residue_configs, eagle, retention, _alignment_tokens),
                    MASK_DOMAIN + f", eagle={eagle}, retention={retention}",
                    uses=MASK,
                    picture=_picture_mask,
                    geometry=mask_geometry,
                )
            )
    # Once unknown on 33-block periods even at 400M rlimit (with the path-chain lift);
    # with the decision-tree lift and the solver portfolio every configuration is
    # decided within 2.1M (measured: 21M over the 131 configurations, 9 s).
    properties.append(
        FormulaProperty(
            "C8",
            "stored-blocks-demanded",
            "every block the mask marks below the horizon is demanded by a reachable boundary",
            _w("i Hc sw e"),
            stored_blocks_demanded,
            lambda: _mask_configs(False, "none"),
            MASK_DOMAIN + ", eagle=False, retention=none",
            uses=MASK,
            picture=_picture_mask,
            geometry=mask_geometry,
        )
    )
    return properties
