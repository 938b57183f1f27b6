"""Transformer-2D: the video-like reference model (spatial attention, then temporal attention, then MLP).

Input [b, T, S, C]: T frames of S spatial tokens (patch features). Sequence parallelism shards the
SPATIAL dim S: each rank of the SP group holds all T frames of its contiguous chunk of S positions,
[b, T, S/p, hidden].
- Spatial attention (over S within each frame) needs every S position: it runs through Ulysses with the
  frames folded into the batch, [b*T, S/p, H, d] -> all-to-all -> [b*T, S, H/p, d] -> back.
- Temporal attention (over T at each spatial position) is local: every rank already has all T frames of
  its S positions, so it needs no communication at all.
Padding: S is padded to a multiple of p and to the batch's largest S, T to the batch's largest T. No
attention ever computes over padding and no mask is built: both attentions get per-row lengths from the
batch's shapes (host ints, dcp.runtime.attention ``doc_lens``). A spatial row (sample i, frame t) holds one
document of S_i tokens, or none when t >= T_i (a padded frame); a temporal row (sample i, spatial position
j) holds one document of T_i frames, or none when j >= S_i. Padded positions come out of attention as
zeros, never reach a real token, and are left out of the loss.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from dcp.config import ModelShapeConfig, fail
from dcp.data import Batch, collate_video
from dcp.models.common import SwiGLU, init_weights, length_mask, sinusoid
from dcp.runtime.attention import DocLens, local_attention
from dcp.runtime.context import SPContext
from dcp.runtime.recompute import checkpoint_layer
from dcp.runtime.ulysses import IMPLS, ulysses_attention

RecomputeFn = Callable[..., torch.Tensor]


@dataclass(kw_only=True, slots=True, frozen=True)
class T2DConfig:
    """Shape and init of a Transformer-2D."""

    name: str = "t2d-tiny"
    """Model name stored with profiles and results."""
    num_layers: int = 4
    """Repeated blocks (L); each has one spatial and one temporal attention and one MLP."""
    hidden_size: int = 64
    """Model width."""
    num_heads: int = 8
    """Attention heads (both attentions); every SP size must divide it."""
    ffn_hidden_size: int = 0
    """SwiGLU inner width; 0 means 4 * hidden_size."""
    in_channels: int = 8
    """Features per input token (e.g. latent channels x patch volume)."""
    out_channels: int = 0
    """Features predicted per token; 0 means in_channels."""
    synthetic_frames: int = 4
    """T of synthetic_batch samples (S = ceil(seq_len / T)), unless synthetic_spatial_per_frame is set."""
    synthetic_spatial_per_frame: float = 0.0
    """When > 0, synthetic_batch samples of seq_len tokens have T = max(1, round(sqrt(seq_len / this)))
    frames (S = ceil(seq_len / T)): a shape of the data's aspect at every length, so the profiler times the
    mix of spatial (~ T S^2) and temporal (~ S T^2) attention the runs hold, not T = synthetic_frames with S
    growing to seq_len / T. 0: use synthetic_frames."""
    norm_eps: float = 1e-5
    """RMSNorm epsilon."""
    init_std: float = 0.02
    """Std of the normal init of weight matrices."""
    seed: int = 0
    """Init seed: the same seed gives the same weights on every rank and device."""
    ulysses_impl: str = "dcp"
    """Ulysses implementation of the spatial attention: dcp or deepspeed."""

    def __post_init__(self) -> None:
        for f in ("num_layers", "hidden_size", "num_heads", "in_channels", "synthetic_frames"):
            if getattr(self, f) < 1:
                fail(f"t2d.{f}", getattr(self, f), "must be >= 1", f"set t2d.{f} to a positive integer")
        for f in ("ffn_hidden_size", "out_channels"):
            if getattr(self, f) < 0:
                fail(f"t2d.{f}", getattr(self, f), "must be >= 0", "use 0 for the default")
        if not self.synthetic_spatial_per_frame >= 0:
            fail("t2d.synthetic_spatial_per_frame", self.synthetic_spatial_per_frame, "must be >= 0",
                 "use 0 for T = synthetic_frames, or the data's spatial tokens per frame")
        if self.hidden_size % self.num_heads:
            fail("t2d.hidden_size", self.hidden_size, f"is not divisible by t2d.num_heads ({self.num_heads})",
                 "choose a head count that divides the hidden size")
        if not self.norm_eps > 0 or not self.init_std > 0:
            fail("t2d.norm_eps/init_std", (self.norm_eps, self.init_std), "must be > 0", "use 1e-5 and 0.02")
        if self.ulysses_impl not in IMPLS:
            fail("t2d.ulysses_impl", self.ulysses_impl, f"is not one of {list(IMPLS)}", "pick one of those")

    @property
    def ffn_size(self) -> int:
        return self.ffn_hidden_size or 4 * self.hidden_size

    @property
    def out_size(self) -> int:
        return self.out_channels or self.in_channels

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @classmethod
    def tiny(cls, **overrides: Any) -> T2DConfig:
        """CPU-sized: 4 layers, hidden 64, 8 heads, 8 channels. Profiled at 4 spatial tokens per frame: the
        cpu grid of datasets/grids.toml (frames 4-20, spatial 9-100 tokens), whose token-heaviest buckets,
        16 x 64 and 20 x 100, hold 4-5 (at 1024 tokens, T = 4 x S = 256 took 1.5x the time of the data's
        12 x 85 and 20 x 51, measured on one CPU core: docs/simulator.md)."""
        return cls(**{"name": "t2d-tiny", "synthetic_spatial_per_frame": 4.0, **overrides})

    @classmethod
    def paper_1_2b(cls, **overrides: Any) -> T2DConfig:
        """The paper's Transformer-2D (Table 4): 28 layers, hidden 1152, 16 heads, ~1.19B parameters.
        One block holds two attentions (8 h^2) and a SwiGLU of width 8 h (24 h^2), the parameter count of
        an STDiT-style spatial block + temporal block; 16 input channels (4 latent channels, 2x2 patches)."""
        from dcp.named_models import T2D_1B2 as s  # the shape numbers are written once, there

        base = dict(name=s.name, num_layers=s.num_layers, hidden_size=s.hidden_size, num_heads=s.num_heads,
                    ffn_hidden_size=s.ffn_hidden_size, in_channels=16, synthetic_frames=16)
        return cls(**{**base, **overrides})

    def replace(self, **changes: Any) -> T2DConfig:
        return dataclasses.replace(self, **changes)

    def shape(self, param_bytes: int = 4) -> ModelShapeConfig:
        """The planner's view: two self-attentions (spatial, temporal) and one gated MLP per layer."""
        h = self.hidden_size
        return ModelShapeConfig(name=self.name, num_layers=self.num_layers, hidden_size=h, num_heads=self.num_heads,
                                ffn_hidden_size=self.ffn_size, attentions_per_layer=2,
                                vocab_size=max(self.in_channels, self.out_size), param_bytes=param_bytes)


