"""The offload scheduler's decisions: multi-group lookup and store jobs, operationally.

Written in upstream's style on top of an :class:`~kvcontract.impl.bundle.Implementation`
so that a variant's defective primitive shows up in every decision built from it.

* :func:`lookup_complete_chunks` - the multi-group lookup with convergence (docs/CONTRACT.md 4.4),
  a fold driver over the implementation's ``multigroup_lookup_step`` (4.6).
* :class:`StoreTracker` - per request and group: which chunks were offered, the
  never-decreasing ``next_stored_chunk_idx`` and the store job of each step (section 5).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from kvcontract.impl import reference
from kvcontract.impl.bundle import Implementation
from kvcontract.spec.geometry import Geometry, GroupSpec
from kvcontract.vocabulary import GroupKind, LookupResult, RequestStatus

GroupLookup = Callable[[int, int], LookupResult]
"""``lookup(group_index, chunk_index)`` as the offload manager answers it."""


class ConvergenceError(RuntimeError):
    """The multi-group loop did not reach a fixpoint within its iteration budget (C6)."""


@dataclass
class LookupOutcome:
    """The result of one multi-group lookup."""

    hit_tokens: int | None
    """Accepted external hit in tokens (``local_hit`` when nothing is gained); None: defer."""
    load_ranges: dict[int, tuple[int, int]] = field(default_factory=dict)
    max_hit_trace: list[int] = field(default_factory=list)
    """Every value maxhit took: the first candidate, each shrink and each clamp to a
    group's keys, in order (the ranking function of C6 counts them)."""
    lookups: list[tuple[int, int]] = field(default_factory=list)
    iterations: int = 0
    pops: dict[int, int] = field(default_factory=dict)
    popped_at: list[tuple[int, int]] = field(default_factory=list)
    """``(group, candidate boundary)`` of every pop, in order."""
    reason: str = ""
    loading: list[tuple[int, int]] = field(default_factory=list)
    """``(group, chunk)`` of the load set another request is loading (a deferral's cause)."""
    full_attention_boundary: int | None = None
    """The boundary the full-attention groups served when the first sparse group took
    its first turn (clamped to that group's keys; one each of them confirmed: an EAGLE
    group's proposal that no scan confirmed yet is proved by their turns first), None
    before it, without a full-attention group, or when they serve none past the local
    hit: what a shared-prefix junction is registered at (``impl.shared_prefix_junction``,
    docs/CONTRACT.md 9.3)."""


def _group_window(impl: Implementation, geometry: Geometry, group: GroupSpec) -> int:
    """W of a sliding-window group (the scan's window, and the visiting order)."""
    assert group.sliding_window is not None
    return int(
        impl.get_sliding_window_size_in_chunks(
            group.sliding_window, group.extra_retained_tokens, geometry.chunk_tokens(group)
        )
    )


