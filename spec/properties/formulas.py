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
from typing import Any

from kvcontract.impl.bundle import Implementation
from kvcontract.spec import lookup as spec_lookup
from kvcontract.spec import multigroup
from kvcontract.spec import retention as spec_ret
from kvcontract.spec.arith import (
    Bool,
    Num,
    and_,
    any_of,
    cdiv,
    eq,
    floordiv,
    implies,
    in_range,
    is_symbolic,
    ite,
    ite_bool,
    max_,
    mod,
    not_,
    or_,
)
from kvcontract.spec.geometry import Geometry, GroupKind, fa, mamba, swa
from kvcontract.spec.lemmas import (
    CANCEL,
    CDIV_BOUNDS,
    DIV_MOD,
    MULTIPLE_MOD,
    MULTIPLES_EQUAL,
    QUOTIENT_IN_PERIOD,
)
from kvcontract.spec.lookup import load_window_chunks
from kvcontract.spec.models import list_presets, preset_geometries
from kvcontract.spec.properties import domains
from kvcontract.spec.properties.base import (
    Config,
    Env,
    FormulaProperty,
    Picture,
    Statement,
)
from kvcontract.spec.reachability import (
    demanded_chunk_range,
    final_tail_block,
    junction_boundary,
    owed_replay_boundary,
    replay_boundaries_owed,
    replay_window_block,
    segment_tail_block,
    store_need_blocks,
)


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


def mamba_retention_exact(env: Env, impl: Implementation) -> tuple[list[Bool], Bool]:
    """A Mamba group keeps exactly from the first block of the chunk holding its state at
    the last chunk end at or before ``n`` (block 0 before the first chunk end): freeing
    that chunk mid-chunk loses the state a hit at that end loads; keeping an older one
    holds GPU blocks nothing reads."""
    n, bs, bpc = env["n"], env["bs"], env["bpc"]
    hyps = [n >= 0, bs >= 1, bpc >= 1]
    env.assume(hyps)
    tpc = bs * bpc
    first = env.call(impl.mamba_first_live_block, n, tpc, bpc)
    return hyps, first == multigroup.mamba_first_live_block(n, tpc, bpc)


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


def cap_geometry(v: Mapping[str, int]) -> Geometry:
    """The geometry of a lookup-cap witness: full attention alone (``r = 0``: the whole
    request may hit) or with a sliding window (``r = 1``: the last token is recomputed)."""
    return Geometry((fa(4), swa(4, 8))) if v["r"] else Geometry((fa(4),))


def lookup_cap_exact(env: Env, impl: Implementation) -> tuple[list[Bool], Bool]:
    """The multi-group lookup's first candidate is the spec's: the request less its
    recomputed last token (:func:`multigroup.initial_max_hit`), then the budget
    (:func:`multigroup.lookup_cap`). A cap below it gives up the boundaries between (C4:
    a lost hit when one of them is the best present); one above it may answer past the
    budget or the last token.

    ``r`` selects a geometry with a window (1) or full attention alone (0), ``k`` a
    budget ``B`` (1) or none (0): the implementation branches on both in Python, so each
    of the four is lifted on its own and the goal conjoins them (one query)."""
    num_tokens, budget = env["N"], env["B"]
    hyps: list[Bool] = [num_tokens >= 1, budget >= 0, in_range(env["r"], 0, 2),
                        in_range(env["k"], 0, 2)]
    env.assume(hyps)
    parts: list[Bool] = []
    for windowed in (0, 1):
        geometry = cap_geometry({"r": windowed})
        for capped in (0, 1):
            cap_tokens = budget if capped else None
            cap = env.call(impl.initial_lookup_cap, num_tokens,
                           geometry.recomputes_last_token, cap_tokens)
            spec_cap = multigroup.lookup_cap(geometry, num_tokens, cap_tokens)
            parts.append(implies(and_(eq(env["r"], windowed), eq(env["k"], capped)),
                                 eq(cap, spec_cap)))
    return hyps, and_(*parts)


def _cap_configs() -> list[Config]:
    return [Config(f"{'window' if r else 'full'}-{'budget' if k else 'unbounded'}",
                   {"r": r, "k": k}) for r in (0, 1) for k in (0, 1)]


CAP_DOMAIN = ("every request length N >= 1 and budget B >= 0 (absolute: the local hit "
              "plus what a step may load), with and without a window, with and without "
              "a budget")


def _picture_cap(v: Mapping[str, int], impl: Implementation) -> Picture:
    geometry = cap_geometry(v)
    budget = v["B"] if v["k"] else None
    ours = int(impl.initial_lookup_cap(v["N"], geometry.recomputes_last_token, budget))
    spec_cap = int(multigroup.lookup_cap(geometry, v["N"], budget))
    return Picture(geometry, max(v["N"], 1), max(spec_cap, 0), notes=[
        f"request {v['N']} tokens, budget {budget}: the spec's first candidate is "
        f"{spec_cap}, the implementation's {ours}"])


# -- C4, C5: the block-hash mode (docs/CONTRACT.md 2.1) --------------------------------
def hash_mode_geometry(v: Mapping[str, int]) -> Geometry:
    """A geometry of the hash-mode witness: an EAGLE full-attention group and a plain
    sliding-window one, under legacy hashes (``h = 0``) or lookahead hashes of ``T``
    tokens (``h = 1``)."""
    return Geometry((fa(4, eagle=True), swa(4, 8)),
                    hash_lookahead=max(1, v.get("T", 1)) if v["h"] else 0)


def eagle_drop_per_hash_mode(env: Env, impl: Implementation) -> tuple[list[Bool], Bool]:
    """The lookup and the store path each drop a group's trailing block exactly where the
    spec's rule does (:meth:`Geometry.drops_eagle_block`): an EAGLE group (``x = 1``)
    under legacy hashes (``h = 0``, ``T = 0``), never under lookahead hashes of any
    ``T >= 1`` nor for another group. The spec's rule reads the mode only as ``T = 0``
    or not, so its value per configuration is read on a representative geometry; the
    implementation's are lifted for every ``T``. A drop where the spec has none peeks a
    chunk the producer does not store (C4, C12); none where it has one accepts a hit the
    GPU side would not serve."""
    lookahead = env["T"]
    hyps: list[Bool] = [in_range(env["x"], 0, 2), in_range(env["h"], 0, 2),
                        implies(eq(env["h"], 0), eq(lookahead, 0)),
                        implies(eq(env["h"], 1), lookahead >= 1)]
    env.assume(hyps)
    parts: list[Bool] = []
    for eagle in (0, 1):
        for mode in (0, 1):
            geometry = hash_mode_geometry({"h": mode})
            expected = geometry.drops_eagle_block(geometry.groups[0 if eagle else 1])
            for drops in (impl.lookup_drops_eagle_block, impl.store_drops_eagle_block):
                got = env.call(drops, bool(eagle), lookahead)
                parts.append(implies(and_(eq(env["x"], eagle), eq(env["h"], mode)),
                                     eq(got, expected)))
    return hyps, and_(*parts)


def _hash_mode_configs() -> list[Config]:
    return [Config(f"{'eagle' if x else 'plain'} group, "
                   f"{'lookahead' if h else 'legacy'} hashes", {"x": x, "h": h})
            for x in (0, 1) for h in (0, 1)]


