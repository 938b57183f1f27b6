"""StepPlan: the value that says, for one optimizer step, which ranks form which SP groups and what each runs.

Every rank computes the same plans from the same inputs; ``StepPlan.digest()`` is what ranks compare.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np


class MicroBatch(NamedTuple):
    """What one SP group runs in one forward/backward: samples of one seq_group (or a packed set).

    A NamedTuple rather than a frozen dataclass: the planner builds ~5 of these per rank and step, and a
    tuple is created several times faster (20k per step at W = 4096).
    """

    sample_ids: tuple[int, ...]
    """Dataset indices of the samples, in stream order."""
    seq_lens: tuple[int, ...]
    """Token count of each sample (same order)."""
    seq_group: int
    """seq_group index of the samples; -1 for a packed micro-batch of mixed lengths."""
    time_s: float = 0.0
    """Predicted time of this micro-batch on its SP group."""
    recompute_layers: int = -1
    """r this micro-batch runs at; -1: its group's (``GroupPlan.recompute_layers``). A group runs its
    micro-batches one after another and frees activations after each backward, so each may run its own
    minimal r at the group's p (``StepPlan.mb_recompute_layers``)."""

    @property
    def tokens(self) -> int:
        return sum(self.seq_lens)

    @property
    def size(self) -> int:
        return len(self.sample_ids)


class GroupPlan(NamedTuple):
    """One SP group of a step: a contiguous block of ranks and the micro-batches it accumulates.

    A NamedTuple for the same reason as MicroBatch: a step at W = 4096 holds thousands of groups.
    """

    first_rank: int
    """Lowest rank of the block; the group is ranks first_rank .. first_rank + sp_size - 1."""
    sp_size: int
    """p: ranks sharing each sequence of this group."""
    recompute_layers: int
    """r: layers that recompute activations in backward (r = L: full recompute); the most any of its
    micro-batches runs at (a micro-batch may run less, ``MicroBatch.recompute_layers``)."""
    micro_batches: tuple[MicroBatch, ...]
    """The group's micro-batches; len() is its ga_steps. Empty: the ranks idle this step."""

    @property
    def ranks(self) -> tuple[int, ...]:
        return tuple(range(self.first_rank, self.first_rank + self.sp_size))

    @property
    def ga_steps(self) -> int:
        return len(self.micro_batches)

    @property
    def time_s(self) -> float:
        return sum(mb.time_s for mb in self.micro_batches)

    @property
    def tokens(self) -> int:
        return sum(mb.tokens for mb in self.micro_batches)

    @property
    def samples(self) -> int:
        return sum(mb.size for mb in self.micro_batches)

    def recompute_of(self, mb: MicroBatch) -> int:
        """r that micro-batch ``mb`` (one of this group's) runs at."""
        return mb.recompute_layers if mb.recompute_layers >= 0 else self.recompute_layers


def _check_lengths(groups: int, sp: int, rc: int, ga: np.ndarray, mbs: int, seq_groups: int, mb_size: np.ndarray,
                   samples: int, lens: int) -> None:
    if not (sp == rc == len(ga) == groups and int(ga.sum()) == mbs == seq_groups == len(mb_size)
            and int(mb_size.sum()) == samples == lens):
        raise ValueError(
            f"StepPlan arrays disagree in length: ga_steps must sum to the micro-batches ({int(ga.sum())} vs "
            f"{mbs} times) and mb_size to the samples ({int(mb_size.sum())} vs {samples} ids, {lens} lengths), "
            f"one entry per group in each group array ({groups} first ranks): build them from the same plan"
        )


def _frozen(values, dtype, owned: bool = False) -> np.ndarray:
    """A read-only copy: the plan never shares memory with (or freezes) its caller's arrays, unless the caller
    hands them over (``owned``: an array of this dtype that owns its memory is frozen in place, not copied)."""
    if owned and isinstance(values, np.ndarray) and values.dtype == dtype and values.base is None:
        values.flags.writeable = False
        return values
    arr = np.array(values, dtype=dtype, copy=True)
    arr.flags.writeable = False
    return arr