def full_attention_load_range(
    hit: int, local_hit: int, block_tokens: int, bpc: int
) -> tuple[int, int]:
    """FA: every chunk from the first block past the local hit to the hit's last chunk.

    The local hit is a GPU prefix hit, a whole number of blocks of every group
    (docs/CONTRACT.md 13): a caller that breaks that is stopped, not answered.
    """
    assert local_hit % block_tokens == 0, "a local hit is a whole number of blocks"
    return -(-local_hit // block_tokens) // bpc, -(-hit // (block_tokens * bpc))


def mamba_load_range(hit: int, local_hit: int, chunk_tokens: int) -> tuple[int, int]:
    """Mamba: the state lives in the chunk that ends at the boundary (one chunk at most).

    Accepted hits and local hits with a Mamba group are chunk ends (a state exists
    nowhere else): a caller that breaks that is stopped, not answered.
    """
    assert hit % chunk_tokens == 0, "a Mamba group is loaded at chunk ends only"
    assert local_hit % chunk_tokens == 0, "a Mamba group is loaded at chunk ends only"
    return max(local_hit // chunk_tokens, hit // chunk_tokens - 1), hit // chunk_tokens


def group_load_range(
    impl: Implementation, geometry: Geometry, group: GroupSpec, hit: int, local_hit: int
) -> tuple[int, int]:
    """The chunks a group's GPU manager allocates fresh and loads for ``hit``.

    This is the operational side; :func:`kvcontract.spec.multigroup.load_range` states
    the same sets declaratively and the prover and the system compare the two, so the
    spec's formulas are deliberately not imported here.
    """
    bs = geometry.block_tokens(group)
    if group.kind is GroupKind.SLIDING_WINDOW:
        assert group.sliding_window is not None
        start, end = impl.load_chunk_range(
            hit, local_hit, bs, geometry.blocks_per_chunk,
            group.sliding_window, group.extra_retained_tokens,
        )
        return int(start), int(end)
    if group.kind is GroupKind.MAMBA:
        return mamba_load_range(hit, local_hit, geometry.chunk_tokens(group))
    return full_attention_load_range(hit, local_hit, bs, geometry.blocks_per_chunk)


def group_first_live_block(
    impl: Implementation, geometry: Geometry, group: GroupSpec, num_computed: int
) -> int:
    """First block a group's GPU manager keeps after ``num_computed`` tokens.

    SWA: allocation retention (blocks below it are freed or null); Mamba: the first block
    of the chunk holding the state at the last chunk end; FA keeps everything. The one
    operational definition: the system's allocation, local hits and restore checks and
    the store path's C10 filter (:class:`StoreTracker`) all call it.
    """
    if group.kind is GroupKind.SLIDING_WINDOW:
        assert group.sliding_window is not None
        first, _ = impl.retained_block_range(
            num_computed, geometry.block_tokens(group), group.sliding_window,
            group.extra_retained_tokens,
        )
        return int(first)
    if group.kind is GroupKind.MAMBA:
        return int(impl.mamba_first_live_block(num_computed, geometry.chunk_tokens(group),
                                               geometry.blocks_per_chunk))
    return 0


def _present_view(lookup: Callable[[int], LookupResult]) -> Callable[[int], LookupResult]:
    def view(chunk: int) -> LookupResult:
        result = lookup(chunk)
        return LookupResult.HIT if result == LookupResult.HIT_PENDING else result

    return view


MAMBA_STATE_CHUNKS = 1
"""The window a Mamba group's scan looks for: its state is one chunk, so one present key
serves a boundary (a run of one; a required run of 0 would accept the same keys, since a
run is counted only on a present one)."""


def _scan_group(
    impl: Implementation,
    geometry: Geometry,
    group: GroupSpec,
    lookup: Callable[[int], LookupResult],
    start: int,
    stop: int,
    max_hit: int,
    window: int | None,
) -> int | None:
    """One group's scan of keys ``[start, stop)`` at boundary ``max_hit``: the end index
    it confirms, or None (``window``: W of a sliding-window group, None for the other
    kinds). An EAGLE group's ``stop`` includes its peek chunk (the step decides it), and
    its runs are one chunk longer."""
    eagle = 1 if impl.lookup_drops_eagle_block(group.eagle, geometry.hash_lookahead) else 0
    if group.kind is GroupKind.FULL:
        found: int | None = impl.prefix_lookup(lookup, start, stop)
        return found
    if group.kind is GroupKind.MAMBA:
        mamba_found: int | None = impl.sliding_window_lookup(
            lookup, start, stop, MAMBA_STATE_CHUNKS, MAMBA_STATE_CHUNKS)
        return mamba_found
    assert group.sliding_window is not None
    assert window is not None
    initial = int(
        impl.load_window_size_in_chunks(
            max_hit, group.sliding_window, group.extra_retained_tokens,
            geometry.chunk_tokens(group),
        )
    )
    swa_found: int | None = impl.sliding_window_lookup(
        lookup, start, stop, initial + eagle, window + eagle
    )
    return swa_found


def lookup_complete_chunks(
    impl: Implementation,
    geometry: Geometry,
    num_tokens: int,
    local_hit: int,
    lookup: GroupLookup,
    is_loading: Callable[[int, int], bool] | None = None,
    max_iterations: int | None = None,
    max_hit_tokens: int | None = None,
    num_keys: Mapping[int, int] | None = None,
) -> LookupOutcome:
    """Find the largest boundary every group can serve (or defer).

    ``num_keys`` overrides, per group index, how many offload keys the request has
    (by default its complete chunks, ``num_tokens // tpc``): upstream's tests build a
    request's block hashes independently of its token count (docs/CONTRACT.md 10, the EAGLE
    case of 13 tokens with 4 keys).

    Groups are visited FA first, then SWA by window descending. Each group proposes
    the largest boundary at most ``max_hit`` it can serve; when a group shrinks the
    boundary, the pass goes on at the new boundary and every other group is re-checked
    there (SWA coverage is not monotone in the boundary). A group that finds a pending
    chunk in its window marks itself deferred *for that boundary*: if another group later
    shrinks the boundary, the mark is dropped and the group is re-checked (C3). The loop
    ends when every group confirmed the same boundary; the boundary only decreases, so it
    terminates (C6).

    Each group's turn is one ``impl.multigroup_lookup_step`` (pure, so the prover lifts
    it for every state: docs/CONTRACT.md 4.6); this function is the fold driver over it.
    """
    windows = {g: _group_window(impl, geometry, s) for g, s in enumerate(geometry.groups)
               if s.kind is GroupKind.SLIDING_WINDOW}
    fa_groups = [g for g, s in enumerate(geometry.groups) if s.kind is GroupKind.FULL]
    swa_groups = sorted(windows, key=lambda g: -windows[g])
    other_groups = [g for g, s in enumerate(geometry.groups) if s.kind is GroupKind.MAMBA]
    order = fa_groups + swa_groups + other_groups
    # A windowed group (sliding window, or Mamba: one chunk of state) must recompute the
    # last prompt token, so the candidate starts one below the prompt; scheduling
    # budgets cap it further (C4/lookup-cap-exact proves the implementation's rule).
    max_hit = int(impl.initial_lookup_cap(num_tokens, geometry.recomputes_last_token,
                                          max_hit_tokens))
    outcome = LookupOutcome(hit_tokens=None, max_hit_trace=[max_hit])

    # Per group: whether it confirmed, and whether it deferred, at the current maxhit.
    # Both lapse whenever maxhit changes (they were for a larger boundary).
    confirmed = dict.fromkeys(order, False)
    deferred = dict.fromkeys(order, False)
    retry_seen = False
    fa_recorded = False

    def traced(group_index: int) -> Callable[[int], LookupResult]:
        def one(chunk: int) -> LookupResult:
            nonlocal retry_seen
            outcome.lookups.append((group_index, chunk))
            result = lookup(group_index, chunk)
            if result == LookupResult.RETRY:
                # Location unknown: an asynchronous lookup is in flight (sticky defer).
                retry_seen = True
            return result

        return one

    def scanner(group_index: int) -> Callable[[int, int, int, bool], int | None]:
        group = geometry.groups[group_index]

        def scan(start: int, stop: int, at: int, present_view: bool) -> int | None:
            view = traced(group_index)
            return _scan_group(impl, geometry, group,
                               _present_view(view) if present_view else view,
                               start, stop, at, windows.get(group_index))

        return scan

    scans = {g: scanner(g) for g in order}

    def group_keys(g: int) -> int:
        # Keys exist for the hashed tokens only (with lookahead hashes, a block is
        # hashed once its lookahead tokens exist).
        tpc = geometry.chunk_tokens(geometry.groups[g])
        keys = impl.keyed_tokens(
            num_tokens, geometry.tokens_per_hash, geometry.hash_lookahead) // tpc
        return keys if num_keys is None else num_keys.get(g, keys)

    def full_attention_proof(at: int) -> int | None:
        """The boundary the full-attention groups alone confirm from ``at``: their turns
        folded (untraced: the same answers, asked again) until each confirmed the same
        boundary; None when they serve none past the local hit. What a shared-prefix
        junction is registered at when a full-attention group's turn left a proposal no
        scan confirmed yet (an EAGLE group without a key for its peek chunk)."""
        flags = {f: (False, False) for f in fa_groups}
        while True:
            start = at
            for f in fa_groups:
                group = geometry.groups[f]
                view: Callable[[int], LookupResult] = functools.partial(lookup, f)

                def quiet(lo: int, hi: int, boundary: int, present: bool,
                          group: GroupSpec = group, view: Callable[[int], LookupResult] = view,
                          f: int = f) -> int | None:
                    return _scan_group(impl, geometry, group,
                                       _present_view(view) if present else view,
                                       lo, hi, boundary, windows.get(f))

                drops = impl.lookup_drops_eagle_block(group.eagle, geometry.hash_lookahead)
                before = at
                at, confirmed_here, deferred_here, _, ended, _ = impl.multigroup_lookup_step(
                    at, flags[f][0], flags[f][1], local_hit, geometry.chunk_tokens(group),
                    group_keys(f), int(drops), False, quiet)
                if ended != reference.LOOKUP_GOES_ON:
                    return None
                if at != before:
                    flags = dict.fromkeys(fa_groups, (False, False))
                flags[f] = (bool(confirmed_here), bool(deferred_here))
            if all(confirmed for confirmed, _ in flags.values()):
                return at
            if at == start:
                return None  # a pass that neither confirms nor lowers: none proved
    # The fold driver: each group's turn is one ``impl.multigroup_lookup_step`` (pure,
    # proved for every state by spec/properties/unbounded_lookup.py); this loop only
    # orders the turns, records them, and drops the other groups' flags on a change.
    while True:
        outcome.iterations += 1
        # The ranking function of C6: every pass but the last lowers maxhit (a shrink or
        # a clamp to a group's keys, each traced), so pass k starts with at least k
        # distinct values in the trace. A pass past them followed one that lowered
        # nothing and yet did not confirm every group: the loop would never end. (Distinct
        # values, not entries: a recorded "lowering" to the same value must not extend
        # the budget, and maxhit stays within [0, N], so the loop stops in any case.)
        distinct = len(set(outcome.max_hit_trace))
        budget = distinct if max_iterations is None else max_iterations
        if outcome.iterations > budget:
            raise ConvergenceError(
                f"multi-group lookup did not converge in {budget} iterations "
                f"(trace {outcome.max_hit_trace})"
            )
        for g in order:
            group = geometry.groups[g]
            tpc = geometry.chunk_tokens(group)
            keys = group_keys(g)
            before = max_hit
            if fa_groups and group.kind is not GroupKind.FULL and not fa_recorded:
                # The boundary the full-attention groups proved before any sparse group
                # narrowed it: the candidate now when each of them confirmed it (an
                # EAGLE group's unscanned proposal is proved first), clamped to this
                # first sparse group's keys (docs/CONTRACT.md 9.3).
                fa_recorded = True
                proved = (max_hit if all(confirmed[f] for f in fa_groups)
                          else full_attention_proof(max_hit))
                if proved is not None:
                    outcome.full_attention_boundary = min(proved, keys * tpc)
            drops = impl.lookup_drops_eagle_block(group.eagle, geometry.hash_lookahead)
            max_hit, confirmed_here, deferred_here, scanned_at, ended, popped = (
                impl.multigroup_lookup_step(
                    max_hit, confirmed[g], deferred[g], local_hit, tpc, keys,
                    1 if drops else 0, group.kind is GroupKind.MAMBA, scans[g],
                )
            )
            if scanned_at < before:
                outcome.max_hit_trace.append(scanned_at)  # clamped to the group's keys
            if popped:
                outcome.pops[g] = outcome.pops.get(g, 0) + 1
                outcome.popped_at.append((g, scanned_at))
            shrunk = max_hit < scanned_at
            if shrunk:
                outcome.max_hit_trace.append(max_hit)
            if ended == reference.LOOKUP_NO_CHUNK:
                outcome.hit_tokens = local_hit
                outcome.reason = f"group {g} has less than one chunk beyond the local hit"
                return outcome
            if ended == reference.LOOKUP_NOTHING_BEYOND:
                outcome.hit_tokens = local_hit
                outcome.reason = "no boundary beyond the local hit"
                return outcome
            if max_hit != before:
                confirmed = dict.fromkeys(order, False)
                deferred = dict.fromkeys(order, False)
            confirmed[g], deferred[g] = bool(confirmed_here), bool(deferred_here)
            # After a shrink the pass goes on at the smaller boundary and another pass
            # re-checks the groups before this one (vLLM's order: the answer is the
            # loop's fixed point whatever the order of the turns). Every flag lapses
            # when maxhit changes, so all confirmed means all confirmed it.
        if all(confirmed.values()):
            break
    if retry_seen or any(deferred.values()):
        outcome.reason = "pending chunk in the window or lookup in flight"
        return outcome
    load_ranges = {
        g: group_load_range(impl, geometry, s, max_hit, local_hit)
        for g, s in enumerate(geometry.groups)
    }
    if is_loading is not None:
        for g, (lo, hi) in load_ranges.items():
            outcome.loading.extend((g, k) for k in range(lo, hi) if is_loading(g, k))
        if outcome.loading:
            named = ", ".join(f"group {g} chunk {k}" for g, k in outcome.loading)
            outcome.reason = f"being loaded by another request: {named}"
            return outcome
    outcome.hit_tokens = max_hit
    outcome.load_ranges = load_ranges
    return outcome


def aligned_replay_block(boundary: int, alignment_tokens: int, block_tokens: int) -> int:
    """The block where a replay boundary's aligned position starts: the boundary rounded
    down to the alignment ``A``, in blocks. ``A`` is a multiple of the block (else the
    mask stores everything and has no replay blocks), so the division is exact."""
    assert alignment_tokens % block_tokens == 0, "A is a whole number of blocks"
    return boundary // alignment_tokens * (alignment_tokens // block_tokens)


@dataclass
class StoreTracker:
    """Store jobs of one request for one group, step after step (docs/CONTRACT.md section 5).

    ``next_stored_chunk_idx`` never moves back; a chunk is offered to ``prepare_store`` at
    most once per request; on finish or abort the final tail is recomputed at the real
    horizon and only chunks not offered yet are added. A chunk whose marked blocks were
    already freed (null) is never offered (C10) and is listed in ``unstorable``.
    """

    impl: Implementation
    geometry: Geometry
    group_index: int
    prompt_len: int
    max_offload_tokens: int | None = None
    offload_prompt_only: bool = True
    replay_boundaries: tuple[int, ...] | None = None
    """Replay boundaries (tokens) passed to the mask; ``None`` (the store path's
    default): the implementation's own (``impl.store_replay_boundaries``) for this
    prompt and geometry. A tuple pins them (tests of the mask alone)."""
    junction: int = 0
    """The request's shared-prefix junction (tokens; 0: none), registered by its lookup
    (``impl.shared_prefix_junction``): one more boundary passed to the mask besides the
    replay boundaries (docs/CONTRACT.md 9.3). A tracker built before the lookup takes it
    with :meth:`register_junction`."""
    next_stored_chunk_idx: int = 0
    offered: set[int] = field(default_factory=set)
    unstorable: set[int] = field(default_factory=set)
    offers: list[list[int]] = field(default_factory=list)
    placements: list[list[tuple[int, int, int]]] = field(default_factory=list)
    """Per step, where the step's job writes each live block of its chunks: ``(chunk,
    page, block)`` (the CPU chunk, the page in it, the block's index in the request),
    laid by the implementation's ``store_block_slot`` over the group's table (null below
    the first live block)."""

    def __post_init__(self) -> None:
        if self.replay_boundaries is None:
            geometry = self.geometry
            self.replay_boundaries = tuple(self.impl.store_replay_boundaries(
                self.prompt_len, geometry.alignment_tokens, geometry.retention_interval,
                any(self.impl.store_drops_eagle_block(group.eagle, geometry.hash_lookahead)
                    for group in geometry.groups),
            ))

    def register_junction(self, junction: int) -> None:
        """The request's lookup registered ``junction`` (0: none): from the next step on
        the mask gets it besides the replay boundaries, in place of any junction an
        earlier lookup of the request registered (vLLM's store path passes the
        request's current ``shared_prefix_boundary``, docs/CONTRACT.md 9.3)."""
        self.junction = junction

    def mask_boundaries(self) -> tuple[int, ...]:
        """The boundaries (tokens) the mask gets: the replay boundaries and the
        junction."""
        replay = self.replay_boundaries or ()
        if self.junction and self.junction not in replay:
            return (*replay, self.junction)
        return tuple(replay)

    @property
    def group(self) -> GroupSpec:
        return self.geometry.groups[self.group_index]

    def _marked_blocks(self, chunk: int, final_end_chunk: int | None) -> list[int]:
        group = self.group
        bpc = self.geometry.blocks_per_chunk
        blocks = range(chunk * bpc, chunk * bpc + bpc)
        if group.kind is not GroupKind.SLIDING_WINDOW:
            return list(blocks)
        assert group.sliding_window is not None
        block_tokens = self.geometry.block_tokens(group)
        align = self.geometry.alignment_tokens
        replay_blocks: tuple[int, ...] = ()
        if align is not None and align % block_tokens == 0:
            replay_blocks = tuple(
                aligned_replay_block(boundary, align, block_tokens)
                for boundary in self.mask_boundaries()
            )
        return [
            block
            for block in blocks
            if self.impl.is_block_reachable(
                block, align, block_tokens, group.sliding_window,
                group.extra_retained_tokens,
                self.impl.store_drops_eagle_block(group.eagle, self.geometry.hash_lookahead),
                self.geometry.retention_interval,
                None if final_end_chunk is None else final_end_chunk * bpc, replay_blocks, bpc,
            )
        ]

    def _first_live_block(self, num_computed: int) -> int:
        return group_first_live_block(self.impl, self.geometry, self.group, num_computed)

    def mark_computed(self, num_chunks: int) -> None:
        """Chunks ``[0, num_chunks)`` came from a hit (CPU or GPU cache): never offer them."""
        self.offered.update(range(num_chunks))
        self.next_stored_chunk_idx = max(self.next_stored_chunk_idx, num_chunks)

    def step(
        self, status: RequestStatus | str, num_computed: int, num_scheduled: int,
        num_tokens: int,
    ) -> list[int]:
        """The chunks offered to ``prepare_store`` for this step (ascending).

        ``status`` is a :class:`~kvcontract.vocabulary.RequestStatus` (its plain string,
        e.g. ``"decoding"``, is accepted too).
        """
        status = RequestStatus(status)
        group = self.group
        # The decisions are the implementation's pure functions (lifted by the prover for
        # every schedule: spec/properties/unbounded_store.py); this loop only walks the
        # candidate range and summarizes the mask over each chunk's blocks.
        tokens = self.impl.get_num_offloadable_tokens(
            status, num_computed, num_scheduled, num_tokens, self.prompt_len,
            self.max_offload_tokens, self.offload_prompt_only,
        )
        lookahead = self.geometry.hash_lookahead
        if lookahead:
            # Keys exist for hashed blocks only: with lookahead hashes a block is stored
            # once its lookahead tokens exist (docs/CONTRACT.md 2.1).
            # The whole prompt is hashed from the request's arrival.
            tokens = min(tokens, self.impl.keyed_tokens(
                max(num_tokens, self.prompt_len), self.geometry.tokens_per_hash,
                lookahead))
        first, end, next_after, prompt_horizon = self.impl.store_step_bounds(
            status, tokens, self.prompt_len, self.max_offload_tokens,
            self.geometry.chunk_tokens(group),
            self.impl.store_drops_eagle_block(group.eagle, self.geometry.hash_lookahead),
            self.next_stored_chunk_idx,
        )
        final_end = self.impl.store_final_segment_end(
            status, prompt_horizon, end, self.geometry.retention_interval
        )
        first_live = self._first_live_block(num_computed)
        new: list[int] = []
        for chunk in range(first, end):
            marked = self._marked_blocks(chunk, final_end)
            offer, unstorable = self.impl.store_chunk_offered(
                status, chunk in self.offered, bool(marked),
                # Blocks are listed in order: the first is the least. With none marked
                # the chunk is not offered whatever this is: pass the first live block
                # (a value with no meaning of its own to get wrong).
                marked[0] if marked else first_live, first_live,
            )
            if unstorable:
                self.unstorable.add(chunk)
            if offer:
                new.append(chunk)
        self.offered.update(new)
        self.next_stored_chunk_idx = next_after
        self.offers.append(new)
        # The job of this step (every offered chunk stored): block ids are the blocks'
        # indices plus one, the freed ones null pages.
        laid = store_job_placement(
            self.impl, new, self.geometry.blocks_per_chunk,
            lambda block: None if block < first_live else block + 1)
        self.placements.append([(new[rank], page, block_id - 1)
                                for block_id, rank, page in laid])
        return new


def store_job_placement(
    impl: Implementation, chunks: Sequence[int], blocks_per_chunk: int,
    block_id: Callable[[int], int | None],
) -> list[tuple[int, int, int]]:
    """One group's store job laid into its CPU chunks (docs/CONTRACT.md 5, "Placement"):
    ``(block id, rank of its CPU chunk among chunks, page)`` per live block of the stored
    ``chunks`` (ascending, in the job's order; ``block_id(block)`` is the group's table
    entry, None for a null page: a placeholder, nothing of it is written), at the slot the
    implementation's ``store_block_slot`` gives it. A block placed past the job's chunks
    has no chunk to land in and is left out (the slot it belongs in stays unwritten)."""
    laid: list[tuple[int, int, int]] = []
    first_live: int | None = None
    nulls = 0
    for rank, chunk in enumerate(chunks):
        for page in range(blocks_per_chunk):
            found = block_id(chunk * blocks_per_chunk + page)
            position = rank * blocks_per_chunk + page
            if found is None:
                nulls += 1
                continue
            if first_live is None:
                first_live = position
            slot = int(impl.store_block_slot(position, first_live, nulls, blocks_per_chunk))
            at_rank, at_page = divmod(slot, blocks_per_chunk)
            if at_rank in range(len(chunks)):
                laid.append((found, at_rank, at_page))
    return laid
