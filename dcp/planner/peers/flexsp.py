"""FlexSP (ASPLOS 2025): heterogeneous sequence-parallel groups per phase, re-implemented as a baseline.

From the paper and docs/peers.md:

1. One optimizer step per global batch (a fixed token budget cut from the stream in order), split into M
   phases that run one after another (a new group layout needs every rank): the fewest phases whose tokens
   fit memory, and up to two more, the fastest kept. Each phase count is split two ways, the faster kept: the
   paper's sorted consecutive runs (``split_sorted``, section 4.2 and appendix A), and sequences dealt longest
   first to the phase with the least GPU-work that still has room (``split_phases``).
2. Per phase, a layout of SP groups (counts of the allowed sizes summing to W) and an assignment of every
   sequence to one group, minimising the phase's makespan; a group runs its sequences as one row of documents
   within its memory capacity (1D) or one shape per micro-batch (2D). The paper solves this as a MILP over
   length buckets (``dcp.planner.peers.milp``, the same model, used to check this module on small cases).
   Here every layout is scored by a lower bound (the longest sequence on its fastest group; per size q, the
   work that needs groups >= q over their ranks), the best few are assigned longest first to the group that
   finishes each sequence earliest (LPT), then improved by moving sequences off the slowest group.
3. Recompute is global (none or full), chosen per run by the predicted compute time.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from dcp.planner.peers.common import PeerCost, cut_steps, phase_plan
from dcp.planner.plan import StepPlan
from dcp.planner.stream import PlanningError

METHOD = "flexsp"
LAYOUTS_TRIED = 6
"""Layouts (best lower bound first) assigned by LPT per phase."""
EXTRA_PHASES = 2
"""Phase counts tried beyond the fewest that fit memory."""
MOVES = 64
"""Local-search moves per phase."""


@lru_cache(maxsize=64)
def layouts(world_size: int, sizes: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
    """Every vector of group counts (one per size, ascending sizes) with sum(count x size) == world_size."""
    out: list[tuple[int, ...]] = []

    def rec(k: int, left: int, acc: list[int]) -> None:
        if k < 0:
            if left == 0:
                out.append(tuple(reversed(acc)))
            return
        for c in range(left // sizes[k], -1, -1):
            rec(k - 1, left - c * sizes[k], [*acc, c])

    rec(len(sizes) - 1, world_size, [])
    return tuple(out)


class PhaseProblem:
    """One phase: per-sequence times on every allowed size, minimum sizes, capacities (tokens per group)."""

    def __init__(self, lens: np.ndarray, sizes: tuple[int, ...], t: np.ndarray, over: np.ndarray, cap: np.ndarray,
                 ok: np.ndarray) -> None:
        """``t[s, k]``: time of sequence s alone on a group of ``sizes[k]``; ``over[k]``: the per-micro-batch
        part of it, paid once per group; ``cap[k]``: tokens a group may hold; ``ok[s, k]``: s fits that size."""
        self.lens = np.asarray(lens, dtype=np.int64)
        self.sizes = tuple(sizes)
        self.t, self.over, self.cap = np.asarray(t, dtype=np.float64), np.asarray(over), np.asarray(cap)
        self.ok = np.asarray(ok, dtype=bool) & np.isfinite(self.t)
        self._by_present: dict[tuple[bool, ...], tuple] = {}

    @classmethod
    def of(cls, lens: np.ndarray, cost: PeerCost, r: int) -> PhaseProblem:
        """The problem of these sequences on the cost model at recompute r."""
        sizes = cost.sp_sizes
        t = np.stack([cost.seq_times(lens, p, r) for p in sizes], axis=1)
        over = np.asarray([cost.overhead_s(p, r) for p in sizes])
        if cost.two_d:  # micro-batches run one after another: no token cap per group, each sample must fit
            cap = np.full(len(sizes), 2**62)
            ok = np.asarray([[cost.fits(cost.group_of(n), p, r) for p in sizes] for n in lens.tolist()],
                            dtype=bool).reshape(len(lens), len(sizes))
        else:
            cap = np.asarray([cost.capacity_tokens(p, r) for p in sizes])
            ok = lens[:, None] <= cap[None, :]
        return cls(lens, sizes, t, over, cap, ok)

    def makespan(self, kinds: list[int], where: np.ndarray) -> float:
        """The linear model's makespan of an assignment (group g of size index kinds[g] for sequence s)."""
        load = np.zeros(len(kinds))
        kind = np.asarray(kinds)
        np.add.at(load, where, self.t[np.arange(len(where)), kind[where]] - self.over[kind[where]])
        used = np.bincount(where, minlength=len(kinds)) > 0
        return float((load + np.where(used, self.over[kind], 0.0)).max(initial=0.0))

    def _present_terms(self, present: tuple[bool, ...]) -> tuple:
        """For the sizes present in a layout: the longest sequence on its fastest group, and per size q the
        work (GPU-s at its cheapest size >= q) and tokens of the sequences only sizes >= q hold (None: some
        sequence fits no present size)."""
        got = self._by_present.get(present)
        if got is None:
            ok = self.ok & np.asarray(present)[None, :]
            if not ok.any(axis=1).all():
                got = (None,)
            else:
                lb = float(np.where(ok, self.t, np.inf).min(axis=1).max())
                work = np.where(ok, self.t * np.asarray(self.sizes)[None, :], np.inf)
                need = [(~ok[:, :k].any(axis=1)) for k in range(len(self.sizes))]
                terms = [(float(work[nd, k:].min(axis=1).sum()) if nd.any() else 0.0,
                          float(self.lens[nd].sum())) for k, nd in enumerate(need)]
                got = (lb, terms)
            self._by_present[present] = got
        return got

    def lower_bound(self, counts: tuple[int, ...]) -> float:
        got = self._present_terms(tuple(c > 0 for c in counts))
        if got[0] is None:
            return math.inf
        lb, terms = got
        for k, (work, tokens) in enumerate(terms):
            if tokens <= 0:
                continue
            ranks = sum(c * p for c, p in zip(counts[k:], self.sizes[k:], strict=True))
            room = sum(c * cp for c, cp in zip(counts[k:], self.cap[k:].tolist(), strict=True))
            if ranks <= 0 or tokens > room:
                return math.inf
            lb = max(lb, work / ranks)
        return lb

    def assign(self, counts: tuple[int, ...]) -> tuple[float, list[int], np.ndarray] | None:
        """LPT then local search: (makespan estimate, size index per group, group per sequence); None: some
        sequence has no group with room."""
        kinds = [k for k, c in enumerate(counts) for _ in range(c)]
        G = len(kinds)
        kind = np.asarray(kinds)
        load = np.zeros(G)
        room = self.cap[kind].astype(np.float64)
        used = np.zeros(G, dtype=bool)
        where = np.full(len(self.lens), -1)
        order = np.argsort(-np.where(self.ok, self.t, np.inf).min(axis=1), kind="stable")
        for s in order.tolist():
            ts = self.t[s, kind] - np.where(used, self.over[kind], 0.0)
            fin = np.where(self.ok[s, kind] & (room >= self.lens[s]), load + ts, np.inf)
            j = int(np.argmin(fin))
            if not np.isfinite(fin[j]):
                return None
            load[j] = fin[j]
            room[j] -= self.lens[s]
            used[j] = True
            where[s] = j
        self._improve(kind, load, room, where)
        return float(load.max()), kinds, where

    def _improve(self, kind: np.ndarray, load: np.ndarray, room: np.ndarray, where: np.ndarray) -> None:
        """Move a sequence off the slowest group to the group where it ends earliest, while that lowers the
        slowest group's load below where it was."""
        for _ in range(MOVES):
            j = int(np.argmax(load))
            top = load[j]
            mine = np.flatnonzero(where == j)
            if len(mine) <= 1:
                return
            best = None
            for s in mine.tolist():
                ts = self.t[s, kind] - self.over[kind] * (load > 0)
                fin = np.where(self.ok[s, kind] & (room >= self.lens[s]), load + ts, np.inf)
                fin[j] = np.inf
                k = int(np.argmin(fin))
                if fin[k] < top * (1 - 1e-9) and (best is None or fin[k] < best[0]):
                    best = (float(fin[k]), s, k)
            if best is None:
                return
            _, s, k = best
            load[j] -= self.t[s, kind[j]] - self.over[kind[j]]
            load[k] = best[0]
            room[j] += self.lens[s]
            room[k] -= self.lens[s]
            where[s] = k

    def solve(self, world_size: int) -> tuple[float, list[int], np.ndarray] | None:
        scored = sorted((lb, c) for c in layouts(world_size, tuple(self.sizes))
                        if math.isfinite(lb := self.lower_bound(c)))
        best = None
        for _, counts in scored[:LAYOUTS_TRIED]:
            got = self.assign(counts)
            if got is not None and (best is None or got[0] < best[0]):
                best = got
        return best