def _int64(values, owned: bool = False) -> np.ndarray:
    return _frozen(values, np.int64, owned)


def _runs(starts: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """The positions of consecutive runs (``starts[i]``, ``sizes[i]`` long), concatenated."""
    offset = np.cumsum(sizes) - sizes
    return np.repeat(starts - offset, sizes) + np.arange(int(sizes.sum()), dtype=np.int64)


class StepPlan:
    """One optimizer step: SP groups that together cover ranks 0 .. world_size - 1 exactly once.

    Held as flat arrays (groups, then their micro-batches, then their samples, each in order), so that a step
    of 25,000 micro-batches at 4096 ranks is built, digested and summarised in numpy. ``groups`` and
    ``group_of`` give the GroupPlan / MicroBatch view, built on first use: a rank needs only its own group.
    Build one from GroupPlans (``StepPlan(epoch, step, world_size, method, groups)``) or from arrays
    (``StepPlan.from_arrays``, what the assembler does). Immutable; equal when every decision and time is.
    """

    __slots__ = ("epoch", "step", "world_size", "method", "first_rank", "sp_size", "recompute_layers",
                 "ga_steps", "mb_time_s", "mb_seq_group", "mb_size", "sample_id_array", "seq_len_array",
                 "mb_recompute_layers", "_mb_start", "_sample_start", "_owner", "_groups", "_views")

    epoch: int
    """Epoch the step belongs to."""
    step: int
    """Step index within the epoch (0-based)."""
    world_size: int
    """W: all ranks of the job."""
    method: str
    """bucket, packed, dcp-inter or dcp-intra."""
    first_rank: np.ndarray
    """Per group (ascending unless built from GroupPlans in another order): its lowest rank."""
    sp_size: np.ndarray
    """Per group: p."""
    recompute_layers: np.ndarray
    """Per group: r."""
    ga_steps: np.ndarray
    """Per group: its micro-batch count (0: the ranks idle this step)."""
    mb_time_s: np.ndarray
    """Per micro-batch, group by group: predicted time on its group."""
    mb_seq_group: np.ndarray
    """Per micro-batch: seq_group (-1: a packed micro-batch)."""
    mb_size: np.ndarray
    """Per micro-batch: its sample count."""
    sample_id_array: np.ndarray
    """Per sample, micro-batch by micro-batch: dataset index."""
    seq_len_array: np.ndarray
    """Per sample: token count."""
    mb_recompute_layers: np.ndarray | None
    """Per micro-batch: the r it runs at, where some micro-batch runs another r than its group's (a group
    runs its micro-batches one after another, so each may use its own minimal r at the group's p); None:
    every micro-batch runs its group's r (then the plan and its digest are as without the field)."""

    def __init__(self, epoch: int, step: int, world_size: int, method: str, groups: Sequence[GroupPlan]) -> None:
        groups = tuple(groups)
        mbs = [mb for g in groups for mb in g.micro_batches]
        self._set(
            epoch, step, world_size, method,
            first_rank=[g.first_rank for g in groups], sp_size=[g.sp_size for g in groups],
            recompute_layers=[g.recompute_layers for g in groups], ga_steps=[len(g.micro_batches) for g in groups],
            mb_time_s=[mb.time_s for mb in mbs], mb_seq_group=[mb.seq_group for mb in mbs],
            mb_size=[len(mb.sample_ids) for mb in mbs],
            sample_ids=[i for mb in mbs for i in mb.sample_ids], seq_lens=[n for mb in mbs for n in mb.seq_lens],
            groups=groups, mb_recompute_layers=_mb_r_of(groups),
        )

    @classmethod
    def from_arrays(
        cls, epoch: int, step: int, world_size: int, method: str, *, first_rank, sp_size, recompute_layers,
        ga_steps, mb_time_s, mb_seq_group, mb_size, sample_ids, seq_lens, mb_recompute_layers=None,
        owned: bool = False,
    ) -> StepPlan:
        """A plan from flat arrays: per group (any order: the plan sorts them by first rank, keeping each
        group's micro-batches and samples in order), per micro-batch and per sample, as the attributes.
        ``owned``: the caller hands its arrays over (the assembler's, made for this plan): those of the plan's
        dtype are frozen in place instead of copied (a step at 4096 ranks holds up to ~2M samples).
        ``mb_recompute_layers``: per micro-batch its r, or None (each runs its group's)."""
        first = np.asarray(first_rank, dtype=np.int64)
        order = np.argsort(first, kind="stable")
        ga = np.asarray(ga_steps, dtype=np.int64)
        _check_lengths(len(first), len(sp_size), len(recompute_layers), ga, len(mb_time_s), len(mb_seq_group),
                       np.asarray(mb_size, dtype=np.int64), len(sample_ids), len(seq_lens))
        if mb_recompute_layers is not None:
            mb_recompute_layers = _mb_r(mb_recompute_layers, len(mb_time_s), owned)
        if len(order) and np.any(order != np.arange(len(order))):
            # micro-batches by their group's new place, then samples by their micro-batch's: runs, kept in order
            size = np.asarray(mb_size, dtype=np.int64)
            mb_order = _runs((np.cumsum(ga) - ga)[order], ga[order])
            s_order = _runs((np.cumsum(size) - size)[mb_order], size[mb_order])
            first, ga = first[order], ga[order]
            sp_size, recompute_layers = np.asarray(sp_size)[order], np.asarray(recompute_layers)[order]
            mb_time_s, mb_seq_group = np.asarray(mb_time_s)[mb_order], np.asarray(mb_seq_group)[mb_order]
            if mb_recompute_layers is not None:
                mb_recompute_layers = np.asarray(mb_recompute_layers)[mb_order]
            mb_size = size[mb_order]
            sample_ids, seq_lens = np.asarray(sample_ids)[s_order], np.asarray(seq_lens)[s_order]
            owned = True  # every array is a new one made here
        plan = cls.__new__(cls)
        plan._set(epoch, step, world_size, method, first_rank=first, sp_size=sp_size,
                  recompute_layers=recompute_layers, ga_steps=ga, mb_time_s=mb_time_s, mb_seq_group=mb_seq_group,
                  mb_size=mb_size, sample_ids=sample_ids, seq_lens=seq_lens, owned=owned,
                  mb_recompute_layers=mb_recompute_layers)
        return plan

    def with_sample_ids(self, sample_ids) -> StepPlan:
        """The same plan (groups in the same order) over other sample ids (one per sample, in the plan's
        order), e.g. a loader's own."""
        plan = StepPlan.__new__(StepPlan)
        plan._set(self.epoch, self.step, self.world_size, self.method, first_rank=self.first_rank,
                  sp_size=self.sp_size, recompute_layers=self.recompute_layers, ga_steps=self.ga_steps,
                  mb_time_s=self.mb_time_s, mb_seq_group=self.mb_seq_group, mb_size=self.mb_size,
                  sample_ids=sample_ids, seq_lens=self.seq_len_array, mb_recompute_layers=self.mb_recompute_layers)
        return plan

    def _set(self, epoch, step, world_size, method, *, first_rank, sp_size, recompute_layers, ga_steps,
             mb_time_s, mb_seq_group, mb_size, sample_ids, seq_lens, groups=None, owned: bool = False,
             mb_recompute_layers=None) -> None:
        """Every constructor's one path: read-only copies (``owned``: arrays handed over, frozen in place), the
        length and rank-cover checks; ``groups``: the GroupPlans it was built from (kept as its view), else None
        (the view is built on first use)."""
        self.epoch, self.step, self.world_size, self.method = epoch, step, world_size, method
        self.first_rank, self.sp_size = _int64(first_rank, owned), _int64(sp_size, owned)
        self.recompute_layers, self.ga_steps = _int64(recompute_layers, owned), _int64(ga_steps, owned)
        times = _frozen(mb_time_s, np.float64, owned)
        self.mb_time_s, self.mb_seq_group = times, _int64(mb_seq_group, owned)
        self.mb_size = _int64(mb_size, owned)
        self.sample_id_array, self.seq_len_array = _int64(sample_ids, owned), _int64(seq_lens, owned)
        _check_lengths(len(self.first_rank), len(self.sp_size), len(self.recompute_layers), self.ga_steps,
                       len(self.mb_time_s), len(self.mb_seq_group), self.mb_size, len(self.sample_id_array),
                       len(self.seq_len_array))
        self.mb_recompute_layers = None
        if mb_recompute_layers is not None:
            self.mb_recompute_layers = _mb_r(mb_recompute_layers, len(self.mb_size), owned)
        self._mb_start = np.concatenate([[0], np.cumsum(self.ga_steps)])
        self._sample_start = np.concatenate([[0], np.cumsum(self.mb_size)])
        self._owner = self._cover()
        self._views: dict[int, GroupPlan] = {}
        self._groups = groups

    def _cover(self) -> np.ndarray:
        """Rank -> group index; raises unless the groups cover every rank once."""
        W, first, p = self.world_size, self.first_rank, self.sp_size
        if W < 1 or (len(p) and int(p.min()) < 1):
            bad = int(np.argmin(p)) if len(p) else -1
            raise ValueError(
                f"StepPlan needs world_size >= 1 and every sp_size >= 1: world_size {W}"
                + (f", group {bad} has sp_size {int(p[bad])}" if bad >= 0 else "")
                + "; a group holds at least one rank"
            )
        order = np.argsort(first, kind="stable")
        f, q = first[order], p[order]
        if len(f) and f[0] == 0 and np.all(f[1:] == (f + q)[:-1]) and f[-1] + q[-1] == W:
            return np.repeat(order, q)
        # the slow path only names the first offending rank, group by group in the given order
        owner = [-1] * W
        for gi, (a, n) in enumerate(zip(first.tolist(), p.tolist(), strict=True)):
            bad = next((r for r in range(a, a + n) if not 0 <= r < W or owner[r] != -1), None)
            if bad is not None:
                raise ValueError(
                    f"StepPlan groups overlap or leave the world: rank {bad} of group {gi} "
                    f"(world_size {W}); the assembler must place each rank once"
                )
            owner[a : a + n] = [gi] * n
        raise ValueError(f"StepPlan leaves rank {owner.index(-1)} without a group: cover all ranks")

    # ----- the GroupPlan view ---------------------------------------------------------------------
    def _group(self, gi: int) -> GroupPlan:
        view = self._views.get(gi)
        if view is None:
            a, e = int(self._mb_start[gi]), int(self._mb_start[gi + 1])
            cuts = self._sample_start[a : e + 1].tolist()
            ids, lens = self.sample_id_array, self.seq_len_array
            mbs = tuple(
                MicroBatch(tuple(ids[lo:hi].tolist()), tuple(lens[lo:hi].tolist()), sg, t, r)
                for lo, hi, sg, t, r in zip(cuts[:-1], cuts[1:], self.mb_seq_group[a:e].tolist(),
                                             self.mb_time_s[a:e].tolist(), _view_r(self, a, e), strict=True)
            )
            view = self._views[gi] = GroupPlan(int(self.first_rank[gi]), int(self.sp_size[gi]),
                                               int(self.recompute_layers[gi]), mbs)
        return view

    @property
    def groups(self) -> tuple[GroupPlan, ...]:
        """SP groups in the plan's order (by first rank when built from arrays)."""
        if self._groups is None:
            ids, lens = tuple(self.sample_id_array.tolist()), tuple(self.seq_len_array.tolist())
            cuts = self._sample_start.tolist()
            mbs = [
                MicroBatch(ids[lo:hi], lens[lo:hi], sg, t, r)
                for lo, hi, sg, t, r in zip(cuts[:-1], cuts[1:], self.mb_seq_group.tolist(),
                                             self.mb_time_s.tolist(), _view_r(self, 0, len(self.mb_size)),
                                             strict=True)
            ]
            starts = self._mb_start.tolist()
            self._groups = tuple(
                GroupPlan(f, p, r, tuple(mbs[a:e]))
                for f, p, r, a, e in zip(self.first_rank.tolist(), self.sp_size.tolist(),
                                         self.recompute_layers.tolist(), starts[:-1], starts[1:], strict=True)
            )
        return self._groups

    # ----- lookups -------------------------------------------------------------------------------
    def group_of(self, rank: int) -> GroupPlan:
        gi = int(self._owner[rank])
        return self._groups[gi] if self._groups is not None else self._group(gi)

    def group_index_of(self, rank: int) -> int:
        return int(self._owner[rank])

    @property
    def sample_ids(self) -> tuple[int, ...]:
        return tuple(self.sample_id_array.tolist())

    @property
    def tokens(self) -> int:
        return int(self.seq_len_array.sum())

    @property
    def samples(self) -> int:
        return len(self.sample_id_array)

    # ----- predicted cost ----------------------------------------------------------------------
    @property
    def group_times_s(self) -> np.ndarray:
        """Per group: the sum of its micro-batches' predicted times (0 for an idle group)."""
        mb_group = np.repeat(np.arange(len(self.ga_steps)), self.ga_steps)
        return np.bincount(mb_group, weights=self.mb_time_s, minlength=len(self.ga_steps))

    @property
    def step_time_s(self) -> float:
        """Predicted step time: the slowest group's accumulated time."""
        t = self.group_times_s
        return float(t.max()) if len(t) else 0.0

    @property
    def idle_ratio_batch(self) -> float:
        """Paper's per-batch form: Eq. 3 counts every batch (SP group) once, whatever its GPUs; as a ratio of
        the step time, the mean over busy groups of (T* - g_i T_i) / T*."""
        times = self.group_times_s
        busy = times[self.ga_steps > 0]
        t = float(times.max()) if len(times) else 0.0
        if not len(busy) or t <= 0:
            return 0.0
        return float((t - busy).sum() / (len(busy) * t))

    @property
    def idle_ratio_gpu(self) -> float:
        """GPU-weighted idle fraction: sum_i p_i (T* - g_i T_i) / (W T*); idle ranks count as fully idle."""
        times = self.group_times_s
        t = float(times.max()) if len(times) else 0.0
        if t <= 0:
            return 0.0
        return float((self.sp_size * (t - times)).sum() / (self.world_size * t))

    # ----- identity ------------------------------------------------------------------------------
    def digest(self) -> str:
        """sha256 of the plan's decisions (ranks, sizes, recompute, micro-batch cuts, sample ids, in order);
        equal on every rank. Predicted times are not part of it."""
        h = hashlib.sha256(f"e{self.epoch}s{self.step}w{self.world_size}{self.method}".encode())
        for arr in (self.first_rank, self.sp_size, self.recompute_layers, self.ga_steps, self.mb_size,
                    self.sample_id_array):
            h.update(len(arr).to_bytes(8, "little"))
            h.update(arr.astype("<i8", copy=False).tobytes())
        if self.mb_recompute_layers is not None:  # (absent: the digest of a plan without the field)
            h.update(b"mb_recompute_layers")
            h.update(self.mb_recompute_layers.astype("<i8", copy=False).tobytes())
        return h.hexdigest()

    def summary(self) -> str:
        sps = ",".join(map(str, self.sp_size.tolist()))
        gas = ",".join(map(str, self.ga_steps.tolist()))
        rc = ",".join(map(str, self.recompute_layers.tolist()))
        return f"sp=[{sps}] ga=[{gas}] recompute=[{rc}]"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, StepPlan):
            return NotImplemented
        return (
            (self.epoch, self.step, self.world_size, self.method)
            == (other.epoch, other.step, other.world_size, other.method)
            and all(np.array_equal(getattr(self, a), getattr(other, a)) for a in _ARRAYS)
            and _same_mb_r(self.mb_recompute_layers, other.mb_recompute_layers)
        )

    def __hash__(self) -> int:
        # equal plans have equal arrays, hence equal digests (times aside, which equality also compares)
        return hash((self.digest(), self.mb_time_s.tobytes()))

    def __getstate__(self) -> dict:
        return {a: getattr(self, a) for a in (*_HEADER, *_ARRAYS, "mb_recompute_layers", "_groups")}

    def __setstate__(self, state: dict) -> None:
        # rebuilt through _set: read-only copies and the rank cover again, as on construction
        self._set(*(state[a] for a in _HEADER), first_rank=state["first_rank"], sp_size=state["sp_size"],
                  recompute_layers=state["recompute_layers"], ga_steps=state["ga_steps"],
                  mb_time_s=state["mb_time_s"], mb_seq_group=state["mb_seq_group"], mb_size=state["mb_size"],
                  sample_ids=state["sample_id_array"], seq_lens=state["seq_len_array"], groups=state["_groups"],
                  mb_recompute_layers=state.get("mb_recompute_layers"))

    def __repr__(self) -> str:
        return (f"StepPlan(epoch={self.epoch}, step={self.step}, world_size={self.world_size}, "
                f"method={self.method!r}, groups={len(self.first_rank)}, micro_batches={len(self.mb_size)}, "
                f"samples={self.samples})")