def synthetic_shape(config: T2DConfig, seq_len: int) -> tuple[int, int]:
    """(T, S) of a synthetic sample of about ``seq_len`` tokens (T2DConfig.synthetic_spatial_per_frame)."""
    if config.synthetic_spatial_per_frame > 0:
        t = max(1, min(seq_len, round(math.sqrt(seq_len / config.synthetic_spatial_per_frame))))
    else:
        t = min(config.synthetic_frames, seq_len)
    return t, -(-seq_len // t)


@dataclass(slots=True)
class T2DAux:
    """Per-micro-batch lengths, loss mask and offsets; built once by ``prepare_aux``."""

    spatial_docs: DocLens
    """Per row of the [b * T_max, S_padded] spatial attention: (S_i,) for real frames, () for padded ones."""
    temporal_docs: DocLens
    """Per row of the [b * S_local, T_max] temporal attention: (T_i,) at real positions, () at padded ones."""
    valid: torch.Tensor
    """bool [b, T_max, S_local]: positions of this rank that count in the loss."""
    start: int
    """First global S index of this rank's chunk."""


@torch.compiler.disable
def _spatial_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: SPContext, aux: T2DAux,
                       impl: str) -> torch.Tensor:
    """Ulysses attention over ``aux``'s spatial documents, eager and handed ``aux`` whole: a compiled block
    (dcp.runtime.compiled) never reads, so never guards on, the micro-batch's host-int layout."""
    return ulysses_attention(q, k, v, ctx, causal=False, doc_lens=aux.spatial_docs, impl=impl)


