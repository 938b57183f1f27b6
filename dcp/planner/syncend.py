"""Sync-aware group ends: a group's last micro-batch made long enough to hide the gradient all-reduce.

The ddp engine all-reduces the gradients in buckets during the backward of every rank's last micro-batch, and a
bucket's all-reduce can start only once the LAST rank has produced it. With n buckets of a sync of S seconds,
a busy group g that ends at ``end_g`` after a last backward of ``b_g`` lets the step's sync end at

    f_g = end_g + max(S - b_g (1 - 1/n), S / n)

(its buckets come ready evenly over [end_g - b_g, end_g] and run one after another), and the step ends at
``max_g f_g``: the rule ``dcp.sim.cluster.exposed_sync_groups_s`` prices. A group of short micro-batches whose
last backward is shorter than S (text's 8k-token packs at p = 1: 0.35 s of backward beside a 0.48 s sync of
t1d-5b on 32 H200) therefore exposes S - b_g to every rank of the step.

``SyncEnd`` rewrites a finished StepPlan (the step's samples, tokens, groups and ranks stay; only which
micro-batch of which group holds a sample moves), greedily: while the group with the latest f (the bottleneck)
can end earlier, the move that lowers its f the most is made, either

- its last micro-batch grown by the first k samples of another of its micro-batches (a longer last backward;
  1D samples run as one row of documents, as a token pack runs), or
- the first k samples of one of its micro-batches moved into the last micro-batch of another group, one of the
  ``SHED_RECEIVERS`` least-ended of its p or of the same number of any other p (its end drops; the receiver's
  backward grows),

for every k and, per seq_group, the group's shortest micro-batch as the donor. A grown micro-batch runs at the
receiver's p with the minimal r that fits memory under the row whose b x bound holds its tokens (the simulator
bounds its memory by that row), priced from its real lengths at that r and row
(``TimeLookup.lengths_times_s``); the donor keeps the rest at its r, priced by its length model's share of its
time. A move is made only when the larger of the two groups' new f is below the bottleneck's f by
``GAIN_EPS_S``; at most ``MAX_MOVES_PER_GROUP`` per busy group.

Active only where the sync is known (``advanced.grad_sync_s > 0``, else the figure the profiler measured on the
job's ranks: :func:`measured_sync_s`), with the ddp engine, on 1D data and below
``BULK_MIN_RANKS`` ranks (where planning cost counts, ``tuning.BULK_MIN_RANKS``); otherwise the plans are
exactly those without it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from dcp.config import GRAD_BUCKET_MIB
from dcp.planner.cost import memory_row, micro_batch_time_s, min_recompute_layers, row_lookup
from dcp.planner.plan import StepPlan
from dcp.planner.source import EpochInput
from dcp.planner.stream import TimeLookup
from dcp.planner.table import ProfileRow, ProfileTable
from dcp.planner.tuning import BULK_MIN_RANKS, GAIN_EPS_S, MAX_MOVES_PER_GROUP, SHED_RECEIVERS


def measured_sync_s(table: ProfileTable, world_size: int) -> float:
    """The gradient sync the profiler measured on the job's own ranks (``dcp.profiler.update``: the ddp engine's
    flattened all-reduce of the model's gradients, the slowest rank's median, so every rank reads the same
    figure and plans alike), when the table was profiled for ``world_size`` ranks with the ddp engine; else 0."""
    extra = table.meta.extra
    value = extra.get("grad_sync_s", 0.0)
    if (table.meta.world_size != world_size or extra.get("update_engine", "ddp") != "ddp"
            or not isinstance(value, (int, float)) or not math.isfinite(value)):
        return 0.0
    return max(0.0, float(value))


def backward_share(row: ProfileRow, recompute_layers: int) -> float:
    """Share of a micro-batch's layer time spent in backward (its recompute included), from its table row."""
    fwd = row.num_layers * row.t_f_s
    bwd = row.num_layers * row.t_b_s + recompute_layers * row.t_f_s
    return bwd / (fwd + bwd) if fwd + bwd > 0 else 0.0


def sync_end_s(end_s: float, backward_s: float, sync_s: float, buckets: int) -> float:
    """When the step's sync ends as far as a group that ends at ``end_s`` after a last backward of
    ``backward_s`` holds it back (module docstring)."""
    return end_s + max(sync_s - backward_s * (1.0 - 1.0 / buckets), sync_s / buckets)


