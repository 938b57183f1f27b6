"""What a user's ``forward_fn`` must return, checked on every micro-batch (no device sync, no host read).

DCP weights each rank's loss by the labelled tokens (or samples) of the whole step (dcp.runtime.weighting), so
``forward_fn(model, batch, ctx)`` returns the SUM of the per-token losses over this rank's chunk and how many
tokens that sum counted: ``(loss_sum, token_count)``. A mean loss (the habit of most training loops) trains
with updates ~tokens-per-step times too small and nothing else looks wrong, so anything that is not such a
pair is refused with the fix. Only shapes, dtypes and Python types are read: the check never waits for the
device.
"""

from __future__ import annotations

from typing import Any

import torch

FIX = ("return (loss_sum, token_count) from forward_fn: the SUM of the per-token losses over this rank's chunk "
       "(e.g. F.cross_entropy(logits, labels, reduction='sum', ignore_index=-100)) and the number of tokens it "
       "counted (e.g. (labels != -100).sum()); DCP divides by the whole step's count across every rank, so a mean "
       "would make the update ~tokens-per-step times too small")


class ForwardContractError(TypeError):
    """forward_fn returned something other than (loss_sum, token_count); the message says what and the fix."""


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        shape = f" of shape {tuple(value.shape)}" if value.dim() else ""
        return f"a {value.dim()}-dim {str(value.dtype).removeprefix('torch.')} tensor{shape}"
    return f"a {type(value).__name__}"


def check_forward_output(out: Any, *, where: str = "forward_fn") -> tuple[torch.Tensor, Any]:
    """``(loss_sum, count)`` from ``out`` when it keeps the contract; ForwardContractError otherwise.

    loss_sum: a floating tensor with one element (0-dim, or shape (1,)). count: an int >= 0 or an integer
    tensor (any shape: its elements are summed). A bare tensor (a mean with no count), a tuple of another
    length, a per-token loss vector, a float count or a negative int count are refused."""
    if isinstance(out, torch.Tensor):
        what = "a 0-dim loss (a mean?)" if out.dim() == 0 else _describe(out)
        raise ForwardContractError(f"{where} returned {what} with no token count: {FIX}")
    if not isinstance(out, tuple | list) or len(out) != 2:
        size = f" of {len(out)} items" if isinstance(out, tuple | list) else ""
        raise ForwardContractError(f"{where} returned {_describe(out)}{size}, not a pair: {FIX}")
    loss, count = out
    if not isinstance(loss, torch.Tensor) or not loss.is_floating_point():
        raise ForwardContractError(f"{where}'s loss_sum is {_describe(loss)}, not a floating tensor: {FIX}")
    if loss.numel() != 1:
        raise ForwardContractError(f"{where}'s loss_sum is {_describe(loss)}: sum the per-token losses into one "
                                   f"value (loss.sum()); {FIX}")
    if isinstance(count, bool) or not isinstance(count, int | torch.Tensor):
        raise ForwardContractError(f"{where}'s token_count is {_describe(count)} ({count!r}), not an int or an "
                                   f"integer tensor: {FIX}")
    if isinstance(count, torch.Tensor) and (count.is_floating_point() or count.is_complex()
                                            or count.dtype == torch.bool):
        raise ForwardContractError(f"{where}'s token_count is {_describe(count)}, not an integer tensor: count "
                                   f"tokens with (labels != -100).sum(); {FIX}")
    if isinstance(count, int) and count < 0:
        raise ForwardContractError(f"{where}'s token_count ({count}) is negative: {FIX}")
    return loss, count


_FLOATS = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64})
_INTS = frozenset({torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64})


def forward_pair(out: Any) -> tuple[torch.Tensor, Any]:
    """``check_forward_output(out)`` with a fast path for the usual pair (a tuple of a plain one-element
    float tensor and an int >= 0 or a plain integer tensor), which it accepts with a few type and dtype
    reads: it runs on every micro-batch, on the training thread. Anything else takes the full check (the
    same verdicts and messages)."""
    if type(out) is tuple and len(out) == 2:
        loss, count = out
        if (type(loss) is torch.Tensor and loss.dtype in _FLOATS and loss.numel() == 1
                and ((type(count) is torch.Tensor and count.dtype in _INTS) or (type(count) is int and count >= 0))):
            return loss, count
    return check_forward_output(out)
