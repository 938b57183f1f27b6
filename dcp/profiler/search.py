"""Which candidates (seq_group, b, p) to profile, skipping what cannot fit. Pure Python, no torch.

Per SP size p (ascending) and seq_group, :class:`BatchSearch` grows the micro-batch size b = 1, 2, 4, ...
up to ``max_micro_batch_size`` and stops when

- the candidate ran out of memory (row marked infeasible), or its predicted memory with full recompute
  (Eq. 6, r = L) exceeds the capacity;
- the next b is *predicted* not to fit: activation memory grows linearly in b, so
  ``M(2b) ~= M(b) + (M(b) - state)`` where ``state`` (parameters, gradients, optimizer) does not grow;
  such candidates are never run;
- the time per token at r = L stopped improving (by more than ``improve_tol``) over the best so far.

:func:`sp_sizes_to_try` lists the SP sizes a model can use (at most the world size): those dividing its heads,
and, for a model that states its K/V heads, multiples of them past the heads (a Ulysses x context layout,
``dcp.planner.layout``).
:func:`pending_groups` decides which seq_groups a phase at SP size p profiles: those that did not fit
at b = 1 with every smaller p ("grow p when b = 1 no longer fits"), and, unless ``grow_only``, also the
ones that did fit (a larger p frees memory that DCP-intra turns into less recompute). A size past the heads
profiles only the seq_groups no smaller size holds at b = 1: its context axis adds an exposed K/V all-gather
per attention, so where a Ulysses size fits it can only lose (fewer recomputed layers do not pay for it at
the lengths that fit), and the profile grows by those long seq_groups alone. A seq_group
longer than one that does not fit at b = 1 with the same p cannot fit either (memory grows with
length), so it is skipped without running.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from dcp.planner.cost import micro_batch_mem_bytes, micro_batch_time_s
from dcp.planner.table import ProfileRow


class SearchError(ValueError):
    """No SP size can be profiled; the message says which rule excluded each one and how to fix it."""


def sp_sizes_to_try(
    sp_sizes: Iterable[int], *, num_heads: int, world_size: int, max_sp_size: int | None = None,
    num_kv_heads: int | None = None,
) -> list[int]:
    """SP sizes (ascending) that have a layout for the heads (dividing ``num_heads``, or, given
    ``num_kv_heads``, a multiple of it past the heads: ``past_heads``), fit in the world and the adapter's limit."""
    sizes = sorted(set(sp_sizes))
    ok = [
        p for p in sizes
        if (num_heads % p == 0 or past_heads(p, num_heads, num_kv_heads)) and p <= world_size
        and (max_sp_size is None or p <= max_sp_size)
    ]
    if not ok:
        raise SearchError(
            f"planning.sp_sizes ({sizes}) has no size that divides num_heads ({num_heads}), is <= world_size "
            f"({world_size}) and <= the adapter's limit ({max_sp_size}): include 1 in planning.sp_sizes"
        )
    return ok


def past_heads(sp_size: int, num_heads: int, num_kv_heads: int | None) -> bool:
    """``sp_size`` runs past the head count: all K/V heads on the Ulysses axis, the rest context parallel
    (``dcp.planner.layout.sp_layout``). Only for a model that states its K/V heads (None: it cannot)."""
    return bool(num_kv_heads) and sp_size > num_heads and sp_size % num_kv_heads == 0


def row_fits(row: ProfileRow, capacity_bytes: float) -> bool:
    """Feasible and within the capacity with full recompute (Eq. 6 at r = L)."""
    return row.feasible and micro_batch_mem_bytes(row, row.num_layers) <= capacity_bytes


def time_per_token_s(row: ProfileRow) -> float:
    """Full-recompute time per token (lower is better; per rank, so p does not enter)."""
    return micro_batch_time_s(row, row.num_layers) / row.tokens


@dataclass(slots=True)
class BatchSearch:
    """Adaptive search over b for one (seq_group, p); ``next_b()`` then ``record(row)`` until None."""

    max_micro_batch_size: int
    """Largest b to try."""
    capacity_bytes: float
    """Memory capacity per rank (bytes)."""
    state_bytes: float
    """Memory that does not grow with b (parameters, gradients, optimizer state)."""
    improve_tol: float = 0.03
    """Relative improvement of time per token below which growing b stops."""
    rows: list[ProfileRow] = field(default_factory=list)
    """Rows recorded so far, in order of b."""
    done: bool = False
    """True once the search has stopped."""
    reason: str = ""
    """Why it stopped: 'infeasible', 'capacity', 'predicted', 'no-gain' or 'max-b'."""

    def next_b(self) -> int | None:
        if self.done:
            return None
        if not self.rows:
            return 1
        b = 2 * self.rows[-1].micro_batch_size
        if b > self.max_micro_batch_size:
            return self._stop("max-b")
        last = self.rows[-1]
        m = micro_batch_mem_bytes(last, last.num_layers)
        if m + (m - self.state_bytes) * (b / last.micro_batch_size - 1) > self.capacity_bytes:
            return self._stop("predicted")
        return b

    def _stop(self, reason: str) -> None:
        self.done, self.reason = True, reason
        return None

    def record(self, row: ProfileRow) -> None:
        self.rows.append(row)
        if not row.feasible:
            self._stop("infeasible")
        elif not row_fits(row, self.capacity_bytes):
            self._stop("capacity")
        elif len(self.rows) > 1:
            best = min(time_per_token_s(r) for r in self.rows[:-1] if r.feasible)
            if time_per_token_s(row) > best * (1.0 - self.improve_tol):
                self._stop("no-gain")

    @property
    def fits_at_b1(self) -> bool:
        return bool(self.rows) and self.rows[0].micro_batch_size == 1 and row_fits(self.rows[0], self.capacity_bytes)


def pending_groups(
    num_groups: int, rows: Sequence[ProfileRow], sp_size: int, capacity_bytes: float, *, grow_only: bool
) -> list[int]:
    """seq_groups a phase at ``sp_size`` profiles, given the rows of the phases before it (smaller p).
    ``grow_only`` (also what a size past the heads gets: module docstring): only those no smaller p holds."""
    fits_smaller = {r.seq_group for r in rows if r.sp_size < sp_size and r.micro_batch_size == 1 and row_fits(r, capacity_bytes)}
    if grow_only:
        return [g for g in range(num_groups) if g not in fits_smaller]
    return list(range(num_groups))


def assign_round_robin(groups: Sequence[int], num_blocks: int) -> list[list[int]]:
    """seq_groups per block: block k takes groups k, k + n, ... (longest groups are spread first)."""
    order = sorted(groups, reverse=True)
    out: list[list[int]] = [[] for _ in range(num_blocks)]
    for i, g in enumerate(order):
        out[i % num_blocks].append(g)
    return [sorted(x) for x in out]