@torch.compiler.disable
def _temporal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: SPContext, aux: T2DAux) -> torch.Tensor:
    """Local attention over ``aux``'s temporal documents (all frames are local), eager like the spatial one."""
    return local_attention(q, k, v, causal=False, doc_lens=aux.temporal_docs, backend=ctx.attention)


class T2DBlock(nn.Module):
    """x + spatial_attn(norm(x)); x + temporal_attn(norm(x)); x + SwiGLU(norm(x))."""

    def __init__(self, config: T2DConfig, layer_index: int) -> None:
        super().__init__()
        self.config = config
        self.layer_index = layer_index
        h = config.hidden_size
        self.spatial_norm = nn.RMSNorm(h, eps=config.norm_eps)
        self.spatial_qkv = nn.Linear(h, 3 * h, bias=False)
        self.spatial_proj = nn.Linear(h, h, bias=False)
        self.temporal_norm = nn.RMSNorm(h, eps=config.norm_eps)
        self.temporal_qkv = nn.Linear(h, 3 * h, bias=False)
        self.temporal_proj = nn.Linear(h, h, bias=False)
        self.mlp_norm = nn.RMSNorm(h, eps=config.norm_eps)
        self.mlp = SwiGLU(h, config.ffn_size)

    def forward(self, hidden: torch.Tensor, ctx: SPContext, aux: T2DAux) -> torch.Tensor:
        b, t, s, h = hidden.shape
        heads, d = self.config.num_heads, self.config.head_dim
        # spatial: frames folded into the batch; Ulysses over the sharded S dim
        q, k, v = self.spatial_qkv(self.spatial_norm(hidden)).view(b * t, s, 3, heads, d).unbind(2)
        out = _spatial_attention(q, k, v, ctx, aux, self.config.ulysses_impl)
        hidden = hidden + self.spatial_proj(out.reshape(b, t, s, h))
        # temporal: spatial positions folded into the batch; all T frames are local, no communication
        x = self.temporal_norm(hidden).transpose(1, 2).reshape(b * s, t, h)
        q, k, v = self.temporal_qkv(x).view(b * s, t, 3, heads, d).unbind(2)
        out = _temporal_attention(q, k, v, ctx, aux)
        hidden = hidden + self.temporal_proj(out.reshape(b, s, t, h).transpose(1, 2))
        return hidden + self.mlp(self.mlp_norm(hidden))


