"""Sync-aware group ends: a group's last micro-batch made long enough to hide the gradient all-reduce.

The ddp engine all-reduces the gradients in buckets during the backward of every rank's last micro-batch, and a
bucket's all-reduce can start only once the LAST rank has produced it. With n buckets of a sync of S seconds,
a busy group g that ends at ``end_g`` after a last backward of ``b_g`` lets the step's sync end at

    f_g = end_g + max(S - b_g (1 - 1/n), S / n)

(its buckets come ready evenly over [end_g - b_g, end_g] and run one after another), and the step ends at
``max_g f_g``: the rule ``dcp.sim.cluster.exposed_sync_groups_s`` prices. A group of short micro-batches whose
last backward is shorter than S (text's 8k-token packs at p = 1: 0.35 s of backward beside a 0.48 s sync of
t1d-5b on 32 H200) therefore exposes S - b_g to every rank of the step.

``SyncEnd`` rewrites a finished StepPlan: per group, merging its last micro-batch with one other of the group
(1D data, the pair run as one row of documents, as a token pack runs) gives a longer last backward at the cost
of the merged pair's extra time (more recompute where the larger micro-batch needs it to fit memory: its
memory is bounded by the table row whose b x bound holds its tokens, as the simulator bounds it). Each group
has two options (as planned, or its best merge); the step's end is the largest f_g, so the least end any
choice reaches is ``F = max_g min(f_g options)``, and exactly the groups whose plan as is ends past F merge
(each with the other micro-batch that ends it earliest). Nothing else moves: the step's samples, tokens and
groups stay. The merged micro-batch's time is priced from its real lengths (``TimeLookup.lengths_time_s``)
at its recompute depth.

Active only where the sync is known (``planning.grad_sync_s > 0``), with the ddp engine, on 1D data and below
``BULK_MIN_RANKS`` ranks (the numpy packer's scale, where planning cost counts); otherwise the plans are
exactly those without it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dcp.config import GRAD_BUCKET_MIB
from dcp.planner.cost import min_recompute_layers
from dcp.planner.plan import StepPlan
from dcp.planner.source import EpochInput
from dcp.planner.stream import TimeLookup
from dcp.planner.table import ProfileRow
from dcp.planner.tuning import BULK_MIN_RANKS

GAIN_EPS_S = 1e-9
"""A group merges only when its plan as is ends the step's sync more than this after the best reachable end."""


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
    """The step's gradient all-reduce (planning.grad_sync_s)."""
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

    @classmethod
    def of(cls, inp: EpochInput, times: TimeLookup) -> SyncEnd | None:
        """The rewrite of this epoch, or None where it does not apply (module docstring)."""
        cfg = inp.config
        if (cfg.planning.grad_sync_s <= 0 or cfg.runtime.engine != "ddp" or inp.shapes is not None
                or inp.world_size < 2 or inp.world_size >= BULK_MIN_RANKS):
            return None
        rows: dict[tuple[int, int], list[ProfileRow]] = {}
        for row in inp.table.rows:
            rows.setdefault((row.seq_group, row.sp_size), []).append(row)
        for rs in rows.values():
            rs.sort(key=lambda r: r.micro_batch_size)
        grad_bytes = cfg.model.num_params * cfg.model.param_bytes
        buckets = max(1, round(grad_bytes / (GRAD_BUCKET_MIB * 2**20))) if grad_bytes > 0 else 1
        return cls(sync_s=cfg.planning.grad_sync_s, buckets=buckets,
                   mem_capacity_bytes=cfg.planning.mem_capacity_bytes, full_recompute=inp.method != "dcp-intra",
                   times=times, rows=rows)

    def mem_row(self, seq_group: int, sp_size: int, lens: np.ndarray) -> ProfileRow | None:
        """The row bounding a micro-batch's memory (the simulator's rule): samples of one length at the smallest
        b >= their count; unequal lengths (one row of documents) at the smallest b whose b x bound holds their
        tokens, else by count."""
        cand = self.rows.get((seq_group, sp_size), [])
        by_size = next((r for r in cand if r.micro_batch_size >= len(lens)), None)
        if by_size is not None and int(lens.min()) == int(lens.max()):
            return by_size
        tokens = int(lens.sum())
        return next((r for r in cand if r.micro_batch_size * r.seq_len >= tokens), None) or by_size

    def __call__(self, plan: StepPlan) -> StepPlan:
        """``plan`` with the groups that hold the step's sync back ending in a grown last micro-batch (the same
        plan object where none gains)."""
        start = np.concatenate([[0], np.cumsum(plan.ga_steps)]).astype(np.int64)
        mb_r = (plan.mb_recompute_layers if plan.mb_recompute_layers is not None
                else np.repeat(plan.recompute_layers, plan.ga_steps))
        s_start = np.concatenate([[0], np.cumsum(plan.mb_size)]).astype(np.int64)
        options: list[tuple[int, float, list]] = []  # (group, f as planned, [(f, added s, merge), ...])
        for gi in range(len(plan.ga_steps)):
            a, e = int(start[gi]), int(start[gi + 1])
            if e == a:
                continue
            end = float(plan.mb_time_s[a:e].sum())
            f0 = self._f(plan, gi, e - 1, end, float(plan.mb_time_s[e - 1]), int(mb_r[e - 1]), s_start)
            grow = self._merges(plan, gi, a, e, end, mb_r, s_start) if e - a > 1 and f0 > end + self._floor() else []
            options.append((gi, f0, grow))
        if not options:
            return plan
        reach = max(min([f0] + [f for f, _, _ in grow]) for _, f0, grow in options)
        merges = {}
        for gi, f0, grow in options:
            if f0 > reach + GAIN_EPS_S:  # the least added time among the merges that reach the step's end
                merges[gi] = min((o for o in grow if o[0] <= reach + GAIN_EPS_S), key=lambda o: (o[1], o[0]))[2]
        return _merged(plan, merges, start, s_start) if merges else plan

    def _floor(self) -> float:
        """The least a group's f exceeds its end by: the last bucket."""
        return self.sync_s / self.buckets

    def _f(self, plan: StepPlan, gi: int, k: int, end: float, t: float, r: int, s_start: np.ndarray) -> float:
        """f_g of group ``gi`` ending at ``end`` with micro-batch ``k`` (time ``t``, depth ``r``) last."""
        lens = plan.seq_len_array[s_start[k]:s_start[k + 1]]
        row = self.mem_row(int(plan.mb_seq_group[k]), int(plan.sp_size[gi]), lens)
        back = t * backward_share(row, r) if row is not None else 0.0
        return sync_end_s(end, back, self.sync_s, self.buckets)

    def _merges(self, plan: StepPlan, gi: int, a: int, e: int, end: float, mb_r: np.ndarray,
                s_start: np.ndarray) -> list[tuple[float, float, tuple]]:
        """(f_g, added seconds, merge) of the group's last micro-batch grown by the first k samples of one other
        micro-batch j, for every k and j among the shortest micro-batch of each seq_group of the group."""
        last, p = e - 1, int(plan.sp_size[gi])
        if int(plan.mb_seq_group[last]) < 0:
            return []
        shortest: dict[int, int] = {}
        for k in range(a, last):
            g = int(plan.mb_seq_group[k])
            if g >= 0 and (g not in shortest or plan.mb_time_s[k] < plan.mb_time_s[shortest[g]]):
                shortest[g] = k
        out: list[tuple[float, float, tuple]] = []
        for j in shortest.values():
            out.extend(self._grow(plan, p, j, last, end, int(mb_r[j]), s_start))
        return out

    def _grow(self, plan: StepPlan, p: int, j: int, last: int, end: float, r_j: int,
              s_start: np.ndarray) -> list[tuple[float, float, tuple]]:
        """Every k up to the first whose backward hides the sync: the last micro-batch with j's first k samples
        (j keeps the rest at its r, priced by its length model's share of its time; all of them: j goes) as
        (f, added s, (j, k, r, time, j's time, seq_group)), in numpy per memory row."""
        g_j = int(plan.mb_seq_group[j])
        group = max(g_j, int(plan.mb_seq_group[last]))
        lens_j = plan.seq_len_array[s_start[j]:s_start[j + 1]]
        lens_l = plan.seq_len_array[s_start[last]:s_start[last + 1]]
        t_j, t_l = float(plan.mb_time_s[j]), float(plan.mb_time_s[last])
        x_j = lens_j.astype(np.float64)
        # k = 1 .. m: the grown micro-batch's samples, tokens, squares, and whether its lengths are all equal
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
        aj, b1j, b2j = self.times.length_model(g_j, p, r_j)
        whole = aj + b1j * x_j.sum() + b2j * float(np.square(x_j).sum())
        rest_tok = x_j.sum() - np.cumsum(x_j)
        rest_sq = float(np.square(x_j).sum()) - np.cumsum(x_j * x_j)
        t_rest = np.where(np.arange(1, len(x_j) + 1) < len(x_j),
                          t_j * (aj + b1j * rest_tok + b2j * rest_sq) / whole if whole > 0 else 0.0, 0.0)
        t = np.full(len(x_j), np.inf)
        back = np.zeros(len(x_j))
        r_of = np.zeros(len(x_j), dtype=np.int64)
        for i in np.unique(idx[idx < len(rows)]).tolist():
            row, hit = rows[i], idx == i
            r = row.num_layers if self.full_recompute else min_recompute_layers(row, self.mem_capacity_bytes)
            if r is None:
                continue
            t[hit] = self.times.lengths_times_s(group, p, r, row.micro_batch_size, tok[hit], sq[hit])
            back[hit] = t[hit] * backward_share(row, r)
            r_of[hit] = r
        ok = np.isfinite(t)
        hides = np.flatnonzero(ok & (back >= self.sync_s))
        n = int(hides[0]) + 1 if len(hides) else len(t)  # more samples than the first that hides only add time
        added = t + t_rest - t_j - t_l
        tail = np.maximum(self.sync_s - back * (1.0 - 1.0 / self.buckets), self.sync_s / self.buckets)
        f = end + added + tail
        return [(float(f[k]), float(added[k]), (j, k + 1, int(r_of[k]), float(t[k]), float(t_rest[k]), group))
                for k in np.flatnonzero(ok[:n]).tolist()]