def _picture_hash_mode(v: Mapping[str, int], impl: Implementation) -> Picture:
    geometry = hash_mode_geometry(v)
    group = geometry.groups[0 if v["x"] else 1]
    lookup = bool(impl.lookup_drops_eagle_block(group.eagle, geometry.hash_lookahead))
    store = bool(impl.store_drops_eagle_block(group.eagle, geometry.hash_lookahead))
    return Picture(geometry, 17, 0, notes=[
        f"{group.describe()} with hash lookahead {geometry.hash_lookahead}: the spec drops "
        f"{'its' if geometry.drops_eagle_block(group) else 'no'} trailing block; the "
        f"lookup {'drops' if lookup else 'keeps'} it, the store path "
        f"{'drops' if store else 'keeps'} it"])


def keys_cover_hashed_tokens(env: Env, impl: Implementation) -> tuple[list[Bool], Bool]:
    """A request's offload keys end where its block hashes do (``spec.lookup.hashed_tokens``:
    whole hash blocks with their ``T`` lookahead tokens): the lookup reads no key the
    producer could not have stored (a key past them is one vLLM never made), and none
    below is given up (C4)."""
    num_tokens, block, lookahead = env["n"], env["tph"], env["T"]
    hyps: list[Bool] = [num_tokens >= 0, block >= 1, in_range(env["h"], 0, 2),
                        implies(eq(env["h"], 0), eq(lookahead, 0)),
                        implies(eq(env["h"], 1), lookahead >= 1)]
    env.assume(hyps)
    if not is_symbolic(block) and block < 1:
        return hyps, True  # on ints outside the hypotheses: nothing to divide by
    keyed = env.call(impl.keyed_tokens, num_tokens, block, lookahead)
    return hyps, eq(keyed, spec_lookup.hashed_tokens(num_tokens, block, lookahead))


def _keys_configs() -> list[Config]:
    return [Config("legacy hashes", {"h": 0}), Config("lookahead hashes", {"h": 1})]


def _picture_keys(v: Mapping[str, int], impl: Implementation) -> Picture:
    geometry = Geometry((fa(4, eagle=True),), hash_lookahead=max(v["T"], 0))
    ours = int(impl.keyed_tokens(v["n"], v["tph"], v["T"]))
    spec_keyed = int(spec_lookup.hashed_tokens(v["n"], v["tph"], v["T"]))
    return Picture(geometry, max(v["n"], 1), 0, notes=[
        f"{v['n']} tokens, hash block {v['tph']}, lookahead {v['T']}: keys cover "
        f"{spec_keyed} tokens by the spec, {ours} by the implementation"])


# -- C12: the shared-prefix junction (docs/CONTRACT.md 9.3) ---------------------------
def junction_geometry_of(v: Mapping[str, int]) -> Geometry:
    """A geometry of the junction witness: FA + SWA with retention 0 (``q = 1``) or none."""
    return Geometry((fa(16), swa(4, 8)), retention_interval=0 if v["q"] else None)


def junction_rule_exact(env: Env, impl: Implementation) -> tuple[list[Bool], Bool]:
    """A request registers exactly the spec's junction (``reachability.junction_boundary``)
    for every full-attention boundary ``F``, local hit ``L``, hit ``h`` and retention:
    one it misses loses a later consumer the boundary (C12); one the spec does not owe
    stores a window nobody reads there. ``q`` selects a retention interval (1, any ``R``)
    or none (0): the implementation branches on it in Python, so each is lifted apart."""
    boundary, local, hit = env["F"], env["L"], env["h"]
    hyps: list[Bool] = [boundary >= 0, local >= 0, hit >= 0, env["R"] >= 0,
                        in_range(env["q"], 0, 2)]
    env.assume(hyps)
    parts: list[Bool] = []
    for interval in (0, 1):
        retention = env["R"] if interval else None
        got = env.call(impl.shared_prefix_junction, boundary, local, hit, retention)
        want = junction_boundary(boundary, local, hit, retention)
        parts.append(implies(eq(env["q"], interval), eq(got, want)))
    return hyps, and_(*parts)


def _junction_configs() -> list[Config]:
    return [Config("no retention interval", {"q": 0}),
            Config("a retention interval", {"q": 1})]


def _picture_junction(v: Mapping[str, int], impl: Implementation) -> Picture:
    geometry = junction_geometry_of(v)
    retention = v["R"] if v["q"] else None
    ours = int(impl.shared_prefix_junction(v["F"], v["L"], v["h"], retention))
    spec_value = int(junction_boundary(v["F"], v["L"], v["h"], retention))
    return Picture(geometry, max(v["F"], 1), 0, notes=[
        f"full-attention boundary {v['F']}, local hit {v['L']}, hit {v['h']}, retention "
        f"{retention}: the spec's junction is {spec_value}, the implementation's {ours}"])


# -- C10: block placement -------------------------------------------------------------
def store_blocks_placed(env: Env, impl: Implementation) -> tuple[list[Bool], Bool]:
    """Every live block a store job writes lands at its own offset (docs/CONTRACT.md 5,
    "Placement"): the block at ``p`` of the job's pages (its chunk's rank among the job's
    chunks times ``bpc``, plus its page) is written into slot ``p`` counted from the first
    page of the job's first chunk, i.e. into its own chunk at page ``block mod bpc``.

    For every pattern of null pages before it: the job's first live block is at page
    ``f`` of the first chunk (the ``f`` pages before it null), ``n`` null pages lie
    before ``p`` (those ``f`` and ``n - f`` interior ones, never the last page of a
    stored chunk: a chunk whose last block is null is not stored)."""
    p, f, n, bpc = env["p"], env["f"], env["n"], env["bpc"]
    # Positions strictly between f and p that are not the last page of a chunk.
    interior = (p - f - 1) - (floordiv(p, bpc) - floordiv(f + 1, bpc))
    hyps: list[Bool] = [
        bpc >= 1, in_range(f, 0, bpc), p >= f, n >= f,
        or_(and_(eq(p, f), eq(n, f)), and_(p > f, n - f <= interior)),
    ]
    env.assume(hyps)
    slot = env.call(impl.store_block_slot, p, f, n, bpc)
    return hyps, eq(slot, p)


PLACEMENT_DOMAIN = ("every job layout: blocks per chunk bpc >= 1, the job's first live "
                    "page f < bpc, every position p >= f of the job's pages and every count "
                    "n of null pages before it (the f leading ones, interior ones anywhere "
                    "but a stored chunk's last page)")


def _placement_configs() -> list[Config]:
    return [Config(f"bpc={bpc}", {"bpc": bpc}) for bpc in (1, 2, 4, 8, 16)]


def _picture_placement(v: Mapping[str, int], impl: Implementation) -> Picture:
    bpc = max(v["bpc"], 1)
    p = v["p"]
    slot = int(impl.store_block_slot(p, v["f"], v["n"], bpc))
    geometry = Geometry((fa(4), swa(4, 8)), blocks_per_chunk=bpc)
    return Picture(geometry, (p // bpc + 1) * bpc * 4, None, notes=[
        f"the job's first live block is page {v['f']} of its first chunk, {v['n']} null "
        f"pages lie before page {p % bpc} of its chunk {p // bpc} (job position {p}): the "
        f"job writes it into chunk {slot // bpc} page {slot % bpc}"])


# -- C7 / C8: store reachability ----------------------------------------------------
SYMBOLIC_MASK_SIZES = ("per", "B", "bpc", "a")
"""The sizes of the mask theorems proved for all values: the SWA block ``B``, blocks per
chunk ``bpc`` and the alignment ``A = per * B = a * bpc`` (``a``: the FA block that makes
the alignment, ``per``: SWA blocks per alignment)."""


