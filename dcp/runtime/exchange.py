"""The agreement exchange: one row per rank, all-gathered at a few points, and the checks on the table.

At the first step of every ``get_data_iter()`` call, at every logged step (``runtime.log_every`` /
``stats_every``) and at the end of the epoch (or a pause), each rank contributes one int64 row: where it is
in the training loop, a digest of its data, a running digest of every step plan it ran since the previous
exchange, and the finished step's loss, count and busy time. Every rank checks the same table in the same
order (position, data, plans), so a mismatch raises the same error everywhere instead of a hang in the next
collective; when the plans differ, a second (failure-only) gather names the first step that differs.
Unlogged steps run no collective here: the plan digests are folded in as the steps are planned, so no
plan is computed twice and nothing beyond the first step's plan before it runs.

The rows travel on the exchange's own process group of the DEFAULT backend (NCCL on GPUs, gloo on CPU),
with its own timeout (``advanced.plan_check_timeout_s``): never matched against a gradient collective of a
rank that is elsewhere in the loop, and without a gloo ring over the whole world.

Row layout (14 int64 words):

| words | what |
|---|---|
| 0-3 | the running sha256 over the digests of the step plans run since the previous exchange, 4 words |
| 4 | the finished step's loss sum: float64 bits |
| 5 | its label count (-1: the model gave no count) |
| 6 | its busy time in ns |
| 7-9 | position: kind (``KINDS``), epoch, step |
| 10-13 | sha256 of the rank's dataset lengths, target counts and shapes, 4 words |
"""

from __future__ import annotations

import hashlib
import logging
from contextlib import nullcontext
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from dcp.config import AdvancedConfig, RuntimeConfig
from dcp.distributed.comm import backend_device
from dcp.runtime.log import StepStats
from dcp.runtime.phases import PhaseBoard
from dcp.runtime.step import FinishedStep
from dcp.runtime.weighting import check_step_count

ROW_WORDS = 14

KINDS = ("the plan check of epoch {e}", "the start of epoch {e} step {s}", "the end of epoch {e}",
         "a pause before epoch {e} step {s}")
"""What a row says about where its rank is in the loop (word 7); all ranks must agree."""


class PlanMismatchError(ValueError):
    """Ranks computed different step plans (or different numbers of steps); raised on every rank."""


class DataMismatchError(PlanMismatchError):
    """Ranks hold different datasets (lengths, target counts or shapes); raised on every rank before a step."""


def gather_into(out: torch.Tensor, row: torch.Tensor, group: Any) -> None:
    """All-gather ``row`` into the flat ``out``: ``all_gather_single`` where torch has it (2.13 does, and its
    ``all_gather_into_tensor`` warns), else ``all_gather_into_tensor``. Looked up at each call, so a
    wrapper set on ``torch.distributed`` (a test's, the bench's census) is the one called."""
    fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    fn(out, row, group=group)


def digest_words(text: str) -> torch.Tensor:
    """sha256 of ``text`` as 4 int64 words."""
    return torch.frombuffer(bytearray(hashlib.sha256(text.encode()).digest()), dtype=torch.int64).clone()


def step_row(marker: str, stats: tuple[torch.Tensor, torch.Tensor | None, float] | None, *, kind: int,
             epoch: int, step: int, data_words: torch.Tensor) -> torch.Tensor:
    """This rank's row. ``stats``: the finished step's (float64 loss sum, label count or None, busy
    seconds), host tensors; None when no step finished (its words stay 0)."""
    row = torch.zeros(ROW_WORDS, dtype=torch.int64)
    row[:4] = digest_words(marker)
    if stats is not None:
        loss, count, busy_s = stats
        row[4] = loss.reshape(1).view(torch.int64)[0]
        row[5] = count if count is not None else -1
        row[6] = int(busy_s * 1e9)
    row[7], row[8], row[9] = kind, epoch, step
    row[10:14] = data_words
    return row


def gathered_stats(table: torch.Tensor) -> tuple[float, int, tuple[float, ...]]:
    """From the gathered rows: the step's loss sum over ranks, its label count (-1 when a rank's model gave
    none) and every rank's busy seconds."""
    loss_sum = float(table[:, 4].clone().view(torch.float64).sum())
    counts = table[:, 5]
    count = int(counts.sum()) if bool((counts >= 0).all()) else -1
    return loss_sum, count, tuple((table[:, 6].double() / 1e9).tolist())  # not a loop over W 0-dim tensors