def _merged(plan: StepPlan, merges: dict[int, tuple], start: np.ndarray, s_start: np.ndarray) -> StepPlan:
    """``plan`` with, in every group of ``merges`` (j, k, r, time, j's time, seq_group), the first k samples of
    its micro-batch j moved into its last one (j's, then the last's), which runs at that r, time and seq_group;
    j keeps the rest at its time (dropped when k takes all); the other micro-batches keep their order."""
    mb_r = (plan.mb_recompute_layers if plan.mb_recompute_layers is not None
            else np.repeat(plan.recompute_layers, plan.ga_steps))
    s_parts: list[np.ndarray] = []
    ga = plan.ga_steps.copy()
    r_group = plan.recompute_layers.copy()
    t_new, g_new, n_new, r_new = [], [], [], []

    def add(samples: np.ndarray, t: float, g: int, r: int) -> None:
        s_parts.append(samples)
        t_new.append(t)
        g_new.append(g)
        n_new.append(len(samples))
        r_new.append(r)

    for gi in range(len(ga)):
        a, e = int(start[gi]), int(start[gi + 1])
        m = merges.get(gi)
        for k in range(a, e if m is None else e - 1):
            samples = np.arange(s_start[k], s_start[k + 1])
            if m is not None and k == m[0]:
                if m[1] == len(samples):
                    ga[gi] -= 1
                    continue
                add(samples[m[1]:], m[4], int(plan.mb_seq_group[k]), int(mb_r[k]))
            else:
                add(samples, float(plan.mb_time_s[k]), int(plan.mb_seq_group[k]), int(mb_r[k]))
        if m is not None:
            j, k, r, t, _, group = m
            add(np.concatenate([np.arange(s_start[j], s_start[j] + k), np.arange(s_start[e - 1], s_start[e])]),
                t, group, r)
            r_group[gi] = max(int(r_group[gi]), r)
    samples = np.concatenate(s_parts) if s_parts else np.zeros(0, dtype=np.int64)
    r_arr = np.asarray(r_new, dtype=np.int64)
    own = np.repeat(r_group, ga)
    return StepPlan.from_arrays(
        plan.epoch, plan.step, plan.world_size, plan.method, first_rank=plan.first_rank, sp_size=plan.sp_size,
        recompute_layers=r_group, ga_steps=ga, mb_time_s=np.asarray(t_new, dtype=np.float64),
        mb_seq_group=np.asarray(g_new, dtype=np.int64), mb_size=np.asarray(n_new, dtype=np.int64),
        sample_ids=plan.sample_id_array[samples], seq_lens=plan.seq_len_array[samples],
        mb_recompute_layers=None if np.array_equal(r_arr, own) else r_arr, owned=True)