def _mask_env(env: Env) -> tuple[list[Bool], Num, Num, Num, bool, Num | None]:
    """``(size hypotheses, A, B, bpc, eagle, retention)`` of a mask statement.

    A case split's configuration fixes ``A``, ``B``, ``bpc`` and ``R`` (-1: dense
    retention, 0: replay only, else the interval). The symbolic-size query names the
    sizes instead (:data:`SYMBOLIC_MASK_SIZES`): ``A = per * B = a * bpc``, and an
    interval ``R = rho * A`` (vLLM makes the interval a multiple of ``A``) when ``rho``
    is a variable.
    """
    values = env.values
    block_tokens = env["B"]
    if "A" in values:
        align = env["A"]
        hyps: list[Bool] = []
    else:
        align = env["per"] * block_tokens
        hyps = [block_tokens >= 1, env["per"] >= 1, env["bpc"] >= 1, env["a"] >= 1,
                env["a"] * env["bpc"] == align]
    retention: Num | None
    if "rho" in values:
        hyps.append(env["rho"] >= 1)
        retention = env["rho"] * align
    else:
        retention = None if env["R"] < 0 else env["R"]
    return hyps, align, block_tokens, env["bpc"], bool(env["eagle"]), retention


def _chunk_stored(
    env: Env,
    impl: Implementation,
    chunk: Num,
    final_end_chunk: Num,
    replay_blocks: tuple[Num, ...],
) -> Bool:
    _, align, block_tokens, bpc, eagle, retention = _mask_env(env)
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


def _window_block_stored(
    env: Env,
    impl: Implementation,
    chunk: Num,
    boundary_block: Num,
    final_end_chunk: Num,
    replay_blocks: tuple[Num, ...],
    segment: tuple[Num, Num] | None,
    eagle: bool,
    final_period: Num | None = None,
) -> Bool:
    """Chunk ``chunk``, demanded by a boundary at block ``boundary_block``, is stored:
    with symbolic sizes, through one witness block and a chain of lemmas.

    ``bpc`` is symbolic, so the chunk's blocks cannot be enumerated: the goal names the
    block that must be marked and asks that it lies in the chunk and that the mask marks
    it; a stronger goal, so proving it proves the clause. In the window the witness is
    ``max(chunk * bpc, boundary_block - need)`` (``need = cdiv(sw + e - 1, B)`` blocks
    reach back from the boundary: the window the mask marks); an EAGLE consumer's peek
    chunk (the chunk ``cdiv(N, tpc)`` after its window) is witnessed by its first block.
    The lemmas (each proved before use, :meth:`Env.lemma`; division facts by instance of
    a general lemma, :meth:`Env.instance`) split the nonlinear facts Z3 cannot decide in
    one query: the chunk's blocks from the demanded chunk range in tokens (``lw(N)``,
    the padding of ``N``), and, for a segment boundary ``k * S`` (``segment = (k, S)``,
    ``S`` blocks per segment), the witness's offset in its segment.
    """
    _, align, block_tokens, bpc, _eagle, retention = _mask_env(env)
    sw, e = env["sw"], env["e"]
    chunk_tokens = block_tokens * bpc
    boundary = boundary_block * block_tokens
    reach = sw - 1 + e  # tokens before the boundary the window needs
    padding = mod(-boundary, chunk_tokens)
    end = cdiv(boundary, chunk_tokens)
    window = load_window_chunks(boundary, sw, e, chunk_tokens)
    need = cdiv(sw + e - 1, block_tokens)
    peek = end * bpc  # the first block of an EAGLE consumer's peek chunk
    in_window = chunk < end

    def windowed(fact: Bool) -> Bool:
        # An EAGLE consumer also demands the peek chunk ``end``: the window's facts are
        # about the chunks before it.
        return implies(in_window, fact) if eagle else fact

    window_witness = max_(chunk * bpc, boundary_block - need)
    witness = ite(in_window, window_witness, peek) if eagle else window_witness
    # The demanded chunk's first block lies before the boundary block...
    env.instance(DIV_MOD, -boundary, chunk_tokens)
    env.lemma(end * chunk_tokens == boundary + padding)
    env.lemma(windowed(chunk * block_tokens * bpc < boundary_block * block_tokens))
    env.lemma(windowed(chunk * bpc < boundary_block))
    # ... and its end past the first block the window needs: lw(N) * tpc bounds it.
    env.lemma(padding >= 0)
    env.lemma(cdiv(reach, chunk_tokens) <= cdiv(reach + padding, chunk_tokens))
    env.lemma(window == cdiv(reach + padding, chunk_tokens))
    env.instance(CDIV_BOUNDS, reach + padding, chunk_tokens)
    env.lemma(chunk >= end - window)
    env.lemma(chunk * chunk_tokens >= (end - window) * chunk_tokens)
    env.lemma((chunk + 1) * bpc * block_tokens > boundary_block * block_tokens - reach)
    env.lemma(need * block_tokens >= reach)
    env.lemma((chunk + 1) * bpc > boundary_block - need)
    if eagle:
        # The peek chunk's first block: at the boundary block or less than a chunk past.
        env.instance(CDIV_BOUNDS, boundary, chunk_tokens)
        env.instance(CANCEL, boundary_block, peek, block_tokens)
        env.instance(CANCEL, peek, boundary_block + bpc, block_tokens)
        env.lemma(peek >= boundary_block)
        env.lemma(peek < boundary_block + bpc)
        env.instance(MULTIPLE_MOD, end, bpc)
    shift = 1 if eagle else 0
    if final_period is not None:
        # The final horizon m = q * S + partial: a witness past q * S is in the final
        # tail the mask marks, one before it in the last ``need`` blocks of segment q.
        quotient, partial = floordiv(boundary_block, final_period), mod(boundary_block,
                                                                       final_period)
        short = need < final_period
        before_tail = window_witness < boundary_block - partial
        env.instance(DIV_MOD, boundary_block, final_period)
        env.lemma(implies(and_(before_tail, short),
                          window_witness >= (quotient - 1) * final_period))
        env.instance(QUOTIENT_IN_PERIOD, window_witness, final_period, quotient)
        env.instance(DIV_MOD, window_witness, final_period)
        env.lemma(implies(and_(before_tail, short), mod(window_witness, final_period)
                          == window_witness - (quotient - 1) * final_period))
    if segment is not None:
        index, period = segment
        short = need < period
        # The window witness in the last ``need`` blocks before the segment's end (an
        # EAGLE mask looks one block later: ``(block - 1) % S``).
        offset = window_witness - shift
        env.lemma(windowed(implies(short, offset >= (index - 1) * period)))
        env.lemma(windowed(offset < index * period))
        env.instance(QUOTIENT_IN_PERIOD, offset, period, index)
        env.instance(DIV_MOD, offset, period)
        env.lemma(windowed(implies(short, mod(offset, period)
                                   == offset - (index - 1) * period)))
        if eagle:
            # The peek block: the segment's end itself (its offset is S - 1), or the
            # first block of the chunk after it (less than a chunk into the segment).
            env.instance(QUOTIENT_IN_PERIOD, peek - 1, period, index)
            env.instance(DIV_MOD, peek - 1, period)
            env.lemma(implies(peek == boundary_block, mod(peek - 1, period) == period - 1))
            env.instance(QUOTIENT_IN_PERIOD, peek, period, index + 1)
            env.instance(DIV_MOD, peek, period)
            env.lemma(implies(peek > boundary_block, mod(peek, period) < bpc))
    elif eagle:
        # A replay boundary's peek chunk: the mask marks block cdiv(rb, bpc) * bpc.
        env.instance(CDIV_BOUNDS, boundary_block, bpc)
        env.instance(MULTIPLES_EQUAL, end, cdiv(boundary_block, bpc), bpc)
        env.lemma(end == cdiv(boundary_block, bpc))
    def marked(block: Num) -> Bool:
        return env.call(
            impl.is_block_reachable, block, align, block_tokens, sw, e, eagle, retention,
            final_end_chunk * bpc, replay_blocks, bpc,
        )

    in_chunk = and_(witness >= chunk * bpc, witness < chunk * bpc + bpc)
    if not eagle:
        return and_(in_chunk, marked(witness))
    # One mask per case, each a lemma: measured, the goal with the mask at the ``ite``
    # witness took 15 s, where the two cases take under a second each.
    window_marked, peek_marked = marked(window_witness), marked(peek)
    env.lemma(in_chunk)
    env.lemma(implies(in_window, window_marked))
    env.lemma(implies(not_(in_window), peek_marked))
    return and_(in_chunk, ite_bool(in_window, window_marked, peek_marked))


