"""Transformer-1D: the LLM-like reference model (token embedding, RMSNorm, RoPE, causal attention, SwiGLU).

Sequence parallelism: each rank of the SP group embeds its contiguous chunk of the padded sequence;
RoPE uses GLOBAL positions (chunk offset + local index), so a token gets the same rotation whatever
the SP size; attention is Ulysses (dcp.runtime.ulysses); the loss is summed over this rank's chunk.
Summing loss_sum, count and parameter gradients over the SP group gives the one-process values.

Unequal lengths (padding, or a pack of the packed baseline) run as ONE row of documents: no token
attends across a document boundary or to padding, RoPE positions restart per document, and no layer
computes on padding, so the result equals running the samples one at a time (see ``Transformer1D.packs``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from dcp.config import ModelShapeConfig, fail
from dcp.data import IGNORE_INDEX, Batch, collate_tokens
from dcp.memory import LOSS_CHUNK_TOKENS
from dcp.models.common import SwiGLU, init_weights, pack_rows
from dcp.models.loss import chunked_cross_entropy
from dcp.runtime.attention import DocLens
from dcp.runtime.context import SPContext
from dcp.runtime.context_parallel import take_shard
from dcp.runtime.recompute import checkpoint_layer
from dcp.runtime.ulysses import IMPLS, ulysses_attention

RecomputeFn = Callable[..., torch.Tensor]


@dataclass(kw_only=True, slots=True, frozen=True)
class T1DConfig:
    """Shape and init of a Transformer-1D."""

    name: str = "t1d-tiny"
    """Model name stored with profiles and results."""
    num_layers: int = 4
    """Repeated transformer blocks (L)."""
    hidden_size: int = 64
    """Model width."""
    num_heads: int = 8
    """Attention heads; every SP size must divide it."""
    ffn_hidden_size: int = 0
    """SwiGLU inner width; 0 means 4 * hidden_size."""
    vocab_size: int = 256
    """Token vocabulary."""
    rope_theta: float = 10000.0
    """RoPE base."""
    norm_eps: float = 1e-5
    """RMSNorm epsilon."""
    init_std: float = 0.02
    """Std of the normal init of weight matrices."""
    seed: int = 0
    """Init seed: the same seed gives the same weights on every rank and device."""
    ulysses_impl: str = "dcp"
    """Ulysses implementation: dcp (dcp.runtime.ulysses) or deepspeed (DistributedAttention)."""
    loss_chunk_tokens: int = LOSS_CHUNK_TOKENS
    """Token rows per piece of the chunked cross-entropy (dcp.models.loss; logits of one piece live at once);
    0: the whole micro-batch in one piece."""

    def __post_init__(self) -> None:
        for f in ("num_layers", "hidden_size", "num_heads", "vocab_size"):
            if getattr(self, f) < 1:
                fail(f"t1d.{f}", getattr(self, f), "must be >= 1", f"set t1d.{f} to a positive integer")
        if self.ffn_hidden_size < 0:
            fail("t1d.ffn_hidden_size", self.ffn_hidden_size, "must be >= 0", "use 0 for 4 * hidden_size")
        if self.hidden_size % self.num_heads:
            fail("t1d.hidden_size", self.hidden_size, f"is not divisible by t1d.num_heads ({self.num_heads})",
                 "choose a head count that divides the hidden size")
        if (self.hidden_size // self.num_heads) % 2:
            fail("t1d.num_heads", self.num_heads, f"gives an odd head_dim ({self.hidden_size // self.num_heads})",
                 "RoPE rotates pairs: choose heads so that hidden_size / num_heads is even")
        if not self.rope_theta > 0 or not self.norm_eps > 0 or not self.init_std > 0:
            fail("t1d.rope_theta/norm_eps/init_std", (self.rope_theta, self.norm_eps, self.init_std),
                 "must all be > 0", "use the defaults 10000.0, 1e-5, 0.02")
        if self.loss_chunk_tokens < 0:
            fail("t1d.loss_chunk_tokens", self.loss_chunk_tokens, "must be >= 0", "use 0 for one piece")
        if self.ulysses_impl not in IMPLS:
            fail("t1d.ulysses_impl", self.ulysses_impl, f"is not one of {list(IMPLS)}", "pick one of those")

    @property
    def ffn_size(self) -> int:
        return self.ffn_hidden_size or 4 * self.hidden_size

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @classmethod
    def tiny(cls, **overrides: Any) -> T1DConfig:
        """CPU-sized: 4 layers, hidden 64, 8 heads, vocab 256."""
        return cls(**{"name": "t1d-tiny", **overrides})

    @classmethod
    def paper_5b(cls, **overrides: Any) -> T1DConfig:
        """The paper's Transformer-1D (Table 4): 42 layers, hidden 3072, 48 heads; ~4.95B parameters with
        SwiGLU width 8192 and a 32000-token vocabulary (Llama-style; the paper does not give these two)."""
        from dcp.named_models import T1D_5B as s  # the shape numbers are written once, there

        base = dict(name=s.name, num_layers=s.num_layers, hidden_size=s.hidden_size, num_heads=s.num_heads,
                    ffn_hidden_size=s.ffn_hidden_size, vocab_size=s.vocab_size)
        return cls(**{**base, **overrides})

    def replace(self, **changes: Any) -> T1DConfig:
        return dataclasses.replace(self, **changes)

    def shape(self, param_bytes: int = 4) -> ModelShapeConfig:
        """The planner's view of this model (dcp.config.ModelShapeConfig)."""
        return ModelShapeConfig(name=self.name, num_layers=self.num_layers, hidden_size=self.hidden_size,
                                num_heads=self.num_heads, ffn_hidden_size=self.ffn_size,
                                vocab_size=self.vocab_size, param_bytes=param_bytes)


