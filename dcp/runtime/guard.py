"""The non-finite guard: a step whose loss or gradients are not finite is never applied to the weights.

At every step's gradient sync, after the gradients are reduced and before the optimizer runs, each rank sets a
two-element flag: its own micro-batches' losses not all finite, and the step's gradients not all finite (the
reduced gradients on the ddp engine: the same on every rank). One SUM all-reduce of that flag over the world
(8 bytes; the same tensor every step) makes every rank take the same decision, and one read of it on the host
decides whether the optimizer steps, as torch's GradScaler reads its ``found_inf``. Only when it is set do the
ranks all-gather which micro-batches produced it (their sample ids), so the hot path stays one tiny collective.

``runtime.nonfinite`` says what happens then: ``stop`` raises :class:`NonFiniteError` on every rank, naming the
step, the ranks and the sample ids, before anything is applied (a checkpoint saved earlier stays the last one);
``skip`` drops the step's gradients, leaves the weights, the optimizer state and the LR schedule untouched,
records the step's samples as skipped in the epoch's position (trained no further this epoch, listed in the
checkpoint) and logs one line.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


class NonFiniteError(FloatingPointError):
    """A step's loss or gradients were not finite (runtime.nonfinite = 'stop'); nothing of it was applied. Not a
    RuntimeError: it passes the gradient sync's phase unchanged (a failed collective is re-raised there)."""


@dataclass(frozen=True, slots=True)
class Verdict:
    """What the ranks agreed about one step."""

    finite: bool
    """True: apply the step."""
    message: str = ""
    """The one line naming the step, the ranks and the samples (empty when ``finite``)."""


def local_flags(losses: list[torch.Tensor], grads: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    """[this rank's losses not all finite, ``grads`` not all finite] as a float tensor on ``device`` (no host read)."""
    flag = torch.zeros(2, dtype=torch.float32, device=device)
    if losses:
        flag[0] = (~torch.isfinite(torch.stack([x.reshape(()).float() for x in losses]).to(device))).any()
    if grads:
        norm = torch.nn.utils.get_total_norm(grads, norm_type=2.0, foreach=grads[0].device.type != "cpu")
        flag[1] = (~torch.isfinite(norm)).to(device=device, dtype=torch.float32)
    return flag


def bad_micro_batches(losses: list[torch.Tensor], sample_ids: list[tuple[int, ...]]) -> list[tuple[int, ...]]:
    """The sample ids of this rank's micro-batches whose loss is not finite (read on the host: the slow path)."""
    out = []
    for loss, ids in zip(losses, sample_ids, strict=False):
        if not bool(torch.isfinite(loss.float()).all()):
            out.append(tuple(int(i) for i in ids))
    return out


def agree(flag: torch.Tensor, *, rank: int, world_size: int, group: Any, losses: list[torch.Tensor],
          sample_ids: list[tuple[int, ...]], where: str) -> Verdict:
    """Reduce ``flag`` (``local_flags``) over ``group`` and, when any rank set it, name the ranks and the samples."""
    if world_size > 1:
        dist.all_reduce(flag, op=dist.ReduceOp.SUM, group=group)
    loss_ranks, grads_bad = flag.tolist()
    if loss_ranks == 0 and grads_bad == 0:
        return Verdict(True)
    mine = bad_micro_batches(losses, sample_ids)
    found: list[Any] = [(rank, mine)]
    if world_size > 1:
        found = [None] * world_size
        dist.all_gather_object(found, (rank, mine), group=group)
    culprits = [(r, ids) for r, ids in found if ids]
    if culprits:
        named = "; ".join(f"rank {r}: samples {', '.join(str(list(i)) for i in ids[:4])}"
                          + (f" and {len(ids) - 4} more micro-batches" if len(ids) > 4 else "") for r, ids in culprits[:8])
        more = f" and {len(culprits) - 8} more ranks" if len(culprits) > 8 else ""
        what = f"the loss is not finite on {len(culprits)} rank{'s' if len(culprits) > 1 else ''} ({named}{more})"
    else:
        what = "the losses are finite but the reduced gradients are not (an overflow in backward)"
    return Verdict(False, f"{where}: {what}")


__all__ = ["NonFiniteError", "Verdict", "agree", "bad_micro_batches", "local_flags"]