_HEADER = ("epoch", "step", "world_size", "method")
_ARRAYS = ("first_rank", "sp_size", "recompute_layers", "ga_steps", "mb_time_s", "mb_seq_group", "mb_size",
           "sample_id_array", "seq_len_array")


def _mb_r(values, n: int, owned: bool) -> np.ndarray:
    """``mb_recompute_layers`` frozen, checked: one r >= 0 per micro-batch."""
    arr = _int64(values, owned)
    if arr.shape != (n,) or (n and int(arr.min()) < 0):
        raise ValueError(
            f"StepPlan mb_recompute_layers (shape {arr.shape}, min {int(arr.min()) if arr.size else None}) must "
            f"hold one r >= 0 per micro-batch ({n}): build it with the plan's micro-batches, or pass None"
        )
    return arr


def _same_mb_r(a: np.ndarray | None, b: np.ndarray | None) -> bool:
    return (a is None) == (b is None) and (a is None or np.array_equal(a, b))


def _mb_r_of(groups: Sequence[GroupPlan]) -> list[int] | None:
    """``mb_recompute_layers`` of GroupPlans: None unless some micro-batch runs another r than its group's."""
    if all(mb.recompute_layers in (-1, g.recompute_layers) for g in groups for mb in g.micro_batches):
        return None
    return [g.recompute_of(mb) for g in groups for mb in g.micro_batches]


def _view_r(plan: StepPlan, a: int, e: int) -> list[int]:
    """Micro-batches a .. e-1 of ``plan``: the r each runs at where it is not its group's, else -1 (the view's
    ``MicroBatch.recompute_layers``: a plan built from those views is this plan)."""
    if plan.mb_recompute_layers is None:
        return [-1] * (e - a)
    own = plan.mb_recompute_layers[a:e]
    group = np.searchsorted(plan._mb_start, np.arange(a, e), side="right") - 1  # (a rank's view: its group only)
    return np.where(own == plan.recompute_layers[group], -1, own).tolist()