def _symbolic_sizes(env: Env) -> bool:
    """The symbolic-size query of a mask theorem (``bpc`` a term: no block enumeration)."""
    return not isinstance(env["bpc"], int)


def _size_lemmas(env: Env) -> None:
    """What the mask computes from the sizes, in the symbolic-size query's terms: ``A`` is
    whole blocks (the mask applies) of ``per`` blocks, an interval ``rho * per`` blocks."""
    block_tokens, per = env["B"], env["per"]
    align = per * block_tokens
    env.lemma(mod(align, block_tokens) == 0)
    env.lemma(floordiv(align, block_tokens) == per)
    if "rho" in env.values:
        env.lemma(floordiv(env["rho"] * align, block_tokens) == env["rho"] * per)
        env.lemma(env["rho"] * align >= 1)


def _residue_hyps(env: Env, index: Num) -> list[Bool]:
    """``index = L * q + j`` for the configuration's residue ``j`` (see below)."""
    if "L" not in env.values:
        return []  # the symbolic-size query: no residue split
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
    size_hyps, align, block_tokens, bpc, eagle, retention = _mask_env(env)
    tpc = block_tokens * bpc
    segment = align if retention is None else retention
    k, horizon_chunks, c, sw, e = env["k"], env["Hc"], env["c"], env["sw"], env["e"]
    boundary = k * segment
    hyps: list[Bool] = [
        *size_hyps,
        sw >= 2,
        e >= 0,
        k >= 1,
        horizon_chunks >= 1,
        c >= 0,
        *_residue_hyps(env, k),
    ]
    if type(segment) is int and segment == 0:
        hyps.append(False)  # no segment boundaries without segments (replay only)
    lo, hi = demanded_chunk_range(boundary, sw, e, tpc, eagle)
    hyps += [boundary <= horizon_chunks * tpc, in_range(c, lo, hi), hi <= horizon_chunks]
    env.assume(hyps)
    if _symbolic_sizes(env):
        _size_lemmas(env)
        period = env["per"] if retention is None else env["rho"] * env["per"]
        return hyps, _window_block_stored(env, impl, c, k * period, horizon_chunks, (),
                                          (k, period), eagle)
    return hyps, _chunk_stored(env, impl, c, horizon_chunks, ())


def final_boundary_supplied(env: Env, impl: Implementation) -> tuple[list[Bool], Bool]:
    """Every chunk the final horizon (finish/abort) demands is stored (non-EAGLE)."""
    size_hyps, _align, block_tokens, bpc, eagle, retention = _mask_env(env)
    tpc = block_tokens * bpc
    horizon_chunks, c, sw, e = env["Hc"], env["c"], env["sw"], env["e"]
    hyps: list[Bool] = [*size_hyps, sw >= 2, e >= 0, horizon_chunks >= 1, c >= 0]
    if eagle or retention == 0:
        hyps.append(False)  # EAGLE has no final boundary: its peek chunk never exists
    lo, hi = demanded_chunk_range(horizon_chunks * tpc, sw, e, tpc, False)
    hyps += [in_range(c, lo, hi)]
    env.assume(hyps)
    if _symbolic_sizes(env):
        _size_lemmas(env)
        return hyps, _window_block_stored(env, impl, c, horizon_chunks * bpc,
                                          horizon_chunks, (), None, False,
                                          final_period=env["per"])
    return hyps, _chunk_stored(env, impl, c, horizon_chunks, ())