@dataclass(slots=True)
class T1DAux:
    """Per-micro-batch values every layer needs; built once by ``prepare_aux``."""

    cos: torch.Tensor
    """[s_local, head_dim / 2] RoPE cosines of this chunk's global positions."""
    sin: torch.Tensor
    """[s_local, head_dim / 2] RoPE sines."""
    doc_lens: DocLens
    """Per row of the FULL sequence: its documents (host ints, dcp.runtime.attention); attention never
    crosses a document boundary nor reaches the padding after the last document."""
    start: int
    """First global position of this rank's chunk."""


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate [b, s, ..., d] by position (dim 1): pairs (x_i, x_{i + d/2}) turn by angle pos * theta^(-2i/d).

    Computed in x's dtype (bf16 under autocast, as Llama-style models do): no fp32 round trip, whose casts
    and their backward were a fifth of a short micro-batch's kernels on an H100."""
    x1, x2 = x.chunk(2, dim=-1)
    shape = (1, x.shape[1]) + (1,) * (x.dim() - 3) + (cos.shape[-1],)
    c, s = cos.to(x.dtype).view(shape), sin.to(x.dtype).view(shape)
    return torch.cat((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1)


@torch.compiler.disable
def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: SPContext, aux: T1DAux,
               impl: str) -> torch.Tensor:
    """Ulysses attention over ``aux``'s documents. It takes ``aux`` whole and runs eagerly, so that a compiled
    block (dcp.runtime.compiled) never reads the micro-batch's document lengths: reading them would make
    torch.compile guard on them and recompile for every new layout."""
    return ulysses_attention(q, k, v, ctx, causal=True, doc_lens=aux.doc_lens, impl=impl)


class T1DBlock(nn.Module):
    """Pre-norm block: x + attn(norm(x)), then x + SwiGLU(norm(x))."""

    def __init__(self, config: T1DConfig, layer_index: int) -> None:
        super().__init__()
        self.config = config
        self.layer_index = layer_index
        h = config.hidden_size
        self.attn_norm = nn.RMSNorm(h, eps=config.norm_eps)
        self.qkv = nn.Linear(h, 3 * h, bias=False)
        self.proj = nn.Linear(h, h, bias=False)
        self.mlp_norm = nn.RMSNorm(h, eps=config.norm_eps)
        self.mlp = SwiGLU(h, config.ffn_size)

    def forward(self, hidden: torch.Tensor, ctx: SPContext, aux: T1DAux) -> torch.Tensor:
        b, s, h = hidden.shape
        heads, d = self.config.num_heads, self.config.head_dim
        qkv = self.qkv(self.attn_norm(hidden)).view(b, s, 3, heads, d)
        # RoPE before the all-to-all: this rank knows the global positions of its own chunk. q and k turn
        # together, one set of kernels for both (a short micro-batch is bound by kernel launches).
        q, k = apply_rope(qkv[:, :, :2], aux.cos, aux.sin).unbind(2)
        v = qkv[:, :, 2]
        out = _attention(q, k, v, ctx, aux, self.config.ulysses_impl)
        hidden = hidden + self.proj(out.reshape(b, s, h))
        return hidden + self.mlp(self.mlp_norm(hidden))