class Transformer2D(nn.Module):
    """Video-like reference model; ``forward(batch, ctx) -> (loss_sum, count)`` over this rank's chunk."""

    def __init__(self, config: T2DConfig) -> None:
        super().__init__()
        self.config = config
        self.patch_embed = nn.Linear(config.in_channels, config.hidden_size)
        self.layers = nn.ModuleList(T2DBlock(config, i) for i in range(config.num_layers))
        self.norm = nn.RMSNorm(config.hidden_size, eps=config.norm_eps)
        self.out = nn.Linear(config.hidden_size, config.out_size)
        init_weights(self, config.seed, config.init_std, config.num_layers)

    def _shard(self, x: torch.Tensor, ctx: SPContext) -> torch.Tensor:
        """This rank's chunk of dim 2 (S) of [b, T, S, C], after padding S to a multiple of p."""
        s_max = x.shape[2]
        start, end = ctx.shard(s_max)
        return F.pad(x, (0, 0, 0, ctx.padded_len(s_max) - s_max))[:, :, start:end]

    # ----- the protocol used by the manager and the profiler --------------------------------------
    def embed(self, batch: Batch, ctx: SPContext) -> torch.Tensor:
        """[b, T_max, S_local, hidden]: patch embedding + sinusoidal (global) spatial and temporal positions."""
        device = self.patch_embed.weight.device
        x = self._shard(batch.inputs.to(device=device, dtype=self.patch_embed.weight.dtype), ctx)
        start, end = ctx.shard(batch.inputs.shape[2])
        h = self.config.hidden_size
        pos_s = sinusoid(torch.arange(start, end, device=device), h)
        pos_t = sinusoid(torch.arange(x.shape[1], device=device), h)
        return self.patch_embed(x) + (pos_t[:, None, :] + pos_s[None, :, :]).to(x.dtype)

    def prepare_aux(self, batch: Batch, ctx: SPContext) -> T2DAux:
        if batch.shapes is None:
            raise ValueError("Batch.shapes (None) is required by Transformer2D: build the batch with collate_video")
        device = self.patch_embed.weight.device
        t_max, s_max = batch.inputs.shape[1:3]
        start, end = ctx.shard(s_max)
        frames = [t for t, _ in batch.shapes]
        local = length_mask([min(max(s - start, 0), end - start) for _, s in batch.shapes], end - start, device)
        temporal = length_mask(frames, t_max, device)  # [b, T]
        spatial_docs = tuple((s,) if f < t else () for t, s in batch.shapes for f in range(t_max))
        temporal_docs = tuple((t,) if start + j < s else () for t, s in batch.shapes for j in range(end - start))
        return T2DAux(spatial_docs=spatial_docs, temporal_docs=temporal_docs,
                      valid=temporal[:, :, None] & local[:, None, :], start=start)

    def layer_inputs(self, batch: Batch, ctx: SPContext) -> tuple[torch.Tensor, T2DAux]:
        """(hidden, aux) as the first layer sees them; the profiler runs single layers on these."""
        return self.embed(batch, ctx), self.prepare_aux(batch, ctx)

    def run_layer(self, i: int, hidden: torch.Tensor, aux: T2DAux, ctx: SPContext) -> torch.Tensor:
        return self.layers[i](hidden, ctx, aux)

    def head_loss(self, hidden: torch.Tensor, batch: Batch, ctx: SPContext, aux: T2DAux) -> tuple[torch.Tensor, torch.Tensor]:
        """(loss_sum, count): per-token MSE (mean over channels) summed over this chunk's real tokens."""
        pred = self.out(self.norm(hidden)).float()
        target = self._shard(batch.targets.to(pred.device, torch.float32), ctx)
        err = (pred - target).pow(2).mean(dim=-1)
        return (err * aux.valid).sum(), aux.valid.sum()

    def forward(self, batch: Batch, ctx: SPContext, recompute: RecomputeFn | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """embed -> layers -> head_loss; checkpointing as in Transformer1D.forward."""
        hidden, aux = self.layer_inputs(batch, ctx)
        for i, layer in enumerate(self.layers):
            if recompute is not None:
                hidden = recompute(layer, hidden, ctx, aux)
            else:
                hidden = checkpoint_layer(layer, hidden, ctx, aux, enabled=i < ctx.recompute_layers)
        return self.head_loss(hidden, batch, ctx, aux)

    # ----- data helpers -----------------------------------------------------------------------------
    @staticmethod
    def valid_count(batch: Batch) -> int:
        """Real tokens of the whole micro-batch (the sum of ``count`` over its SP group)."""
        return batch.tokens

    def synthetic_batch(self, batch_size: int, seq_len: int, *, generator: torch.Generator,
                        sample_ids: tuple[int, ...] | None = None, shape: tuple[int, int] | None = None) -> Batch:
        """Random samples of about ``seq_len`` tokens of shape ``synthetic_shape(config, seq_len)`` (or the
        given ``shape`` (T, S))."""
        if shape is None:
            shape = synthetic_shape(self.config, seq_len)
        t, s = shape
        c_in, c_out = self.config.in_channels, self.config.out_size
        samples = [
            (torch.randn(t, s, c_in, generator=generator), torch.randn(t, s, c_out, generator=generator))
            for _ in range(batch_size)
        ]
        return collate_video(samples, sample_ids or tuple(range(batch_size)))
