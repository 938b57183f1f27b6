"""An epoch's shuffled sample stream, its seq_group queues and the micro-batches they release.

Shared by DCP step assembly and the baselines. Everything here is computed once per epoch with numpy
(no per-sample Python work), so planning a step only walks micro-batches.

Readiness: samples arrive in the epoch's shuffled order; each seq_group keeps a FIFO queue and releases
a micro-batch when it holds b samples, at the stream position of its b-th sample. Micro-batches are
ordered by that position, so the only reordering is the one batching needs. At the end of the stream
every partial queue (< b samples) is flushed as a smaller micro-batch, ordered after every full one by
the position of its first sample.

2D samples (frames T x spatial tokens S) are padded in both dimensions: a micro-batch of shapes (T_i, S_i)
runs as b x max(T) x max(S) tokens, which can exceed every sample's own T x S and even its seq_group's
bound (12 x 9 and 4 x 36 hold 108 and 144 tokens; together they pad to 12 x 36 = 432 each), so a profile
row would bound neither its time nor its memory. Given the shapes, micro-batches are formed as video
training buckets them: one shape per micro-batch. A seq_group's queue then releases a micro-batch when
b samples of one shape have arrived (FIFO within the shape); there is no padding at all.

Token-packed seq_groups (1D, ``dcp.planner.tokens``): the queue releases a micro-batch when its samples' real
lengths fill the group's token budget (greedy in FIFO order), at the stream position of its last sample; the
last one of the stream is flushed like a partial run. Such a micro-batch is priced from its real lengths
anchored at the budget's row, whatever its sample count.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from dcp.config import gib
from dcp.planner.cost import micro_batch_time_s
from dcp.planner.plan import MicroBatch
from dcp.planner.table import ProfileTable
from dcp.planner.tokens import token_runs


class PlanningError(ValueError):
    """The planner cannot place some samples; the message names them and says how to fix it."""


def shuffled_order(n: int, seed: int, epoch: int) -> np.ndarray:
    """The epoch's sample order: a permutation from a numpy Generator seeded by (seed, epoch)."""
    return np.random.default_rng([int(seed), int(epoch)]).permutation(n)


def seq_groups_of(lengths: Sequence[int] | np.ndarray, table: ProfileTable) -> tuple[np.ndarray, np.ndarray]:
    """(lengths as int64, seq_group of every sample); PlanningError for bad or too-long samples."""
    from dcp.config import MAX_TOKENS
    from dcp.planner.lengths import check_lengths

    arr = np.asarray(check_lengths(lengths, what="sample lengths", error=PlanningError, low=-MAX_TOKENS,
                                   allow_empty=True), dtype=np.int64)
    bad = np.flatnonzero(arr < 1)
    if bad.size:
        i = int(bad[0])
        raise PlanningError(
            f"sample {i} has length {int(arr[i])} ({bad.size} samples <= 0 tokens): every sample needs >= 1 token; "
            "remove empty samples from the length list"
        )
    edges = np.asarray(table.seq_group_edges, dtype=np.int64)
    groups = np.searchsorted(edges, arr, side="left")
    too_long = np.flatnonzero(groups >= len(edges))
    if too_long.size:
        i = int(too_long[0])
        raise PlanningError(
            f"sample {i} has {int(arr[i])} tokens, longer than the longest profiled seq_group ({int(edges[-1])} "
            f"tokens; {too_long.size} samples are too long, the longest has {int(arr[too_long].max())}): add a "
            f"seq_group edge >= {int(arr[too_long].max())} to profiling.seq_group_edges and re-profile (a longer "
            "group may also need a larger planning.mem_capacity_gib or larger planning.sp_sizes), or truncate "
            "or drop those samples"
        )
    return arr, groups


def no_setting_error(
    group: int,
    table: ProfileTable,
    groups: np.ndarray,
    *,
    mem_capacity_bytes: float,
    sp_sizes: Sequence[int],
    world_size: int,
    what: str = "setting",
) -> PlanningError:
    members = np.flatnonzero(groups == group)
    return PlanningError(
        f"seq_group {group} (<= {table.seq_group_edges[group]} tokens; {members.size} samples, e.g. sample "
        f"{int(members[0]) if members.size else '-'}) has no {what} that fits the memory capacity "
        f"({gib(mem_capacity_bytes)}) with sp_sizes {list(sp_sizes)} and world_size {world_size}: "
        "raise planning.mem_capacity_gib, allow larger planning.sp_sizes (or more ranks), or re-profile with "
        "more candidates"
    )