def split_phases(lens: np.ndarray, work: np.ndarray, phases: int, cap_tokens: float) -> list[np.ndarray] | None:
    """Sequences (indices) per phase: longest first, each to the phase with the least work that has token room."""
    load = np.zeros(phases)
    room = np.full(phases, float(cap_tokens))
    out: list[list[int]] = [[] for _ in range(phases)]
    for s in np.argsort(-work, kind="stable").tolist():
        cand = np.where(room >= lens[s], load, np.inf)
        k = int(np.argmin(cand))
        if not np.isfinite(cand[k]):
            return None
        load[k] += work[s]
        room[k] -= lens[s]
        out[k].append(s)
    return [np.asarray(sorted(o), dtype=np.int64) for o in out if o]


def split_sorted(lens: np.ndarray, work: np.ndarray, phases: int, cap_tokens: np.ndarray,
                 balance: bool = True) -> list[np.ndarray] | None:
    """Sequences (indices) per phase as the paper's sequence blaster forms them (section 4.2, appendix A): the
    batch sorted by length and cut into consecutive runs, so each phase holds similar lengths and its groups can
    all be of one fitting size. Each run takes sorted sequences while that brings its work nearer an equal share
    of the work left, never past the phase capacity of its longest sequence (``cap_tokens[s]``: the most tokens
    W ranks hold in groups of the sizes s fits); where that leaves too much for the last run, each run is filled
    to capacity instead (the fewest consecutive runs; also with ``balance`` False). None when ``phases`` runs
    cannot hold the batch."""
    order = np.argsort(lens, kind="stable")
    for even in (True, False) if balance else (False,):
        out: list[np.ndarray] = []
        i, n, left = 0, len(order), float(work.sum())
        for k in range(phases):
            want, j, tok, w = left / (phases - k), i, 0.0, 0.0
            while j < n and tok + lens[order[j]] <= cap_tokens[order[j]]:
                if even and k < phases - 1 and j > i and abs(w + work[order[j]] - want) > abs(w - want):
                    break
                tok, w, j = tok + lens[order[j]], w + work[order[j]], j + 1
            if j == i:
                break
            out.append(np.sort(order[i:j]))
            left, i = left - w, j
        if i >= n:
            return out
    return None