class Transformer1D(nn.Module):
    """LLM-like reference model; ``forward(batch, ctx) -> (loss_sum, count)`` over this rank's chunk."""

    def __init__(self, config: T1DConfig) -> None:
        super().__init__()
        self.config = config
        self.tok_embed = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(T1DBlock(config, i) for i in range(config.num_layers))
        self.norm = nn.RMSNorm(config.hidden_size, eps=config.norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        init_weights(self, config.seed, config.init_std, config.num_layers)

    # ----- the protocol used by the manager and the profiler --------------------------------------
    # Layout. Samples of equal length run as the collated [b, s] rows. A micro-batch of unequal lengths
    # (a padded micro-batch, or a pack of the packed baseline) runs as ONE row of its real tokens, the
    # samples back to back as documents: attention stays inside each document, RoPE positions restart at
    # every document, and no linear layer ever sees a padding token. The layout is decided from
    # batch.seq_lens (host ints), never from a tensor value.
    @staticmethod
    def packs(batch: Batch) -> bool:
        """True when the micro-batch runs as one row of documents (its lengths differ, or it has padding)."""
        return any(n != batch.inputs.shape[1] for n in batch.seq_lens)

    def _rows(self, t: torch.Tensor, batch: Batch) -> torch.Tensor:
        """[rows, s] of the layout: ``t`` itself, or its real tokens packed into one row."""
        return pack_rows(t, batch.seq_lens) if self.packs(batch) else t

    def embed(self, batch: Batch, ctx: SPContext) -> torch.Tensor:
        """[rows, s_local, hidden]: embeddings of this rank's chunk of the (padded) token rows."""
        ids = self._rows(batch.inputs.to(self.tok_embed.weight.device), batch)
        padded = ctx.padded_len(ids.shape[1])
        return self.tok_embed(take_shard(F.pad(ids, (0, padded - ids.shape[1])), ctx.shard_ranges(ids.shape[1])))

    def prepare_aux(self, batch: Batch, ctx: SPContext) -> T1DAux:
        device = self.tok_embed.weight.device
        d = self.config.head_dim
        inv_freq = self.config.rope_theta ** (-torch.arange(0, d, 2, device=device, dtype=torch.float32) / d)
        if self.packs(batch):
            s_len = batch.tokens
            docs: DocLens = (batch.seq_lens,)
            # every document starts at position 0, as it would alone
            pos = torch.cat([torch.arange(n, device=device, dtype=torch.float32) for n in batch.seq_lens])
        else:
            s_len = batch.inputs.shape[1]
            docs = ((s_len,),) * batch.size
            pos = torch.arange(s_len, device=device, dtype=torch.float32)
        ranges = ctx.shard_ranges(s_len)  # one range, or a context layout's two chunks
        pos = take_shard(F.pad(pos, (0, ctx.padded_len(s_len) - s_len)), ranges, dim=0)
        angles = pos[:, None] * inv_freq[None, :]
        # in the layers' compute dtype (autocast's, else the weights'), cast once per micro-batch, not per layer
        if torch.is_autocast_enabled(device.type):
            dtype = torch.get_autocast_dtype(device.type)
        else:
            dtype = self.tok_embed.weight.dtype
        return T1DAux(cos=angles.cos().to(dtype), sin=angles.sin().to(dtype), doc_lens=docs, start=ranges[0][0])

    def layer_inputs(self, batch: Batch, ctx: SPContext) -> tuple[torch.Tensor, T1DAux]:
        """(hidden, aux) as the first layer sees them; the profiler runs single layers on these."""
        return self.embed(batch, ctx), self.prepare_aux(batch, ctx)

    def run_layer(self, i: int, hidden: torch.Tensor, aux: T1DAux, ctx: SPContext) -> torch.Tensor:
        return self.layers[i](hidden, ctx, aux)

    def head_loss(self, hidden: torch.Tensor, batch: Batch, ctx: SPContext, aux: T1DAux) -> tuple[torch.Tensor, torch.Tensor]:
        """(loss_sum, count): cross-entropy summed over this chunk's labelled tokens, and their number."""
        targets = self._rows(batch.targets.to(hidden.device), batch)
        s_max = targets.shape[1]
        targets = F.pad(targets, (0, ctx.padded_len(s_max) - s_max), value=IGNORE_INDEX)
        targets = take_shard(targets, ctx.shard_ranges(s_max))
        loss_sum = chunked_cross_entropy(hidden, targets, lambda h: self.lm_head(self.norm(h)),
                                         self.config.loss_chunk_tokens)
        return loss_sum, (targets != IGNORE_INDEX).sum()

    def forward(self, batch: Batch, ctx: SPContext, recompute: RecomputeFn | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """embed -> layers -> head_loss. The first ctx.recompute_layers layers are checkpointed, unless
        ``recompute`` is given: then every layer runs as ``recompute(layer, hidden, ctx, aux)`` (the paper's
        ``x = mgr.recompute(layer, x)``; ``layer.layer_index`` tells the hook where it is)."""
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
        """Labelled tokens of the whole micro-batch (the sum of ``count`` over its SP group)."""
        return int((batch.targets != IGNORE_INDEX).sum())

    def synthetic_batch(self, batch_size: int, seq_len: int, *, generator: torch.Generator,
                        sample_ids: tuple[int, ...] | None = None) -> Batch:
        """``batch_size`` random token sequences of ``seq_len`` tokens (profiling and tests)."""
        ids = torch.randint(0, self.config.vocab_size, (batch_size, seq_len), generator=generator)
        return collate_tokens(list(ids), sample_ids or tuple(range(batch_size)))
