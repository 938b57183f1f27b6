"""The runtime's control plane, charged per simulated step: its collectives and its host time.

What the runtime adds to a step besides the model's compute, the Ulysses all-to-alls (in the table's times)
and the gradient sync (``grad_sync_time_s``), from ``dcp bench scale`` (one rank of a W-rank job under the
fake process group, ``docs/scale.md``):

- collectives (the bench's census): on a logged step (every ``runtime.log_every`` steps, or
  ``advanced.stats_every``) each rank all-gathers one agreement row of 14 int64 words (112 bytes) over all W
  ranks on the exchange's group of the default backend (NCCL on GPUs); on other steps none. Priced as a
  ring (NCCL's all-gather algorithm): W - 1 hops, each one hop latency of the transport
  (``HOP_LATENCY_S``) plus its bytes at the inter-node bandwidth; ``algorithm = "tree"`` prices
  2 ceil(log2 W) hops instead, ``transport = "gloo"`` a TCP round per hop (the check group before the
  manager split was gloo).
- host time (measured): the training thread's CPU per step outside the model (collation, the iterator,
  optimize_dynamics, the engine's bookkeeping, the agreement check) on a logged and on an unlogged step,
  at 64, 512 and 4096 ranks, interpolated in log2(W) (``HOST_MS_BY_WORLD``).

Measured: host times (a 2-core shared CPU host, not a cluster node's CPU). Priced: the collectives (no
real gloo or NCCL latency at 4096 ranks was measured; ``HOP_LATENCY_S`` is assumed).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

from dcp.planner.analytic import HardwareSpec

HOP_LATENCY_S = {"nccl": 5e-6, "gloo": 50e-6}
"""[assumed] One hop of a small-message collective: NCCL's low-latency protocol over NVLink / InfiniBand
(a few microseconds per hop), gloo over TCP between hosts (kernel TCP stack twice, one network round:
tens of microseconds). Not measured at scale."""

AGREEMENT_ROW_BYTES = 14 * 8
"""[counted] dcp.runtime.exchange.ROW_WORDS int64 words per rank, what the census saw per logged step."""

HOST_MS_BY_WORLD: tuple[tuple[int, float, float], ...] = (
    (64, 2.26, 3.98),
    (512, 14.3, 9.81),
    (4096, 5.22, 6.87),
)
"""[measured] (W, host ms per unlogged step, host ms per logged step): the median over ranks 0, W/2, W-1 of
``dcp bench scale --log-every 4 --steps 9 --json`` host_ms (the training thread's CPU outside the model, the
default 50 ms sleep standing in for the device) on this project's 2-core shared host, 2026-11-26, one run on
main 07f1db3 (the logged step's flat all-gather and the plan's summary made with the view; the previous run,
branch hostms4, read (64, 1.88, 3.49), (512, 11.3, 9.29), (4096, 7.12, 16.0)). A rank's host time follows how many micro-batches it runs in a step (~0.1 ms each
warm, 0.3-0.4 ms after the device stand-in's sleep; ~35 per step at rank 2048 of 4096, 19.5 at ranks 256 and
511 of 512) more than W or whether the step is logged, so the columns are not monotone in W; docs/scale.md
has the runs."""

@dataclass(frozen=True, kw_only=True, slots=True)
class ControlCollective:
    """One collective of the runtime's control plane."""

    kind: str
    """'all_gather' or 'all_reduce'."""
    nbytes: int
    """Bytes each rank contributes."""
    when: str
    """'logged': on logged steps only; 'step': every step."""
    algorithm: str = "ring"
    """'ring' (W - 1 hops) or 'tree' (2 ceil(log2 W) hops)."""
    transport: str = "nccl"
    """'nccl' or 'gloo': the hop latency (``HOP_LATENCY_S``)."""

    def __post_init__(self) -> None:
        if self.kind not in ("all_gather", "all_reduce"):
            raise ValueError(f"ControlCollective.kind ({self.kind!r}) is not one of ['all_gather', 'all_reduce']: "
                             "pick one of those")
        if self.when not in ("logged", "step"):
            raise ValueError(f"ControlCollective.when ({self.when!r}) is not one of ['logged', 'step']: pick one")
        if self.algorithm not in ("ring", "tree"):
            raise ValueError(f"ControlCollective.algorithm ({self.algorithm!r}) is not one of ['ring', 'tree']: "
                             "pick one")
        if self.transport not in HOP_LATENCY_S:
            raise ValueError(f"ControlCollective.transport ({self.transport!r}) is not one of "
                             f"{sorted(HOP_LATENCY_S)}: pick one")


CENSUS = (ControlCollective(kind="all_gather", nbytes=AGREEMENT_ROW_BYTES, when="logged"),)
"""[measured] What ``dcp bench scale`` counted per step besides the gradient sync (docs/scale.md)."""


def collective_time_s(c: ControlCollective, world_size: int, hardware: HardwareSpec) -> float:
    """Seconds of one control collective over ``world_size`` ranks."""
    if world_size < 2:
        return 0.0
    bw = hardware.inter_node_bw_bytes_per_s if world_size > hardware.ranks_per_node else hardware.intra_node_bw_bytes_per_s
    hop = HOP_LATENCY_S[c.transport]
    if c.algorithm == "tree":
        hops = 2 * math.ceil(math.log2(world_size))
        moved = c.nbytes * (world_size if c.kind == "all_gather" else 1)
        return hops * hop + moved / bw
    hops = world_size - 1 if c.kind == "all_gather" else 2 * (world_size - 1)
    return hops * (hop + c.nbytes / bw)


def host_s(world_size: int, logged: bool) -> float:
    """Measured host seconds per step at ``world_size``, interpolated in log2(W), clamped outside 64-4096."""
    xs = [math.log2(w) for w, _, _ in HOST_MS_BY_WORLD]
    ys = [(lg if logged else un) for _, un, lg in HOST_MS_BY_WORLD]
    x = math.log2(max(world_size, 1))
    if x <= xs[0]:
        return ys[0] / 1e3
    if x >= xs[-1]:
        return ys[-1] / 1e3
    i = bisect.bisect_right(xs, x)
    f = (x - xs[i - 1]) / (xs[i] - xs[i - 1])
    return (ys[i - 1] + f * (ys[i] - ys[i - 1])) / 1e3


def logged_fraction(log_every: int, stats_every: int = 0) -> float:
    """Share of steps that gather statistics: multiples of log_every or of stats_every (inclusion-exclusion)."""
    if log_every < 1 or stats_every < 0:
        raise ValueError(f"log_every ({log_every}) must be >= 1 and stats_every ({stats_every}) >= 0: "
                         "pass runtime.log_every and advanced.stats_every")
    if not stats_every:
        return 1.0 / log_every
    both = log_every * stats_every // math.gcd(log_every, stats_every)
    return 1.0 / log_every + 1.0 / stats_every - 1.0 / both


def control_plane_s(world_size: int, hardware: HardwareSpec, *, log_every: int, stats_every: int = 0,
                    census: tuple[ControlCollective, ...] = CENSUS) -> float:
    """Mean control-plane seconds per step: host time plus the census's collectives, logged steps weighted by
    how often they come."""
    f = logged_fraction(log_every, stats_every)
    coll = {when: sum(collective_time_s(c, world_size, hardware) for c in census if c.when == when)
            for when in ("logged", "step")}
    host = f * host_s(world_size, True) + (1 - f) * host_s(world_size, False)
    return host + coll["step"] + f * coll["logged"]