def check_shapes(shapes: Sequence[Sequence[int]] | np.ndarray | None, lengths: np.ndarray) -> np.ndarray | None:
    """Per-sample (T, S) as an int64 [n, 2] array (None stays None); PlanningError when a shape is not two
    positive ints or T x S is not the sample's length."""
    if shapes is None:
        return None
    arr = np.asarray(shapes, dtype=np.int64)
    if arr.shape != (len(lengths), 2):
        raise PlanningError(
            f"shapes has shape {arr.shape}, expected ({len(lengths)}, 2): pass one (frames, spatial_tokens) pair "
            "per sample, in the order of lengths, or shapes=None for 1D data"
        )
    bad = np.flatnonzero((arr[:, 0] < 1) | (arr[:, 1] < 1) | (arr[:, 0] * arr[:, 1] != lengths))
    if bad.size:
        i = int(bad[0])
        raise PlanningError(
            f"sample {i} has shape {tuple(arr[i].tolist())} and length {int(lengths[i])} ({bad.size} samples "
            "disagree): a shape must be (T >= 1, S >= 1) with T x S == the sample's length; fix the dataset's "
            "sample_shapes() or lengths()"
        )
    return arr


def _runs(pos: np.ndarray, b: int, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(starts, counts, ready) of b-sample runs over one FIFO (stream positions ``pos``): a full run is ready
    at its b-th sample, the last partial one at the end of the stream (n + its first position)."""
    m = len(pos)
    full = m // b
    ready = pos[b - 1 :: b][:full]
    starts = np.arange(full, dtype=np.int64) * b
    cnt = np.full(full, b, dtype=np.int64)
    if m % b:
        ready = np.append(ready, n + pos[full * b])
        starts = np.append(starts, full * b)
        cnt = np.append(cnt, m - full * b)
    return starts, cnt, ready


def _fifo_runs(pos: np.ndarray, order: np.ndarray, shapes: np.ndarray | None, s_span: int, b: int,
               n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One seq_group's stream positions ``pos`` (increasing) as FIFOs (2D: one per shape, a stable sort by shape
    keeping stream order inside each) and their b-sample runs: (positions in FIFO order, run starts into them,
    run sample counts, run ready positions)."""
    if shapes is None:
        return (pos, *_runs(pos, b, n))
    key = shapes[order[pos], 0] * s_span + shapes[order[pos], 1]
    by_shape = np.argsort(key, kind="stable")
    pos, key = pos[by_shape], key[by_shape]
    cuts = np.flatnonzero(np.diff(key)) + 1  # where one shape's FIFO ends and the next begins
    parts = [_runs(part, b, n) for part in np.split(pos, cuts)]
    offsets = np.concatenate([[0], cuts])
    starts = np.concatenate([st + off for (st, _, _), off in zip(parts, offsets, strict=True)])
    cnt = np.concatenate([c for _, c, _ in parts])
    ready = np.concatenate([r for _, _, r in parts])
    return pos, starts, cnt, ready


def _token_fifo_runs(pos: np.ndarray, order: np.ndarray, lengths: np.ndarray, budget: int,
                     n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``_fifo_runs`` for a token-packed seq_group: greedy packs of <= ``budget`` tokens in FIFO order, each
    ready at its last sample; the stream's last pack is flushed at the end (n + its first position)."""
    starts = token_runs(lengths[order[pos]], budget)
    cnt = np.diff(np.append(starts, len(pos)))
    ready = pos[starts + cnt - 1]
    if len(ready):
        ready[-1] = n + pos[starts[-1]]
    return pos, starts, cnt, ready


class MicroBatchQueues:
    """All micro-batches of an epoch in readiness order, with per-seq_group FIFO queues.

    ``shapes`` ([n, 2] (T, S) per sample, 2D data) makes every micro-batch hold one shape (module docstring).
    """

    def __init__(
        self, lengths: np.ndarray, groups: np.ndarray, order: np.ndarray, micro_batch_size: Mapping[int, int],
        *, shapes: np.ndarray | None = None, token_budget: Mapping[int, int] | None = None,
    ) -> None:
        self.token_budget: dict[int, int] = dict(token_budget or {})
        """Per token-packed seq_group: its token budget (its micro_batch_size is the budget row's b, the price
        anchor); the other groups form b-sample runs."""
        self.anchor_b: dict[int, int] = {g: int(micro_batch_size[g]) for g in self.token_budget}
        """Per token-packed seq_group: the b of the row its micro-batches are priced at."""
        n = len(order)
        stream_groups = groups[order]
        by_group = np.argsort(stream_groups, kind="stable")  # stream positions, grouped, increasing inside
        counts = np.bincount(stream_groups, minlength=int(groups.max(initial=0)) + 1)
        bounds = np.concatenate([[0], np.cumsum(counts)])
        self.sample_ids: dict[int, np.ndarray] = {}
        """Per seq_group: sample ids in stream order (2D: grouped by shape, stream order within a shape);
        every micro-batch is a consecutive run of them."""
        self.seq_lens: dict[int, np.ndarray] = {}
        """Per seq_group: token counts, in the order of sample_ids."""
        # Python tuples, not lists: slicing a tuple yields the MicroBatch field directly, and the garbage
        # collector untracks tuples of ints, so these epoch-long containers are never re-scanned.
        self.ids_list: dict[int, tuple[int, ...]] = {}
        """Per seq_group: sample_ids as a tuple."""
        self.lens_list: dict[int, tuple[int, ...]] = {}
        """Per seq_group: token counts as a tuple."""
        mb_group, mb_ready, mb_start, mb_count, mb_padded = [], [], [], [], []
        s_span = int(shapes[:, 1].max()) + 1 if shapes is not None and len(shapes) else 1
        for g in range(len(counts)):
            if counts[g] == 0:
                continue
            if g in self.token_budget:
                pos, starts, cnt, ready = _token_fifo_runs(by_group[bounds[g] : bounds[g + 1]], order, lengths,
                                                           self.token_budget[g], n)
            else:
                pos, starts, cnt, ready = _fifo_runs(by_group[bounds[g] : bounds[g + 1]], order, shapes, s_span,
                                                     int(micro_batch_size[g]), n)
            ids = order[pos]
            self.sample_ids[g] = ids
            self.seq_lens[g] = lengths[ids]
            self.ids_list[g] = tuple(ids.tolist())
            self.lens_list[g] = tuple(self.seq_lens[g].tolist())
            # padded tokens per sample: the longest sample (2D: one shape per micro-batch, so its T x S)
            padded = np.maximum.reduceat(self.seq_lens[g], starts)
            mb_group.append(np.full(len(ready), g, dtype=np.int64))
            mb_ready.append(ready)
            mb_start.append(starts)
            mb_count.append(cnt)
            mb_padded.append(padded)
        self._index(mb_group, mb_ready, mb_start, mb_count, mb_padded)
        self.num = len(self.group)

    def _index(self, mb_group: list, mb_ready: list, mb_start: list, mb_count: list, mb_padded: list) -> None:
        """The global micro-batch index over every seq_group's runs, in readiness order."""
        if mb_ready:
            ready_all = np.concatenate(mb_ready)
            srt = np.argsort(ready_all, kind="stable")
            self.ready = ready_all[srt]
            grp_all = np.concatenate(mb_group)[srt]
            self.group = tuple(grp_all.tolist())
            self.start = tuple(np.concatenate(mb_start)[srt].tolist())
            self.count = tuple(np.concatenate(mb_count)[srt].tolist())
            self.padded = np.concatenate(mb_padded)[srt]
        else:
            self.ready = np.zeros(0, dtype=np.int64)
            grp_all = np.zeros(0, dtype=np.int64)
            self.group, self.start, self.count = (), (), ()
            self.padded = np.zeros(0, dtype=np.int64)
        """Global micro-batch k: seq_group, start index into its group's arrays, sample count, ready position,
        and padded tokens per sample (its longest sample; 2D micro-batches hold one shape, T x S)."""
        self.queue: dict[int, tuple[int, ...]] = {
            g: tuple(np.flatnonzero(grp_all == g).tolist()) for g in self.sample_ids
        }
        """Per seq_group: global micro-batch indices in FIFO order."""

    def micro_batch(self, k: int, time_s: float, lo: int = 0, hi: int | None = None) -> MicroBatch:
        """MicroBatch of global micro-batch k (optionally only its samples lo:hi)."""
        g = self.group[k]
        a = self.start[k]
        hi = self.count[k] if hi is None else hi
        return MicroBatch(self.ids_list[g][a + lo : a + hi], self.lens_list[g][a + lo : a + hi], g, time_s)


# Monomials of the length model: a micro-batch's time is  a + b1 * sum(n) + b2 * sum(n^2)  over its samples'
# real lengths n (per-micro-batch overhead, linear work in real tokens, attention in squared lengths).
_TERMS = ((0, 1, 2), (0, 1), (0, 2), (1, 2), (0,), (1,), (2,))
"""Subsets of (a, b1, b2) tried when fitting, in order of preference on a tie (all three first)."""


def _fit_length_model(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """(a, b1, b2) >= 0 minimising the relative squared error of ``x @ coef`` against ``y`` (x: [rows, 3]).

    A tiny non-negative least squares: every subset of the three terms is fitted by ``lstsq`` on rows
    scaled by 1/y (so short and long rows count alike); subsets with a negative coefficient or too few
    independent rows are skipped, and the best remaining one wins (ties: the earlier, larger subset)."""
    w = x / y[:, None]
    best, best_err = None, math.inf
    for terms in _TERMS:
        sub = w[:, terms]
        if np.linalg.matrix_rank(sub) < len(terms):
            continue
        coef, *_ = np.linalg.lstsq(sub, np.ones(len(y)), rcond=None)
        if (coef < 0).any():
            continue
        err = float(np.square(sub @ coef - 1.0).sum())
        if err < best_err - 1e-12:
            best, best_err = np.zeros(3), err
            best[list(terms)] = coef
    if best is None:  # cannot happen for positive times (the constant alone always fits), kept for safety
        best = np.array([float(y.mean()), 0.0, 0.0])
    return best


class TimeLookup:
    """Predicted micro-batch times for (seq_group, p, r, samples), memoised.

    ``time_s``: a micro-batch of c samples is timed with the row of the smallest profiled b >= c at the
    seq_group's bound (a partial micro-batch at the end of the epoch, or a chunk of a filler group).

    ``lengths_time_s`` / ``lengths_times_s``: the price of a micro-batch from its REAL lengths. The
    runtime never computes on padding (dcp.runtime.attention; Transformer-1D packs unequal lengths into
    one row of documents), so a micro-batch of lengths n_i costs

        T = a + b1 * sum(n_i) + b2 * sum(n_i^2)

    (per-micro-batch overhead, linear work in real tokens, attention in squared lengths), not b times
    its longest sample. (a, b1, b2) >= 0 are fitted per (seq_group, p, r) to the profiled rows of the
    seq_group and the one below it (the two bounds that bracket its lengths; the first seq_group uses the
    one above), every profiled b, in relative error. The prediction is anchored at the seq_group's own
    row: T = T_row * model(n) / model(b_row samples at the bound), so a full micro-batch at the bound
    costs exactly what was measured and the fit only supplies the shape in between.
    """

    def __init__(self, table: ProfileTable) -> None:
        self._edges = table.seq_group_edges
        self._rows: dict[tuple[int, int], list] = {}
        for row in table.rows:
            self._rows.setdefault((row.seq_group, row.sp_size), []).append(row)
        for rows in self._rows.values():
            rows.sort(key=lambda r: r.micro_batch_size)
        self._memo: dict[tuple[int, int, int, int], float] = {}
        self._fits: dict[tuple[int, int, int], np.ndarray] = {}

    def _row(self, group: int, sp_size: int, samples: int):
        rows = self._rows.get((group, sp_size), [])
        row = next((r for r in rows if r.micro_batch_size >= samples), None)
        if row is None:
            raise PlanningError(
                f"no profile row for seq_group {group}, sp_size {sp_size} with micro_batch_size >= {samples}: "
                "re-profile with a larger profiling.max_micro_batch_size"
            )
        return row

    def time_s(self, group: int, sp_size: int, recompute_layers: int, samples: int) -> float:
        key = (group, sp_size, recompute_layers, samples)
        t = self._memo.get(key)
        if t is None:
            t = micro_batch_time_s(self._row(group, sp_size, samples), recompute_layers)
            self._memo[key] = t
        return t

    def length_model(self, group: int, sp_size: int, recompute_layers: int) -> tuple[float, float, float]:
        """(a, b1, b2) of ``a + b1 * sum(n) + b2 * sum(n^2)`` fitted for this seq_group (class docstring)."""
        key = (group, sp_size, recompute_layers)
        coef = self._fits.get(key)
        if coef is None:
            near = (group - 1, group) if group > 0 else (0, 1)
            x, y = [], []
            for g in near:
                for row in self._rows.get((g, sp_size), []):
                    t = micro_batch_time_s(row, recompute_layers)
                    if row.feasible and math.isfinite(t) and t > 0:
                        b, n = row.micro_batch_size, row.seq_len
                        x.append((1.0, b * n, b * n * n))
                        y.append(t)
            if not y:
                self._row(group, sp_size, 1)  # raises the PlanningError that names the missing row
            coef = _fit_length_model(np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64))
            self._fits[key] = coef
        return tuple(float(c) for c in coef)

    def anchor(self, group: int, sp_size: int, recompute_layers: int, samples: int) -> tuple[float, ...]:
        """(the anchoring row's time, a, b1, b2, the length model at that row) of micro-batches of ``samples``
        samples: their time is ``t_row * (a + b1 * tokens + b2 * squares) / at_row`` (class docstring)."""
        row = self._row(group, sp_size, samples)
        t_row = self.time_s(group, sp_size, recompute_layers, samples)
        a, b1, b2 = self.length_model(group, sp_size, recompute_layers)
        b, n = row.micro_batch_size, float(row.seq_len)
        return t_row, a, b1, b2, a + b * (b1 * n + b2 * n * n)

    def lengths_times_s(
        self, group: int, sp_size: int, recompute_layers: int, samples: int,
        tokens: np.ndarray, sq_tokens: np.ndarray,
    ) -> np.ndarray:
        """Times of micro-batches of ``samples`` samples of ``group`` whose real lengths sum to ``tokens``
        and whose squares sum to ``sq_tokens`` (arrays, one entry per micro-batch)."""
        t_row, a, b1, b2, at_row = self.anchor(group, sp_size, recompute_layers, samples)
        model = a + b1 * np.asarray(tokens, dtype=np.float64) + b2 * np.asarray(sq_tokens, dtype=np.float64)
        if not math.isfinite(t_row) or at_row <= 0:
            return np.full(np.shape(model), t_row, dtype=np.float64)
        return t_row * model / at_row

    def lengths_time_s(self, group: int, sp_size: int, recompute_layers: int, seq_lens: Sequence[int]) -> float:
        """Time of one micro-batch of ``group`` from its samples' real lengths."""
        lens = np.asarray(seq_lens, dtype=np.float64)
        return float(self.lengths_times_s(group, sp_size, recompute_layers, len(lens), np.array([lens.sum()]),
                                          np.array([np.square(lens).sum()]))[0])

    def pack_time_s(self, sp_size: int, recompute_layers: int, seq_lens: Sequence[int]) -> float:
        """Time of a packed micro-batch (one row of documents, any seq_groups), from its documents' real
        lengths with the length model of its longest document's seq_group, anchored at that group's
        smallest-b row (a pack runs as one sequence: the overhead ``a`` is paid once)."""
        longest = max(seq_lens)
        group = int(np.searchsorted(np.asarray(self._edges), longest, side="left"))
        if group >= len(self._edges):
            raise PlanningError(
                f"a pack's longest document has {longest} tokens, more than the longest seq_group "
                f"({self._edges[-1]}): add a longer seq_group edge and re-profile, or drop the sample"
            )
        lens = np.asarray(seq_lens, dtype=np.float64)
        return float(self.lengths_times_s(group, sp_size, recompute_layers, 1, np.array([lens.sum()]),
                                          np.array([np.square(lens).sum()]))[0])

    def padded_times_s(
        self, group: int, sp_size: int, recompute_layers: int, samples: int, padded_lens: np.ndarray
    ) -> np.ndarray:
        """Times of micro-batches of ``samples`` samples that are all ``padded_lens`` tokens long (the length
        model at c equal samples: a 2D micro-batch holds one shape; a 1D one priced at its longest sample)."""
        n = np.asarray(padded_lens, dtype=np.float64)
        return self.lengths_times_s(group, sp_size, recompute_layers, samples, samples * n, samples * n * n)


def micro_batch_times(mbq: MicroBatchQueues, times: TimeLookup, setting_of: Mapping[int, tuple[int, int]]) -> np.ndarray:
    """Predicted time of every micro-batch of ``mbq`` (indexed like it), each seq_group g run at
    ``setting_of[g] = (sp_size, recompute_layers)``, priced from its samples' real lengths
    (``TimeLookup.lengths_times_s``)."""
    out = np.zeros(mbq.num)
    count = np.asarray(mbq.count, dtype=np.int64)
    start = np.asarray(mbq.start, dtype=np.int64)
    for g, (p, r) in setting_of.items():
        ks = np.asarray(mbq.queue.get(g, ()), dtype=np.int64)
        if not ks.size:
            continue
        lens = mbq.seq_lens[g].astype(np.float64)
        cs = np.concatenate([[0.0], np.cumsum(lens)])
        cs2 = np.concatenate([[0.0], np.cumsum(lens * lens)])
        lo, hi = start[ks], start[ks] + count[ks]
        tokens, sq = cs[hi] - cs[lo], cs2[hi] - cs2[lo]
        if g in mbq.token_budget:  # any sample count, priced at the budget row's b (module docstring)
            out[ks] = times.lengths_times_s(g, p, r, mbq.anchor_b[g], tokens, sq)
            continue
        for c in np.unique(count[ks]).tolist():
            sel = count[ks] == c
            out[ks[sel]] = times.lengths_times_s(g, p, r, c, tokens[sel], sq[sel])
    return out