def plan_step(ids: np.ndarray, lens: np.ndarray, shapes: np.ndarray | None, cost: PeerCost, world_size: int,
              ranks_per_node: int, r: int) -> tuple[float, list[list]] | None:
    """(compute time, phases) of one step at recompute r; a phase is [(first rank, p, micro-batches)]."""
    from dcp.planner.placement import place_largest_first

    sizes = cost.sp_sizes
    one = PhaseProblem.of(lens, cost, r)
    if not one.ok.any(axis=1).all():
        return None
    work = np.where(one.ok, one.t * np.asarray(sizes)[None, :], np.inf).min(axis=1)
    per_size = np.asarray([(world_size // p) * c for p, c in zip(sizes, one.cap.tolist(), strict=True)], dtype=float)
    phase_cap = float(per_size.max())
    seq_cap = np.where(one.ok, per_size[None, :], 0.0).max(axis=1)  # a phase's tokens if s is its longest
    fewest = max(1, math.ceil(lens.sum() / phase_cap)) if not cost.two_d else 1
    best = None
    # the sorted runs' own count: their phase capacity falls with their longest sequence, so the long end may
    # need more phases than the fewest for the whole batch; a sorted run whose groups cannot pack it (capacity
    # is per group: bin packing) is halved into two shorter consecutive runs until each fits
    splits = [([np.arange(len(lens))], False), (split_sorted(lens, work, len(lens), seq_cap, balance=False), True)]
    for m in range(max(2, fewest), fewest + EXTRA_PHASES + 1):
        # both splits, the faster kept: the paper's sorted consecutive runs, and sequences dealt longest first
        # to the least-loaded phase (every phase mixes long and short: each can pair a long sequence's large
        # group with short ones on small groups)
        splits += [(split_sorted(lens, work, m, seq_cap), True), (split_phases(lens, work, m, phase_cap), False)]
    for parts, halve in splits:
        if parts is None or (len(parts) == 1 and fewest > 1):
            continue
        total, phases, todo, ok = 0.0, [], list(parts), True
        while todo:
            part = todo.pop(0)
            sol = PhaseProblem.of(lens[part], cost, r).solve(world_size)
            if sol is None:
                if not (halve and len(part) > 1):
                    ok = False
                    break
                by_len = part[np.argsort(lens[part], kind="stable")]
                todo[:0] = [np.sort(by_len[: len(part) // 2]), np.sort(by_len[len(part) // 2 :])]
                continue
            _, kinds, where = sol
            group_sizes = [sizes[k] for k in kinds]
            order = sorted(range(len(kinds)), key=lambda g: -group_sizes[g])
            starts, _ = place_largest_first([group_sizes[g] for g in order], world_size, ranks_per_node)
            phase, t_phase = [], 0.0
            for g, st in zip(order, starts, strict=True):
                mine = part[where == g]
                if not len(mine) or st is None:
                    continue
                mbs = cost.micro_batches(ids[mine].tolist(), lens[mine].tolist(),
                                         shapes[mine] if shapes is not None else None, group_sizes[g], r)
                phase.append((st, group_sizes[g], mbs))
                t_phase = max(t_phase, sum(mb.time_s for mb in mbs))
            total += t_phase
            phases.append(phase)
        if ok and (best is None or total < best[0]):
            best = (total, phases)
    return best


def plan_epoch(ids: np.ndarray, lens: np.ndarray, shapes: np.ndarray | None, cost: PeerCost, *, world_size: int,
               ranks_per_node: int, target_tokens: float, epoch: int,
               bounds: tuple[float, float] = (0.5, 2.0)) -> tuple[list[StepPlan], dict]:
    """StepPlans (one per phase; a step's phases share its index) at the better global recompute."""
    cuts = cut_steps(lens, target_tokens, bounds)
    best, choice = None, {}
    for r in (0, cost.num_layers):
        steps, total = [], 0.0
        for a, e in cuts:
            got = plan_step(ids[a:e], lens[a:e], shapes[a:e] if shapes is not None else None, cost, world_size,
                            ranks_per_node, r)
            if got is None:
                break
            total += got[0]
            steps.append(got[1])
        else:
            if best is None or total < choice["compute_time_s"]:
                best, choice = steps, {"recompute_layers": r, "compute_time_s": total}
    if best is None:
        raise PlanningError(
            f"no layout of sp_sizes {list(cost.sp_sizes)} holds the longest sample ({int(lens.max())} tokens) in "
            "memory: raise planning.mem_capacity_gib or allow larger planning.sp_sizes"
        )
    r = choice["recompute_layers"]
    plans = [phase_plan(epoch, k, world_size, METHOD, [(st, p, r, mbs) for st, p, mbs in phase])
             for k, phases in enumerate(best) for phase in phases]
    return plans, choice