def replay_boundary_supplied(env: Env, impl: Implementation) -> tuple[list[Bool], Bool]:
    """With a retention interval, the replay boundary's demand is stored."""
    size_hyps, align, block_tokens, bpc, eagle, retention = _mask_env(env)
    tpc = block_tokens * bpc
    horizon_chunks, c, sw, e, r = env["Hc"], env["c"], env["sw"], env["e"], env["r"]
    hyps: list[Bool] = [
        *size_hyps,
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
    if _symbolic_sizes(env):
        _size_lemmas(env)
        env.lemma(replay_blocks[0] == r * env["per"])
        return hyps, _window_block_stored(env, impl, c, r * env["per"], horizon_chunks,
                                          replay_blocks, None, eagle)
    return hyps, _chunk_stored(env, impl, c, horizon_chunks, replay_blocks)


def stored_blocks_demanded(env: Env, impl: Implementation) -> tuple[list[Bool], Bool]:
    """A block the mask marks below the horizon is demanded by a reachable boundary.

    The reachable boundaries are the segment boundaries up to the horizon and the final
    horizon itself. Symbolically the goal names one witness boundary, the end of the
    block's segment (a stronger goal, so proving it proves the clause). On plain ints
    (the replay of a solver model) every reachable boundary is tried, so a model that
    only defeats the witness is not reported as a counterexample (it becomes UNKNOWN).
    """
    size_hyps, align, block_tokens, bpc, eagle, retention = _mask_env(env)
    tpc = block_tokens * bpc
    i, horizon_chunks, sw, e = env["i"], env["Hc"], env["sw"], env["e"]
    hyps: list[Bool] = [*size_hyps, sw >= 2, e >= 0, horizon_chunks >= 1, i >= 0,
                        i < horizon_chunks * bpc]
    if eagle or retention is not None:
        hyps.append(False)  # domain: non-EAGLE, segments of A (docs/CONTRACT.md 13)
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
    if _symbolic_sizes(env):
        _size_lemmas(env)
        return hyps, implies(marked, _marked_block_demanded(env, i, horizon_chunks))
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


def _final_tail_marks(env: Env, impl: Implementation) -> tuple[list[Bool], Bool, Bool]:
    """``(hypotheses, marked, contract)`` of the final-tail theorems: block ``i`` of the
    final partial segment ending at block ``F`` (from the segment's start ``F - F mod per``
    up to ``F`` itself; non-EAGLE, dense retention: the only case with a final tail),
    whether the mask marks it, and whether the contract marks it (docs/CONTRACT.md 5:
    the final tail ``[max(F - F mod per, F - need), F)`` of rule (c), a segment tail of
    rule (a), or every block when ``need >= per``)."""
    size_hyps, align, block_tokens, bpc, eagle, retention = _mask_env(env)
    i, end, sw, e = env["i"], env["F"], env["sw"], env["e"]
    symbolic = _symbolic_sizes(env)
    period = env["per"] if symbolic else align // block_tokens
    need = store_need_blocks(sw, e, block_tokens, False)
    partial = mod(end, period)
    hyps: list[Bool] = [*size_hyps, sw >= 2, e >= 0, end >= 1, partial != 0,
                        i >= end - partial, i <= end]
    if eagle or retention is not None:
        hyps.append(False)  # domain: a final tail exists for non-EAGLE dense retention only
    env.assume(hyps)
    if symbolic:
        _size_lemmas(env)
    marked = env.call(
        impl.is_block_reachable, i, align, block_tokens, sw, e, eagle, retention, end, (),
        bpc, generalize=(1, 2),
    )
    contract = or_(need >= period, segment_tail_block(i, period, need, 0),
                   final_tail_block(i, end, period, need))
    return hyps, marked, contract


def final_tail_supplied(env: Env, impl: Implementation) -> tuple[list[Bool], Bool]:
    """C7, per block: every block of the final partial segment the contract marks is
    marked, the final tail ``[max(F - F mod per, F - need), F)`` whole (the chunk-level
    ``final-boundary-supplied`` misses a block dropped from a chunk with another marked
    one)."""
    hyps, marked, contract = _final_tail_marks(env, impl)
    return hyps, implies(contract, marked)


def final_tail_exact(env: Env, impl: Implementation) -> tuple[list[Bool], Bool]:
    """C8, per block: the mask marks no block of the final partial segment, nor the
    block ``F`` at its end, that the contract does not mark. The final tail ends before
    ``F``: the chunk of ``F`` starts at the horizon and no boundary up to it demands it
    (``stored-blocks-demanded`` stops below the horizon). With
    :func:`final_tail_supplied`, the final tail's blocks exactly."""
    hyps, marked, contract = _final_tail_marks(env, impl)
    return hyps, implies(marked, contract)


def _replay_tail_marks(env: Env, impl: Implementation) -> tuple[list[Bool], Bool, Bool]:
    """``(hypotheses, marked, contract)`` of the replay-tail theorems: block ``i`` and a
    replay block ``b = k * per`` (a replay boundary aligned down to ``A``, in blocks),
    whether the mask given that replay block marks ``i``, and whether the contract's
    rules (d) and (e) for it do (docs/CONTRACT.md 5: the ``need`` blocks before ``b``,
    an EAGLE group's one block later, and its peek chunk's first block)."""
    size_hyps, align, block_tokens, bpc, eagle, retention = _mask_env(env)
    i, k, sw, e = env["i"], env["k"], env["sw"], env["e"]
    symbolic = _symbolic_sizes(env)
    per = env["per"] if symbolic else align // block_tokens
    need = store_need_blocks(sw, e, block_tokens, eagle)
    boundary = k * per
    hyps: list[Bool] = [*size_hyps, sw >= 2, e >= 0, k >= 0, i >= 0]
    if retention is None:
        hyps.append(False)  # replay boundaries exist only with a retention interval
    env.assume(hyps)
    if symbolic:
        _size_lemmas(env)
    marked = env.call(
        impl.is_block_reachable, i, align, block_tokens, sw, e, eagle, retention, None,
        (boundary,), bpc, generalize=(1, 2),
    )
    return hyps, marked, replay_window_block(i, boundary, need, eagle, bpc)


def replay_tail_supplied(env: Env, impl: Implementation) -> tuple[list[Bool], Bool]:
    """C7, per block: every block the contract marks for a replay boundary is marked
    (the chunk-level ``replay-boundary-supplied`` misses a block dropped from a chunk that
    keeps another marked block: an EAGLE window without its peek block)."""
    hyps, marked, contract = _replay_tail_marks(env, impl)
    return hyps, implies(contract, marked)


def replay_tail_exact(env: Env, impl: Implementation) -> tuple[list[Bool], Bool]:
    """C8, per block, with retention 0 (the replay boundaries are the only boundaries
    the mask serves): the mask marks no block but the contract's replay window and, for
    EAGLE, its peek chunk's first block."""
    hyps, marked, contract = _replay_tail_marks(env, impl)
    return hyps, implies(marked, contract)


def _passes_replay_boundary(
    store_replay_boundaries: Callable[..., tuple[Any, ...]], prompt_len: Num,
    alignment_tokens: Num | None, retention_interval: Num | None, eagle: bool, boundary: Num,
) -> bool:
    """Whether the store path passes ``boundary`` to the mask (membership: the order and
    duplicates of its tuple are the mask's business, not the contract's).

    A store path that keeps state between calls (a closure: a memo, the builder it
    drives, as the audit's executed probe of upstream's ``_build_store_jobs`` does) is
    not lifted: symbolic arguments would meet that state (a memo compares them as keys,
    stand-ins take plain ints) and a run that swallows the failure would look like an
    answer. It is decided on plain ints instead (the audit searches concretely)."""
    if not isinstance(prompt_len, int) and getattr(store_replay_boundaries, "__closure__",
                                                   None) and \
            not getattr(store_replay_boundaries, "stateless", False):
        from kvcontract.spec.symbolic import LiftError

        raise LiftError("the store path's replay boundaries keep state between calls (a "
                        "closure): run on plain ints only")
    return boundary in store_replay_boundaries(prompt_len, alignment_tokens,
                                               retention_interval, eagle)


def replay_boundaries_exact(env: Env, impl: Implementation) -> tuple[list[Bool], Bool]:
    """The replay boundaries the store path passes to the mask are exactly those the
    contract owes (docs/CONTRACT.md 5, ``reachability.owed_replay_boundary``): every
    boundary ``x >= 1`` is passed iff it is owed. With a retention interval (0 included)
    the resend's ``P - 1``; with an EAGLE group and an alignment ``A`` also the EAGLE
    boundaries of vLLM 0.33.0's GPU replay rule (legacy EAGLE hash mode) at the unit
    ``A``: ``(P - 1) // A * A - A`` and ``P // A * A - A``. Without a retention
    interval none. A boundary the store path leaves out is a hit the GPU serves and the
    offload loses (C7, C12); one it adds stores tails no boundary reaches (C8)."""
    prompt_len, boundary = env["P"], env["x"]
    aligned, kind, eagle = env["Ak"], env["Rk"], bool(env["eagle"])
    align: Num | None = env["A"] if aligned else None
    retention: Num | None = None if kind < 0 else (0 if kind == 0 else env["R"])
    hyps: list[Bool] = [prompt_len >= 1, boundary >= 1]
    if align is not None:
        hyps.append(align >= 1)
    if kind > 0:
        hyps.append(env["R"] >= 1)
    env.assume(hyps)
    if isinstance(align, int) and align < 1:
        return hyps, True  # outside the domain (A >= 1): nothing to divide by
    if all(v is None or isinstance(v, int) for v in (prompt_len, boundary, align, retention)):
        # On plain ints (a replay, the audit's concrete search) the whole set at once, for
        # every boundary: what the statement says for each ``x``, without having to
        # guess the one that differs.
        passed_set = {b for b in impl.store_replay_boundaries(
            prompt_len, align, retention, eagle) if b >= 1}
        owed_set = set(replay_boundaries_owed(prompt_len, align, retention, eagle))
        return hyps, passed_set == owed_set
    passed = env.call(_passes_replay_boundary, impl.store_replay_boundaries, prompt_len,
                      align, retention, eagle, boundary)
    owed = owed_replay_boundary(boundary, prompt_len, align, retention, eagle)
    return hyps, eq(passed, owed)


def replay_boundary_configs() -> list[Config]:
    """Every combination the store path distinguishes: EAGLE or not, an alignment or
    none, retention None, 0 or an interval; the counts (and ``A``, ``R``) symbolic."""
    configs = []
    for eagle in (0, 1):
        for aligned in (0, 1):
            for kind, label in ((-1, "none"), (0, "zero"), (1, "interval")):
                values = {"eagle": eagle, "Ak": aligned, "Rk": kind}
                if not aligned:
                    values["A"] = 0
                if kind != 1:
                    values["R"] = 0
                configs.append(Config(
                    f"eagle={bool(eagle)}, alignment={'A' if aligned else 'None'}, "
                    f"retention={label}", values))
    return configs


REPLAY_BOUNDARY_DOMAIN = ("every combination of EAGLE or not, an alignment A or none and "
                          "retention None, 0 or an interval R")


def _marked_block_demanded(env: Env, block: Num, horizon_chunks: Num) -> Bool:
    """With symbolic sizes: block ``block``, marked by the mask (non-EAGLE, dense
    retention), is demanded by the end of its segment or by the final horizon, through
    a lemma chain (the converse of :func:`_window_block_stored`).

    The key lemma reads the mask: a marked block lies within ``need`` blocks before the
    end of its segment ``(q + 1) * per`` or before the horizon block ``m``. From there
    each boundary's demanded chunk range contains the block's chunk, in tokens: the chunk
    starts before the boundary, and its end passes the first token the window needs
    (``lw(N) * tpc`` covers the reach and the padding)."""
    _, _align, block_tokens, bpc, _eagle, _retention = _mask_env(env)
    per, sw, e = env["per"], env["sw"], env["e"]
    chunk_tokens = block_tokens * bpc
    reach = sw - 1 + e
    need = cdiv(sw + e - 1, block_tokens)
    segment = floordiv(block, per)
    chunk = floordiv(block, bpc)
    horizon_block = horizon_chunks * bpc
    env.instance(DIV_MOD, block, per)
    env.instance(DIV_MOD, block, bpc)
    env.instance(CDIV_BOUNDS, reach, block_tokens)
    env.lemma(chunk * bpc <= block)
    env.lemma(block < (chunk + 1) * bpc)
    env.lemma(need * block_tokens < reach + block_tokens)

    def covered(boundary_block: Num) -> Bool:
        """The block's chunk is in the range boundary ``boundary_block * B`` demands,
        when the block lies within ``need`` blocks before it."""
        boundary = boundary_block * block_tokens
        padding = mod(-boundary, chunk_tokens)
        end = cdiv(boundary, chunk_tokens)
        window = load_window_chunks(boundary, sw, e, chunk_tokens)
        near = and_(block < boundary_block, block + need >= boundary_block)
        env.lemma(implies(near, chunk * bpc < boundary_block))
        env.lemma(implies(near, chunk * bpc * block_tokens < boundary))
        env.instance(CDIV_BOUNDS, boundary, chunk_tokens)
        env.instance(CANCEL, chunk, end, chunk_tokens)
        env.lemma(implies(near, chunk < end))
        env.instance(DIV_MOD, -boundary, chunk_tokens)
        env.lemma(end * chunk_tokens == boundary + padding)
        env.lemma(cdiv(reach, chunk_tokens) <= cdiv(reach + padding, chunk_tokens))
        env.lemma(window == cdiv(reach + padding, chunk_tokens))
        env.instance(CDIV_BOUNDS, reach + padding, chunk_tokens)
        env.lemma(implies(near, (chunk + 1) * bpc >= boundary_block - need + 1))
        env.lemma(implies(near, (chunk + 1) * bpc * block_tokens > boundary - reach))
        env.lemma(implies(near, (end - window) * chunk_tokens < (chunk + 1) * chunk_tokens))
        env.instance(CANCEL, end - window, chunk + 1, chunk_tokens)
        demanded_from = max_(0, end - window)
        env.lemma(implies(near, in_range(chunk, demanded_from, end)))
        return and_(near, in_range(chunk, demanded_from, end))

    segment_end = (segment + 1) * per
    by_segment = and_(segment_end <= horizon_block, covered(segment_end))
    by_final = covered(horizon_block)
    env.lemma(block < segment_end)
    env.lemma(implies(segment_end > horizon_block, block < horizon_block))
    return or_(by_segment, by_final)


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


def _all_sizes(retention: str, eagle: bool) -> dict[str, Any]:
    """The fields of a non-EAGLE mask theorem proved for every size first: the sizes
    symbolic (:data:`SYMBOLIC_MASK_SIZES`, with ``rho`` for an interval), the kind of
    retention fixed; the case split stays the fallback if Z3 leaves it undecided."""
    interval = retention == "interval"
    return {
        "symbolic_sizes": SYMBOLIC_MASK_SIZES + (("rho",) if interval else ()),
        "symbolic_fixed": (("eagle", int(eagle)),) + (() if interval else
                                             (("R", {"none": -1, "zero": 0}[retention]),)),
        "symbolic_rlimit": 20_000_000,
        # The smallest sizes first: a defect shows there in milliseconds (each of the
        # historic mask defects does), a symbolic refutation's minimization takes minutes.
        "probe_configs": 16,
        # A model of the witness goal need not violate the clause: with bpc fixed the
        # chunk's blocks are enumerated (the clause itself) and the rest stays symbolic.
        "refine_sizes": ("bpc",),
        "symbolic_domain": "every SWA block B, bpc and alignment A = per * B = a * bpc "
                           "(a: the FA block that makes it)"
                           + (", every interval R = rho * A" if interval else "")
                           + f"; eagle={eagle}, retention={retention}",
    }


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


def _picture_mamba_retention(v: Mapping[str, int], impl: Implementation) -> Picture:
    n, bs, bpc = max(0, v["n"]), max(1, v["bs"]), max(1, v["bpc"])
    tpc = bs * bpc
    first = int(impl.mamba_first_live_block(n, tpc, bpc))
    owed = int(multigroup.mamba_first_live_block(n, tpc, bpc))
    return Picture(Geometry((mamba(bs),), blocks_per_chunk=bpc), max(n, 1), None,
                   offending={0: {first // bpc, owed // bpc}},
                   notes=[f"after {n} tokens the implementation keeps from block {first}, "
                          f"the contract from block {owed} (the state's chunk)"])


def _picture_load_set(v: Mapping[str, int], impl: Implementation) -> Picture:
    _, hit, local, bs, bpc, sw, e, _ = _swa_scene(v)
    lo, hi = (int(x) for x in impl.load_chunk_range(hit, local, bs, bpc, sw, e))
    return _swa_picture(v, {v["c"]}, f"the implementation loads chunks [{lo}, {hi})")


def _picture_allocation(v: Mapping[str, int], impl: Implementation) -> Picture:
    _, hit, local, bs, bpc, sw, e, _ = _swa_scene(v)
    lo, hi = (int(x) for x in spec_ret.load_chunk_range(hit, local, bs, bpc, sw, e))
    return _swa_picture(v, set(range(lo, hi)), "the fresh blocks of this hit exceed W * bpc + 1")


def _checked_window(impl: Implementation, load_window: bool, hit: int, sw: int, e: int,
                    tpc: int) -> int:
    """The chunks the implementation checks back from boundary ``hit``: its load window
    (``load_window``, the first run's) or ``W`` (a later run's)."""
    if load_window:
        return int(impl.load_window_size_in_chunks(hit, sw, e, tpc))
    return int(impl.get_sliding_window_size_in_chunks(sw, e, tpc))


def _picture_covers(first_run: bool) -> Callable[[Mapping[str, int], Implementation], Picture]:
    def picture(v: Mapping[str, int], impl: Implementation) -> Picture:
        _, hit, local, bs, bpc, sw, e, tpc = _swa_scene(v)
        window = _checked_window(impl, first_run, hit, sw, e, tpc)
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
        window = _checked_window(impl, load_window, hit, sw, e, tpc)
        lo, hi = (int(x) for x in spec_ret.load_chunk_range(hit, 0, bs, bpc, sw, e))
        return _swa_picture(v, set(range(hi - window, lo)),
                            f"the implementation demands {window} chunks ending at chunk "
                            f"{hi}; the load set is only [{lo}, {hi})")

    return picture


def _mask_sizes(v: Mapping[str, int]) -> tuple[int, int | None]:
    """``(A, retention)`` of a store-mask witness, from a configuration's ``A`` and ``R``
    or from the symbolic-size query's ``per`` and ``rho`` (:func:`_mask_env`)."""
    align = v["A"] if "A" in v else v["per"] * v["B"]
    if "rho" in v:
        return align, v["rho"] * align
    return align, (None if v["R"] < 0 else v["R"])


def mask_geometry(v: Mapping[str, int]) -> Geometry:
    """The geometry of a store-mask witness: an FA group of block ``A / bpc`` (which makes
    the alignment ``A``) and the SWA group of block ``B``."""
    align, retention = _mask_sizes(v)
    return Geometry(
        (fa(align // v["bpc"]), swa(v["B"], v["sw"], v["e"], eagle=bool(v["eagle"]))),
        blocks_per_chunk=v["bpc"], retention_interval=retention,
    )


def _picture_mask(v: Mapping[str, int], impl: Implementation) -> Picture:
    """A store-mask witness: FA block A/bpc gives the alignment A; chunk c is demanded
    by the witness's boundary and never stored."""
    del impl
    align, retention = _mask_sizes(v)
    geometry = mask_geometry(v)
    tpc = v["B"] * v["bpc"]
    horizon = v["Hc"]
    if "k" in v:
        boundary = v["k"] * (align if retention is None else retention)
    elif "r" in v:
        boundary = v["r"] * align
    else:
        boundary = horizon * tpc
    offending = {v["c"]} if "c" in v else {v["i"] // v["bpc"]}
    note = (f"chunk {v['c']} is demanded by boundary {boundary} and never stored" if "c" in v
            else f"block {v['i']} is stored but no reachable boundary demands it")
    return Picture(geometry, horizon * tpc, boundary, 0, offending={1: offending},
                   notes=[note])


def _picture_final_tail(v: Mapping[str, int], impl: Implementation) -> Picture:
    """A final-tail witness: block ``i`` near the final segment end ``F`` is marked where
    the contract does not mark it, or the reverse."""
    del impl
    geometry = mask_geometry(v)
    end, block = v["F"], v["i"]
    horizon = end * v["B"]
    return Picture(geometry, horizon, horizon, 0, offending={1: {block // v["bpc"]}},
                   notes=[f"block {block} of the final partial segment ending at block {end}:"
                          " the mask disagrees with the contract's final tail"])


def _picture_replay_tail(v: Mapping[str, int], impl: Implementation) -> Picture:
    """A replay-tail witness: block ``i`` near the replay block ``k * per``."""
    del impl
    geometry = mask_geometry(v)
    align, _ = _mask_sizes(v)
    per = align // v["B"]
    boundary = v["k"] * per
    return Picture(geometry, (boundary + 2 * v["bpc"]) * v["B"], boundary * v["B"], 0,
                   offending={1: {v["i"] // v["bpc"]}},
                   notes=[f"block {v['i']} and the replay block {boundary}: the mask "
                          "disagrees with the contract's replay window"])


def _picture_replay(v: Mapping[str, int], impl: Implementation) -> Picture:
    """A replay-boundary witness: an FA group (EAGLE when the witness is) of block ``A``
    with the interval, prompt ``P``, and the boundary the store path gets wrong."""
    del impl
    align = v["A"] if v.get("Ak") else 16
    retention = None if v["Rk"] < 0 else (0 if v["Rk"] == 0 else 2 * align)
    geometry = Geometry((fa(align, eagle=bool(v["eagle"])),), retention_interval=retention)
    return Picture(geometry, v["P"], v["x"], 0,
                   notes=[f"replay boundary {v['x']} of a {v['P']}-token prompt: passed to "
                          "the mask where the contract does not owe it, or the reverse"])


SWA_LOAD = ("load_chunk_range",)
MASK = ("is_block_reachable",)


def _chunk_property(
    clause: str, name: str, description: str, variables: str, statement: Statement,
    uses: tuple[str, ...], picture: Callable[[Mapping[str, int], Implementation], Picture],
    reads_gpu_retention: bool = False, group_kind: GroupKind | None = None,
) -> FormulaProperty:
    """A theorem of one group (sliding-window unless ``group_kind`` says otherwise) over
    the chunk case split (block size and blocks per chunk, both tried symbolically
    first)."""
    return FormulaProperty(clause, name, description, _w(variables), statement,
                           domains.chunk_configs, domains.CHUNK_DOMAIN, uses=uses,
                           picture=picture, symbolic_sizes=("bs", "bpc"),
                           reads_gpu_retention=reads_gpu_retention, group_kind=group_kind)


def _mask_tag(eagle: bool, retention: str) -> str:
    return f"{'eagle' if eagle else 'plain'}-{retention}"


def _mask_property(
    clause: str, name: str, description: str, variables: str, statement: Statement,
    eagle: bool, retention: str,
    picture: Callable[[Mapping[str, int], Implementation], Picture],
    configs: Callable[[], list[Config]] | None = None, **options: Any,
) -> FormulaProperty:
    """A theorem of the store mask for an EAGLE group or another and one kind of
    retention, every size tried symbolically first (:func:`_all_sizes`, ``options``
    override its fields); its case split is ``configs``, the mask's configurations of
    that kind when None."""
    return FormulaProperty(
        clause, name, description, _w(variables), statement,
        configs or functools.partial(_mask_configs, eagle, retention),
        MASK_DOMAIN + f", eagle={eagle}, retention={retention}",
        uses=MASK, picture=picture, geometry=mask_geometry,
        **{**_all_sizes(retention, eagle), **options},
    )


def _boundary_supplied(
    name: str, description: str, variables: str, statement: Statement,
    retentions: tuple[str, ...], step_tokens: Callable[[Mapping[str, int]], int],
) -> list[FormulaProperty]:
    """The C7 mask theorem ``name`` for an EAGLE group and another and each of
    ``retentions``, split by the residue of its boundaries ``k * step_tokens``
    (:func:`_residue_configs`)."""
    return [
        _mask_property(
            "C7", f"{name}[{_mask_tag(eagle, retention)}]", description, variables,
            statement, eagle, retention, _picture_mask,
            functools.partial(_residue_configs, eagle, retention, step_tokens))
        for eagle in (False, True) for retention in retentions
    ]


def formula_properties() -> list[FormulaProperty]:
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
        _chunk_property("C1", "mamba-retention-exact",
                        "a Mamba group keeps exactly the chunk of its state at the last chunk "
                        "end", "n", mamba_retention_exact, ("mamba_first_live_block",),
                        _picture_mamba_retention, group_kind=GroupKind.MAMBA),
        _chunk_property("C1", "load-set-exact",
                        "Load(N, L) holds exactly the chunks with a fresh retained block",
                        "N Lb c sw e", load_set_exact, SWA_LOAD, _picture_load_set),
        _chunk_property("C1", "allocation-bound",
                        "fresh blocks of a hit never exceed W * bpc + 1",
                        "N Lb sw e", allocation_bound, ("get_sliding_window_size_in_chunks",),
                        _picture_allocation, reads_gpu_retention=True),
        _chunk_property("C2", "first-run-covers-load",
                        "the window checked for a candidate boundary N covers Load(N, L)",
                        "N Lb sw e", first_run_covers_load,
                        ("load_window_size_in_chunks", "load_chunk_range"),
                        _picture_covers(first_run=True)),
        _chunk_property("C2", "later-run-covers-load",
                        "a W-window ending at chunk j covers Load(j * tpc, L)",
                        "j Lb sw e", later_run_covers_load,
                        ("get_sliding_window_size_in_chunks", "load_chunk_range"),
                        _picture_covers(first_run=False)),
        _chunk_property("C4", "load-window-exact",
                        "lw(N) demands no chunk outside Load(N, 0) once history is skipped",
                        "N sw e", load_window_not_over_demanding,
                        ("load_window_size_in_chunks",), _picture_window(load_window=True),
                        reads_gpu_retention=True),
        _chunk_property("C4", "window-exact",
                        "W demands no chunk outside the load set of an aligned boundary",
                        "j sw e", window_not_over_demanding,
                        ("get_sliding_window_size_in_chunks",),
                        _picture_window(load_window=False), reads_gpu_retention=True),
        FormulaProperty(
            "C10",
            "store-blocks-placed",
            "every live block a store job writes lands at its own offset of its own CPU "
            "chunk (block mod bpc), whatever null pages lie before it",
            _w("p f n"),
            store_blocks_placed,
            _placement_configs,
            PLACEMENT_DOMAIN,
            uses=("store_block_slot",),
            picture=_picture_placement,
            symbolic_sizes=("bpc",),
            symbolic_domain="bpc: blocks per chunk",
        ),
        FormulaProperty(
            "C4",
            "lookup-cap-exact",
            "the lookup's first candidate is the request less its recomputed last token, "
            "then the scheduling budget: no boundary within the budget is given up",
            _w("N B"),
            lookup_cap_exact,
            _cap_configs,
            CAP_DOMAIN,
            uses=("initial_lookup_cap",),
            picture=_picture_cap,
            symbolic_sizes=("r", "k"),
            symbolic_domain="r: a window or not, k: a budget or not",
        ),
        FormulaProperty(
            "C4",
            "keys-cover-hashed-tokens",
            "a request's offload keys end where its block hashes do (whole hash blocks "
            "with their lookahead tokens)",
            _w("n tph T"),
            keys_cover_hashed_tokens,
            _keys_configs,
            "every request length n >= 0, hash block tph >= 1 and lookahead T >= 0",
            uses=("keyed_tokens",),
            picture=_picture_keys,
            symbolic_sizes=("h",),
            symbolic_domain="h: the hash mode",
        ),
        FormulaProperty(
            "C12",
            "junction-rule-exact",
            "a request registers exactly the spec's shared-prefix junction: the "
            "full-attention boundary a sparse group cut its hit below, with a retention "
            "interval",
            _w("F L h R"),
            junction_rule_exact,
            _junction_configs,
            "every full-attention boundary F, local hit L and hit h >= 0, with a retention "
            "interval R >= 0 or none",
            uses=("shared_prefix_junction",),
            picture=_picture_junction,
            geometry=junction_geometry_of,
            symbolic_sizes=("q",),
            symbolic_domain="q: a retention interval or none",
        ),
        FormulaProperty(
            "C5",
            "eagle-drop-per-hash-mode",
            "the lookup and the store path drop an EAGLE group's trailing block under "
            "legacy block hashes only",
            _w("T"),
            eagle_drop_per_hash_mode,
            _hash_mode_configs,
            "an EAGLE group or another, legacy hashes (T = 0) or lookahead hashes of every "
            "T >= 1",
            uses=("lookup_drops_eagle_block", "store_drops_eagle_block"),
            picture=_picture_hash_mode,
            geometry=hash_mode_geometry,
            symbolic_sizes=("x", "h"),
            symbolic_domain="x: an EAGLE group or not, h: the hash mode",
        ),
    ]
    properties += _boundary_supplied(
        "segment-boundaries-supplied", "every chunk a segment boundary demands is stored",
        "k Hc c sw e q", segment_boundaries_supplied, ("none", "interval"), _segment_tokens)
    # Only dense retention keeps a final tail (``reachability.keeps_final_tail``): under
    # an interval the final partial segment is served at its replay boundaries alone.
    for retention in ("none",):
        properties.append(_mask_property(
            "C7", f"final-boundary-supplied[{retention}]",
            "every chunk the final horizon demands is stored", "Hc c sw e",
            final_boundary_supplied, False, retention, _picture_mask))
    properties += _boundary_supplied(
        "replay-boundary-supplied", "every chunk the replay boundary demands is stored",
        "r Hc c sw e q", replay_boundary_supplied, ("zero", "interval"), _alignment_tokens)
    # Once unknown on 33-block periods even at 400M rlimit (with the path-chain lift);
    # with the decision-tree lift and the solver portfolio every configuration is
    # decided within 2.1M (measured: 21M over the 131 configurations, 9 s).
    properties.append(_mask_property(
        "C8", "stored-blocks-demanded",
        "every block the mask marks below the horizon is demanded by a reachable boundary",
        "i Hc sw e", stored_blocks_demanded, False, "none", _picture_mask))
    # Issue 30: the final partial segment's tail and the store path's replay boundaries,
    # exactly (what kvcontract mutate showed the one-sided theorems above leave open).
    for clause, name, description, statement in (
        ("C7", "final-tail-supplied",
         "every block of the final partial segment the contract marks is marked",
         final_tail_supplied),
        ("C8", "final-tail-exact",
         "no block of the final partial segment, nor the horizon's, is marked that the "
         "contract does not mark",
         final_tail_exact),
    ):
        properties.append(_mask_property(
            clause, name, description, "i F sw e", statement, False, "none",
            _picture_final_tail, refine_sizes=()))
    for clause, name, description, statement, retentions in (
        ("C7", "replay-tail-supplied",
         "every block the contract marks for a replay boundary is marked",
         replay_tail_supplied, ("zero", "interval")),
        ("C8", "replay-tail-exact",
         "with retention 0, no block is marked but a replay boundary's window and peek",
         replay_tail_exact, ("zero",)),
    ):
        for eagle in (False, True):
            for retention in retentions:
                properties.append(_mask_property(
                    clause, f"{name}[{_mask_tag(eagle, retention)}]", description,
                    "i k sw e", statement, eagle, retention, _picture_replay_tail,
                    refine_sizes=()))
    properties.append(
        FormulaProperty(
            "C7",
            "replay-boundaries-exact",
            "the store path passes the mask exactly the replay boundaries the contract owes "
            "(P - 1; with EAGLE also vLLM 0.33.0's GPU replay boundaries at the unit A)",
            _w("P x A R"),
            replay_boundaries_exact,
            replay_boundary_configs,
            REPLAY_BOUNDARY_DOMAIN,
            uses=("store_replay_boundaries",),
            picture=_picture_replay,
        )
    )
    return properties