def plans_differ(table: torch.Tensor) -> bool:
    """True when the rows' plan digests (words 0-3) are not all equal."""
    return bool((table[:, :4] != table[0, :4]).any())


def check_agreement(table: torch.Tensor, where: str, first_step: str = "") -> None:
    """Raise, with the same message on every rank, when the gathered rows disagree on where the ranks are in
    the loop, on their data, or on their step plans (``first_step``: the first differing step, when known)."""
    checked = torch.cat((table[:, :4], table[:, 7:14]), dim=1)  # plan digest, position, data digest
    if bool((checked == checked[0]).all()):
        # one comparison over the W rows: at 4096 ranks the per-row lists below cost ~50-100 ms of host time
        # per logged step (dcp bench scale), so they are built only to name the ranks that differ
        return
    positions = [tuple(int(v) for v in r[7:10]) for r in table]
    if any(p != positions[0] for p in positions):
        listing = ", ".join(f"rank {r} at {KINDS[k].format(e=e, s=st)}" for r, (k, e, st) in enumerate(positions))
        raise PlanMismatchError(
            f"the ranks are at different points of the training loop ({listing}): a rank left "
            "get_data_iter() early (a break, an exception caught inside the loop, or a different max_steps) "
            "or skipped an epoch; every rank must run the same steps: stop all ranks together with "
            "get_data_iter(max_steps=...) and resume with state_dict()/load_state_dict()"
        )
    data = [bytes(r[10:14].numpy().tobytes()).hex() for r in table]
    bad = [r for r, d in enumerate(data) if d != data[0]]
    if bad:
        listing = ", ".join(f"rank {r}: {d[:16]}" for r, d in enumerate(data))
        raise DataMismatchError(
            f"{where}: the ranks' datasets differ (ranks {bad} disagree with rank 0 on the digest of "
            f"dataset.lengths(), target_counts(), sample_shapes() and content_digest(); digests {listing}): every "
            "rank must hold the same samples in the same order (same files, filters and seed; dcp plans over the whole "
            "dataset on every rank, do not shard it yourself)"
        )
    digests = [bytes(r[:4].numpy().tobytes()).hex() for r in table]
    bad = [r for r, d in enumerate(digests) if d != digests[0]]
    if bad:
        listing = ", ".join(f"rank {r}: {d[:16]}" for r, d in enumerate(digests))
        raise PlanMismatchError(
            f"{where}: step plans differ across ranks{' from ' + first_step + ' on' if first_step else ''} "
            f"(ranks {bad} disagree with rank 0; digests {listing}): "
            "every rank must plan from identical inputs: check that dataset.lengths(), the DCPConfig "
            "(planning.seed, method, sp_sizes, gmin/gmax), the profile table and the world size are the same "
            "on every rank (broadcast a table measured on rank 0 instead of profiling per rank)"
        )