@dataclass(frozen=True, slots=True, kw_only=True)
class SyncEnd:
    """What the rewrite needs of the epoch: the sync, the memory limit and the cost source."""

    sync_s: float
    """The step's gradient all-reduce (advanced.grad_sync_s)."""
    buckets: int
    """The ddp engine's gradient buckets: the model's gradient bytes over GRAD_BUCKET_MIB."""
    mem_capacity_bytes: float
    """planning.mem_capacity_bytes."""
    full_recompute: bool
    """DCP-inter: every micro-batch recomputes all layers (the merged one too)."""
    times: TimeLookup
    """The epoch's cost source (the merged micro-batch is priced from its real lengths)."""
    rows: dict[tuple[int, int], list[ProfileRow]]
    """The table's rows by (seq_group, p), ascending b."""
    models: dict[tuple, tuple[float, float, float, float, float]] = field(default_factory=dict)
    """Memo of the length models: (seq_group, p, r, b) -> (the row's time, a, b1, b2, the model at the row)."""

    @classmethod
    def of(cls, inp: EpochInput, times: TimeLookup) -> SyncEnd | None:
        """The rewrite of this epoch, or None where it does not apply (module docstring)."""
        cfg = inp.config
        sync_s = cfg.advanced.grad_sync_s or measured_sync_s(inp.table, inp.world_size)
        if (sync_s <= 0 or cfg.runtime.engine != "ddp" or inp.shapes is not None
                or inp.world_size < 2 or inp.world_size >= BULK_MIN_RANKS):
            return None
        grad_bytes = cfg.model.num_params * cfg.model.param_bytes
        buckets = max(1, round(grad_bytes / (GRAD_BUCKET_MIB * 2**20))) if grad_bytes > 0 else 1
        if buckets == 1:  # one bucket starts after every backward (f_g = end_g + S): no end can hide any of it
            return None
        return cls(sync_s=sync_s, buckets=buckets,
                   mem_capacity_bytes=cfg.planning.mem_capacity_bytes, full_recompute=inp.method != "dcp-intra",
                   times=times, rows=row_lookup(inp.table))

    def mem_row(self, seq_group: int, sp_size: int, lens: np.ndarray) -> ProfileRow | None:
        """The row bounding a micro-batch's memory (``cost.memory_row``, the simulator's rule)."""
        return memory_row(self.rows.get((seq_group, sp_size), []), len(lens), int(lens.sum()),
                          int(lens.min()) == int(lens.max()))

    def __call__(self, plan: StepPlan) -> StepPlan:
        """``plan`` with samples moved into groups' last micro-batches where that ends the step's sync earlier
        (module docstring); the same plan object where nothing gains."""
        st = _State.of(plan)
        busy = [gi for gi, mbs in enumerate(st.mbs) if mbs]
        if not busy:
            return plan
        f = {gi: self._f(st, gi) for gi in busy}
        moved = False
        for _ in range(MAX_MOVES_PER_GROUP * len(busy)):
            g = max(busy, key=lambda gi: (f[gi], -gi))
            best = self._best_move(st, g, busy, f)
            if best is None:
                break
            st.apply(*best[1:])
            for gi in {g, best[1]}:
                f[gi] = self._f(st, gi)
            moved = True
        return st.plan(plan) if moved else plan

    def _f(self, st: _State, gi: int) -> float:
        """f_g of group ``gi`` as it stands."""
        pos, t, sg, r = st.mbs[gi][-1]
        row = self.mem_row(sg, st.p[gi], st.lens[pos])
        back = t * backward_share(row, r) if row is not None else 0.0
        return sync_end_s(sum(m[1] for m in st.mbs[gi]), back, self.sync_s, self.buckets)

    def _best_move(self, st: _State, g: int, busy: list[int], f: dict[int, float]) -> tuple | None:
        """(the step's new f over the two groups, receiver, donor micro-batch, k, grown time, donor's rest time,
        seq_group, r) of the move that lowers the bottleneck group ``g``'s f the most (its own last micro-batch
        grown from another of its micro-batches, or samples of one of them into the last micro-batch of one
        of the SHED_RECEIVERS least-ended groups of its p or of as many of other p); None where none lowers it."""
        mbs = st.mbs[g]
        donors: dict[int, int] = {}  # the shortest non-last micro-batch of every seq_group
        for j in range(len(mbs) - 1):
            if mbs[j][2] >= 0 and (mbs[j][2] not in donors or mbs[j][1] < mbs[donors[mbs[j][2]]][1]):
                donors[mbs[j][2]] = j
        if not donors:
            return None
        ranked = sorted((h for h in busy if h != g and st.mbs[h][-1][2] >= 0), key=lambda h: (f[h], h))
        same = [h for h in ranked if st.p[h] == st.p[g]][:SHED_RECEIVERS]
        receivers = [g, *same, *[h for h in ranked if h not in same][:SHED_RECEIVERS]]
        end_g = sum(m[1] for m in mbs)
        best = None
        for h in receivers:
            for j in donors.values():
                cand = self._grow(st, h, mbs[j], st.p[g])
                if cand is None:
                    continue
                t, t_rest, back, r, group = cand
                tail = np.maximum(self.sync_s - back * (1.0 - 1.0 / self.buckets), self.sync_s / self.buckets)
                shed = t_rest - mbs[j][1]
                if h == g:
                    score = end_g + (t - mbs[-1][1]) + shed + tail
                else:
                    score = np.maximum(f[g] + shed, sum(m[1] for m in st.mbs[h]) + t - st.mbs[h][-1][1] + tail)
                k = int(np.argmin(score))
                if score[k] < f[g] - GAIN_EPS_S and (best is None or score[k] < best[0]):
                    best = (float(score[k]), h, g, j, k + 1, float(t[k]), float(t_rest[k]), group, int(r[k]))
        return best

    def _grow(self, st: _State, h: int, donor: list, p_donor: int) -> tuple | None:
        """Per k = 1 .. the donor's samples: group ``h``'s last micro-batch with the donor's first k samples
        (the donor keeps the rest at its r, priced by its length model's share of its time; all: it goes):
        (its time, the donor's rest time, its backward, its r; arrays) and its seq_group, in numpy per memory
        row; None where no k fits memory."""
        p = st.p[h]
        pos_l, t_l, g_l, _ = st.mbs[h][-1]
        pos_j, t_j, g_j, r_j = donor
        group = max(g_j, g_l)
        lens_j, lens_l = st.lens[pos_j], st.lens[pos_l]
        x_j = lens_j.astype(np.float64)
        count = len(lens_l) + np.arange(1, len(lens_j) + 1)
        tok = float(lens_l.sum()) + np.cumsum(x_j)
        sq = float(np.square(lens_l.astype(np.float64)).sum()) + np.cumsum(x_j * x_j)
        lo = np.minimum(np.minimum.accumulate(lens_j), lens_l.min())
        hi = np.maximum(np.maximum.accumulate(lens_j), lens_l.max())
        rows = self.rows.get((group, p), [])
        size = np.asarray([r.micro_batch_size for r in rows], dtype=np.int64)
        cap = np.asarray([r.micro_batch_size * r.seq_len for r in rows], dtype=np.float64)
        by_size = np.searchsorted(size, count, side="left")
        by_tok = np.searchsorted(cap, tok, side="left")
        idx = np.where((lo == hi) & (by_size < len(rows)), by_size, np.where(by_tok < len(rows), by_tok, by_size))
        # no more samples than a profiled b: a truth table re-times a micro-batch at the row of b >= its count
        idx[by_size >= len(rows)] = len(rows)
        _, aj, b1j, b2j, _ = self._model(g_j, p_donor, r_j, None)  # the rest stays at the donor's p
        whole = aj + b1j * x_j.sum() + b2j * float(np.square(x_j).sum())
        rest = (aj + b1j * (x_j.sum() - np.cumsum(x_j)) + b2j * (float(np.square(x_j).sum()) - np.cumsum(x_j * x_j)))
        t_rest = np.where(np.arange(1, len(x_j) + 1) < len(x_j), t_j * rest / whole if whole > 0 else 0.0, 0.0)
        t = np.full(len(x_j), np.inf)
        back = np.zeros(len(x_j))
        r_of = np.zeros(len(x_j), dtype=np.int64)
        for i in np.unique(idx[idx < len(rows)]).tolist():
            row, hit = rows[i], idx == i
            r = min_recompute_layers(row, self.mem_capacity_bytes)  # None: not even r = L fits (or infeasible)
            if r is None:
                continue
            r = row.num_layers if self.full_recompute else r
            # anchored at the memory row, as a token pack is at its budget's row (``dcp.planner.tokens``)
            t[hit] = self._price(group, p, r, row, tok[hit], sq[hit])
            back[hit] = t[hit] * backward_share(row, r)
            r_of[hit] = r
        if not np.isfinite(t).any():
            return None
        return t, t_rest, back, r_of, group


    def _model(self, group: int, p: int, r: int, row: ProfileRow | None) -> tuple[float, float, float, float, float]:
        """(time of ``row`` at depth r, a, b1, b2, the model at that row; the last two 0 without a row), memoised."""
        key = (group, p, r, row.micro_batch_size if row is not None else 0)
        m = self.models.get(key)
        if m is None:
            a, b1, b2 = self.times.length_model(group, p, r)
            if row is None:
                m = (0.0, a, b1, b2, 0.0)
            else:
                b, n = row.micro_batch_size, float(row.seq_len)
                m = (micro_batch_time_s(row, r), a, b1, b2, a + b * (b1 * n + b2 * n * n))
            self.models[key] = m
        return m

    def _price(self, group: int, p: int, r: int, row: ProfileRow, tok: np.ndarray, sq: np.ndarray) -> np.ndarray:
        """``TimeLookup.lengths_times_s`` anchored at ``row`` (one of the seq_group's at p), models memoised."""
        t_row, a, b1, b2, at_row = self._model(group, p, r, row)
        if not np.isfinite(t_row) or at_row <= 0:
            return np.full(len(tok), t_row)
        return t_row * (a + b1 * tok + b2 * sq) / at_row


