"""The Batch value every rank of an SP group receives, and the collation that builds it.

Both the reference models (``dcp.models``) and the runtime (``dcp.runtime``) import this package, which
imports neither: it sits below both. Every rank of an SP group receives the same full micro-batch (a
Batch); a model pads it to a multiple of the SP size and slices its own contiguous chunk
(``dcp.runtime.context.shard_range``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import torch

IGNORE_INDEX = -100


@dataclass(kw_only=True, slots=True, frozen=True)
class Batch:
    """One micro-batch, the same on every rank of an SP group."""

    inputs: torch.Tensor
    """1D: LongTensor [b, s_max] token ids; 2D: FloatTensor [b, T_max, S_max, in_channels]. Right-padded."""
    targets: torch.Tensor
    """1D: LongTensor [b, s_max] next-token labels shifted on the full sequence, -100 on padding;
    2D: FloatTensor [b, T_max, S_max, out_channels] (padding ignored through the shapes)."""
    seq_lens: tuple[int, ...]
    """Tokens per sample (2D: T * S)."""
    shapes: tuple[tuple[int, int], ...] | None = None
    """2D only: (T frames, S spatial tokens) per sample; None for 1D."""
    sample_ids: tuple[int, ...] = ()
    """Dataset indices of the samples (empty: 0 .. b-1)."""

    def __post_init__(self) -> None:
        b = self.inputs.shape[0]
        object.__setattr__(self, "seq_lens", tuple(int(s) for s in self.seq_lens))
        if not self.sample_ids:
            object.__setattr__(self, "sample_ids", tuple(range(b)))
        if len(self.seq_lens) != b or len(self.sample_ids) != b:
            raise ValueError(
                f"Batch.seq_lens ({len(self.seq_lens)} entries) and sample_ids ({len(self.sample_ids)}) must match "
                f"the batch dim of inputs ({b}): give one entry per sample"
            )
        if any(s < 1 for s in self.seq_lens):
            raise ValueError(f"Batch.seq_lens ({self.seq_lens}) must all be >= 1: drop empty samples")
        if self.shapes is not None:
            shapes = tuple((int(t), int(s)) for t, s in self.shapes)
            object.__setattr__(self, "shapes", shapes)
            if len(shapes) != b or any(t * s != n for (t, s), n in zip(shapes, self.seq_lens, strict=True)):
                raise ValueError(
                    f"Batch.shapes ({shapes}) must give one (T, S) per sample with T * S == seq_lens "
                    f"({self.seq_lens}): build 2D batches with collate_video"
                )

    @property
    def size(self) -> int:
        return len(self.seq_lens)

    @property
    def tokens(self) -> int:
        return sum(self.seq_lens)

    def to(self, device: torch.device | str) -> Batch:
        return dataclasses.replace(self, inputs=self.inputs.to(device), targets=self.targets.to(device))


ROW_COPY_MAX_SAMPLES = 16
"""collate_tokens copies row by row up to this many samples, and pads them in one call beyond (where it is faster:
~0.2 ms instead of ~0.4 ms for 64 short samples; below, the few extra whole-batch passes cost more than they save)."""


def collate_tokens(samples: Sequence[torch.Tensor], sample_ids: Sequence[int] = ()) -> Batch:
    """1D batch from token sequences: right-pad with 0, targets = next token, -100 past each sample's end."""
    lens = [int(s.numel()) for s in samples]
    if len(samples) > ROW_COPY_MAX_SAMPLES:
        inputs = torch.nn.utils.rnn.pad_sequence([s.reshape(-1).long() for s in samples], batch_first=True)
        targets = inputs.roll(-1, 1)  # the next token; from each sample's last token on, -100:
        last = torch.tensor(lens, dtype=torch.long).sub_(1).unsqueeze_(1)
        targets.masked_fill_(torch.arange(inputs.shape[1]) >= last, IGNORE_INDEX)
    else:
        inputs = torch.zeros(len(samples), max(lens), dtype=torch.long)
        targets = torch.full_like(inputs, IGNORE_INDEX)
        for i, s in enumerate(samples):
            inputs[i, : lens[i]] = s
            targets[i, : lens[i] - 1] = s[1:]
    return Batch(inputs=inputs, targets=targets, seq_lens=tuple(lens), sample_ids=tuple(sample_ids))


def collate_video(
    samples: Sequence[tuple[torch.Tensor, torch.Tensor]], sample_ids: Sequence[int] = ()
) -> Batch:
    """2D batch from (input [T, S, C_in], target [T, S, C_out]) pairs: zero-pad T and S to the batch max."""
    shapes = [(int(x.shape[0]), int(x.shape[1])) for x, _ in samples]
    t_max, s_max = max(t for t, _ in shapes), max(s for _, s in shapes)
    x0, y0 = samples[0]
    inputs = x0.new_zeros(len(samples), t_max, s_max, x0.shape[-1])
    targets = y0.new_zeros(len(samples), t_max, s_max, y0.shape[-1])
    for i, (x, y) in enumerate(samples):
        t, s = shapes[i]
        inputs[i, :t, :s] = x
        targets[i, :t, :s] = y
    return Batch(
        inputs=inputs,
        targets=targets,
        seq_lens=tuple(t * s for t, s in shapes),
        shapes=tuple(shapes),
        sample_ids=tuple(sample_ids),
    )