class AgreementExchange:
    """Folds the plans in as they run, runs the all-gather of agreement rows, turns a logged step's table
    into its ``StepStats``."""

    def __init__(self, runtime: RuntimeConfig, advanced: AdvancedConfig, *, rank: int, world_size: int,
                 data_words: torch.Tensor, board: PhaseBoard | None, log: logging.Logger) -> None:
        self.runtime, self.advanced, self.rank, self.world_size = runtime, advanced, rank, world_size
        self.data_words, self.board, self.log = data_words, board, log
        self.group: Any = None
        self.device = torch.device("cpu")
        if dist.is_available() and dist.is_initialized() and world_size > 1:
            # The default backend (NCCL on GPUs), in a group of its own: its timeout is the plan check's, and a
            # rank that is elsewhere in the loop never has its gradient sync matched against these rows.
            self.group = dist.new_group(timeout=timedelta(seconds=advanced.plan_check_timeout_s))
            self.device = backend_device(self.group)
        self.exchanges = 0
        """Exchanges run so far (a collective each when world_size > 1)."""
        self._chain = hashlib.sha256()
        self._since: list[tuple[int, int, str]] = []
        """(epoch, step, plan digest) of every plan run since the previous exchange."""

    def wants_stats(self, global_step: int) -> bool:
        """Whether the step numbered ``global_step`` is exchanged (the same answer on every rank)."""
        rt = self.runtime
        every = self.advanced.stats_every
        return global_step % rt.log_every == 0 or bool(every and global_step % every == 0)

    def note_plan(self, epoch: int, step: int, digest: str) -> None:
        """Fold the plan of the step about to run (its ``plan.digest()``, computed where the plan was prepared:
        dcp.runtime.stepview) into the running digest (no collective)."""
        self._chain.update(digest.encode())
        self._since.append((epoch, step, digest))

    def run(self, stats: tuple[torch.Tensor, torch.Tensor | None, float] | None, *, where: str,
            kind: int, epoch: int, step: int) -> torch.Tensor:
        """All-gather this rank's row and check the table (raises the same error on every rank); the running
        digest starts afresh after it."""
        marker = f"{len(self._since)} plans {self._chain.hexdigest()}"
        row = step_row(marker, stats, kind=kind, epoch=epoch, step=step, data_words=self.data_words)
        table = self._gather(row, KINDS[kind].format(e=epoch, s=step))
        self.exchanges += 1
        # every rank sees the same table, so every rank takes the failure-only gather, or none does
        first = self._first_differing_step() if plans_differ(table) else ""
        check_agreement(table, where, first)
        self._chain, self._since = hashlib.sha256(), []
        return table

    def _gather(self, row: torch.Tensor, phase: str) -> torch.Tensor:
        if self.group is None:
            return row[None]
        row = row.to(self.device)
        # one flat output (gloo takes no 2-D one): a list of W row tensors, stacked afterwards, cost the training
        # thread ~4 ms per exchange at 4096 ranks (dcp bench scale --log-every 1)
        out = torch.empty(self.world_size * row.numel(), dtype=row.dtype, device=row.device)
        ctx = (self.board.collective(phase, timeout_s=self.advanced.plan_check_timeout_s)
               if self.board is not None else nullcontext())
        with ctx:
            gather_into(out, row, group=self.group)
        return out.view(self.world_size, -1).cpu()

    def _first_differing_step(self) -> str:
        """'epoch E step S': the first step since the previous exchange whose plan differs between ranks (a
        second gather, run only when the running digests differ)."""
        digests = torch.stack([digest_words(d) for _, _, d in self._since]) if self._since else \
            torch.zeros((0, 4), dtype=torch.int64)
        width = 1 + 4 * max(int(v) for v in self._gather(torch.tensor([len(self._since)]), "the plan diagnosis")[:, 0])
        row = torch.zeros(width, dtype=torch.int64)
        row[0] = len(self._since)
        row[1:1 + digests.numel()] = digests.reshape(-1)
        table = self._gather(row, "the plan diagnosis")
        for i, (epoch, step, _) in enumerate(self._since):
            if bool((table[:, 1 + 4 * i:5 + 4 * i] != table[0, 1 + 4 * i:5 + 4 * i]).any()):
                return f"epoch {epoch} step {step}"
        return ""

    def step_stats(self, done: FinishedStep, table: torch.Tensor) -> StepStats:
        """The finished step's record from the gathered table (checks the counts against the plan); rank 0
        logs its line on log_every steps."""
        view = done.view  # what the step's stats read of its plan, prepared with it (dcp.runtime.stepview)
        loss_sum, count, busy_s = gathered_stats(table)
        if count >= 0 and self.runtime.loss_weighting == "tokens":
            check_step_count(view.step, view.n_step, count)  # N_step as the step opened with it
        stats = StepStats(
            epoch=view.epoch, step=view.step, global_step=done.global_step,
            loss=loss_sum / count if count > 0 else float("nan"), count=max(count, 0),
            tokens=view.tokens, step_time_s=done.step_time_s, busy_s=busy_s, predicted_idle=view.idle_ratio,
            summary=view.summary,
        )
        if self.rank == 0 and stats.global_step % self.runtime.log_every == 0:
            self.log.info(stats.line())
        return stats