class _State:
    """A plan's micro-batches per group as [sample positions, time, seq_group, r], changed by moves."""

    def __init__(self, lens: np.ndarray, p: list[int], mbs: list[list[list]]) -> None:
        self.lens, self.p, self.mbs = lens, p, mbs

    @classmethod
    def of(cls, plan: StepPlan) -> _State:
        mb_r = (plan.mb_recompute_layers if plan.mb_recompute_layers is not None
                else np.repeat(plan.recompute_layers, plan.ga_steps))
        start = np.concatenate([[0], np.cumsum(plan.ga_steps)]).astype(np.int64)
        s_start = np.concatenate([[0], np.cumsum(plan.mb_size)]).astype(np.int64)
        mbs = [[[np.arange(s_start[k], s_start[k + 1]), float(plan.mb_time_s[k]), int(plan.mb_seq_group[k]),
                 int(mb_r[k])] for k in range(int(start[gi]), int(start[gi + 1]))] for gi in range(len(plan.ga_steps))]
        return cls(plan.seq_len_array, plan.sp_size.tolist(), mbs)

    def apply(self, h: int, g: int, j: int, k: int, t: float, t_rest: float, group: int, r: int) -> None:
        """Group ``g``'s micro-batch j gives its first k samples to group ``h``'s last micro-batch (time t,
        seq_group, r); j keeps the rest at ``t_rest`` (removed when k takes all)."""
        donor, last = self.mbs[g][j], self.mbs[h][-1]
        self.mbs[h][-1] = [np.concatenate([donor[0][:k], last[0]]), t, group, r]
        if k == len(donor[0]):
            del self.mbs[g][j]
        else:
            self.mbs[g][j] = [donor[0][k:], t_rest, donor[2], donor[3]]

    def plan(self, old: StepPlan) -> StepPlan:
        """The StepPlan of the groups as they stand (group r: the most of the old and its micro-batches')."""
        flat = [m for mbs in self.mbs for m in mbs]
        ga = np.asarray([len(mbs) for mbs in self.mbs], dtype=np.int64)
        r_group = np.asarray([max([int(old.recompute_layers[gi])] + [m[3] for m in mbs])
                              for gi, mbs in enumerate(self.mbs)], dtype=np.int64)
        r_arr = np.asarray([m[3] for m in flat], dtype=np.int64)
        samples = np.concatenate([m[0] for m in flat]) if flat else np.zeros(0, dtype=np.int64)
        return StepPlan.from_arrays(
            old.epoch, old.step, old.world_size, old.method, first_rank=old.first_rank, sp_size=old.sp_size,
            recompute_layers=r_group, ga_steps=ga, mb_time_s=np.asarray([m[1] for m in flat], dtype=np.float64),
            mb_seq_group=np.asarray([m[2] for m in flat], dtype=np.int64),
            mb_size=np.asarray([len(m[0]) for m in flat], dtype=np.int64), sample_ids=old.sample_id_array[samples],
            seq_lens=old.seq_len_array[samples],
            mb_recompute_layers=None if np.array_equal(r_arr, np.repeat(r_group, ga)) else r_arr, owned=True)
