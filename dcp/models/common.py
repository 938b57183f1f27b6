"""Pieces shared by the reference models: masks, SwiGLU, init (the Batch value and collation live in
``dcp.data``)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn


def length_mask(lengths: Sequence[int], padded_len: int, device: torch.device | str) -> torch.Tensor:
    """bool [b, padded_len]: True where position < the sample's length.

    Built on the device from host ints (one comparison per sample): copying a list of lengths to the GPU
    would be a blocking host-to-device copy, i.e. a sync inside the micro-batch.
    """
    positions = torch.arange(padded_len, device=device)
    return torch.stack([positions < int(n) for n in lengths])


def pack_rows(t: torch.Tensor, seq_lens: Sequence[int]) -> torch.Tensor:
    """[1, sum(seq_lens), ...]: the first ``seq_lens[i]`` entries of every row of ``t`` back to back (slices by
    host ints; no host read of a device value)."""
    return torch.cat([t[i, :n] for i, n in enumerate(seq_lens)])[None]


class SwiGLU(nn.Module):
    """Gated MLP: down(silu(gate(x)) * up(x))."""

    def __init__(self, hidden_size: int, ffn_size: int) -> None:
        super().__init__()
        self.gate = nn.Linear(hidden_size, ffn_size, bias=False)
        self.up = nn.Linear(hidden_size, ffn_size, bias=False)
        self.down = nn.Linear(ffn_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


def init_weights(model: nn.Module, seed: int, std: float, num_layers: int) -> None:
    """Deterministic init from ``seed``: normal(std) for matrices (output projections scaled by
    1/sqrt(2 L), GPT-2 style), ones for norm weights, zeros for biases. Same seed, same weights everywhere."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() == 1:
                param.fill_(1.0 if "norm" in name else 0.0)
                continue
            scale = std / math.sqrt(2 * num_layers) if name.endswith(("proj.weight", "down.weight")) else std
            values = torch.empty(param.shape, dtype=torch.float32).normal_(0.0, scale, generator=gen)
            param.copy_(values)


def sinusoid(positions: torch.Tensor, dim: int) -> torch.Tensor:
    """Fixed sin/cos embedding [n, dim] of integer positions (global indices, so shards agree)."""
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, device=positions.device, dtype=torch.float32) / half)
    angles = positions.to(torch.float32)[:, None] * freqs[None, :]
    emb = torch.cat((angles.sin(), angles.cos()), dim=-1)
    return F.pad(emb, (0, dim - 2 * half))
