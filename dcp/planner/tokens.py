"""Micro-batches sized in tokens (``advanced.micro_batch_tokens = "auto"``): which seq_groups pack by tokens.

A sample-count micro-batch holds b samples of its seq_group and is sized for b samples at the group's upper
bound. On real text most documents are far below their bound, so a micro-batch of b short documents does
little work and pays the per-micro-batch overhead each time. A token-packed micro-batch instead takes the
seq_group's samples in FIFO order while their real lengths fit a token budget B = b x bound of one profiled
row (b, p, r) that fits memory: every document is <= bound, so the pack holds <= B tokens, and with document
attention (the runtime runs unequal 1D lengths as one row of documents, never computing on padding) its
activation memory is at most the row's. Its time comes from the real lengths (``TimeLookup.lengths_times_s``
anchored at that row), so a pack of B tokens at the bound costs exactly the row's measured time.

``token_pack_settings`` decides per present seq_group, once per epoch, from the epoch's own samples of the
group: each candidate row's packs are formed (``token_runs``) and priced, and the best (fewest GPU-seconds
per token, p x time / tokens) wins if it beats the group's sample-count primary setting, priced the same way
on the same samples, by ``TOKEN_PACK_GAIN``. Where documents sit at their bound a pack of B tokens is exactly
b samples, so the two tie and the sample-count micro-batches stay; 2D samples (one shape per micro-batch)
never pack.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from dcp.planner.intra import Setting, candidate_settings
from dcp.planner.tuning import TOKEN_PACK_GAIN

if TYPE_CHECKING:
    from dcp.planner.source import EpochInput
    from dcp.planner.stream import TimeLookup


TOKEN_PACK_METHODS = ("dcp-inter", "dcp-intra")
"""Methods whose micro-batches can be token packs (the baselines keep b samples)."""


def token_pack_line(method: str, mode: str, budgets: dict[int, int], two_d: bool) -> str:
    """The line ``dcp plan`` prints: which seq_groups pack by tokens this epoch (``budgets``: seq_group -> token
    budget, ``MicroBatchQueues.token_budget``), or why none do (advanced.micro_batch_tokens ``mode``)."""
    if mode == "off":
        return 'token packs: off (advanced.micro_batch_tokens = "off"): every micro-batch holds b samples'
    if method not in TOKEN_PACK_METHODS:
        return f"token packs: not used: planning.method {method!r} (token packs are a DCP method's)"
    if two_d:
        return "token packs: not used: 2D data (its micro-batches pad frames and spatial tokens separately)"
    if not budgets:
        return ("token packs: not used: no seq_group's packs are predicted cheaper per token than its b-sample "
                "micro-batches (documents near their bound)")
    used = ", ".join(f"{g} ({b:,} tokens)" for g, b in sorted(budgets.items()))
    return f"token packs: seq_groups {used} pack by tokens (predicted cheaper per token than b samples)"


def token_runs(lens: np.ndarray, budget: int) -> np.ndarray:
    """Start indices of greedy packs over ``lens`` (FIFO order): a pack takes samples while their sum stays
    <= ``budget`` (a sample longer than the budget goes alone). One ``searchsorted`` per pack, not per sample."""
    cs = np.concatenate([[0], np.cumsum(np.asarray(lens, dtype=np.int64))])
    m, i, starts = len(lens), 0, []
    while i < m:
        starts.append(i)
        i = max(i + 1, int(np.searchsorted(cs, cs[i] + budget, side="right")) - 1)
    return np.asarray(starts, dtype=np.int64)


def gpu_s_per_token(times: TimeLookup, s: Setting, lens: np.ndarray, starts: np.ndarray) -> float:
    """GPU-seconds per token (p x predicted time / tokens) of micro-batches ``lens[starts[i]:starts[i+1]]``
    run with setting ``s``, each priced from its real lengths anchored at s's row."""
    x = lens.astype(np.float64)
    tokens = np.add.reduceat(x, starts)
    sq = np.add.reduceat(x * x, starts)
    t = times.lengths_times_s(s.seq_group, s.sp_size, s.recompute_layers, s.micro_batch_size, tokens, sq)
    return float(t.sum()) * s.sp_size / float(x.sum())


def token_pack_settings(inp: EpochInput, settings: dict[int, Setting], times: TimeLookup) -> dict[int, Setting]:
    """Per seq_group that packs by tokens this epoch: the setting whose row gives its budget (b x seq_len) and
    its (p, r); the others keep ``settings`` (module docstring). Empty when the option is off or data is 2D."""
    cfg = inp.config.planning
    if inp.config.advanced.micro_batch_tokens == "off" or inp.shapes is not None or not settings:
        return {}
    cands = candidate_settings(inp.table, mem_capacity_bytes=cfg.mem_capacity_bytes, sp_sizes=cfg.sp_sizes,
                               world_size=inp.world_size, ranks_per_node=cfg.ranks_per_node,
                               dynamic_recompute=inp.method == "dcp-intra")
    stream_groups = inp.groups[inp.order]
    # at a global batch, no pack larger than a rank's share of a step: coarser packs leave ranks without work
    # (DCP-inter's full recompute fits 128k-token packs at p = 1: 10 steps of 1.36M tokens on 32 ranks ran
    # 0.2 of the ideal bound on the text distribution)
    most = cfg.tokens_per_step / inp.world_size if cfg.tokens_per_step else None
    out: dict[int, Setting] = {}
    for g, s in settings.items():
        best, _ = best_token_pack(times, s, cands.get(g, []), inp.lengths[inp.order[stream_groups == g]], most)
        if best is not None:
            out[g] = best
    return out


def best_token_pack(times: TimeLookup, primary: Setting, cands: list[Setting],
                    lens: np.ndarray, most_tokens: float | None = None) -> tuple[Setting | None, float]:
    """(the candidate whose greedy token packs of ``lens`` (one seq_group, FIFO order) cost the fewest
    GPU-seconds per token, or None where none beats ``primary``'s b-sample micro-batches by TOKEN_PACK_GAIN;
    the GPU-seconds per token of the choice). ``most_tokens``: candidates with a larger budget are left out."""
    count_cost = gpu_s_per_token(times, primary, lens, np.arange(0, len(lens), primary.micro_batch_size))
    if len(lens) < 2:
        return None, count_cost
    if most_tokens is not None:
        cands = [c for c in cands if c.micro_batch_size * c.seq_len <= most_tokens]
    best, best_cost = None, 0.0
    # smaller p, then the larger budget first on a tie: the same order as the sample-count choice
    ranked = sorted(cands, key=lambda c: (c.sp_size, -c.micro_batch_size, c.recompute_layers))
    for c in ranked:  # ranked on vectorised near-greedy packs; the winner is then priced on the real ones
        cost = gpu_s_per_token(times, c, lens, _near_runs(lens, c.micro_batch_size * c.seq_len))
        if best is None or cost < best_cost:
            best, best_cost = c, cost
    if best is None:
        return None, count_cost
    cost = gpu_s_per_token(times, best, lens, token_runs(lens, best.micro_batch_size * best.seq_len))
    return (best, cost) if cost < count_cost * (1.0 - TOKEN_PACK_GAIN) else (None, count_cost)


def _near_runs(lens: np.ndarray, budget: int) -> np.ndarray:
    """Starts of packs that cut the token stream every ``budget`` tokens (a sample goes to the pack its last
    token falls in): close to ``token_runs``'s greedy packs, in numpy, for ranking candidate budgets."""
    pack = (np.cumsum(lens) - 1) // budget
    return np.concatenate([[0], np.flatnonzero(np.diff(pack)) + 1]).astype(np.int64)
