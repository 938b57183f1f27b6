"""Model adapters: the few operations the dual-layer profiler needs from a model.

The profiler never calls ``model.forward`` while profiling; it runs the pieces itself:

- ``synthetic_batch(b, s, generator)``: a micro-batch of b samples of s tokens;
- ``layer_inputs(batch, ctx) -> (hidden, aux)``: embedding of this rank's chunk and per-batch values
  every layer needs (rotary tables, masks);
- ``run_layer(i, hidden, aux, ctx) -> hidden``: one repeated layer;
- ``head_loss(hidden, batch, ctx, aux) -> (loss_sum, count)``: final norm, head and loss;
- ``full_loss(batch, ctx, recompute)``: the whole model with every layer wrapped by ``recompute`` (the
  benchmark's measured step).

:class:`ProtocolAdapter` serves any model that already exposes these names (both reference models do).
:class:`HFLlamaAdapter` serves a Hugging Face ``LlamaForCausalLM`` (or Qwen2 / Mistral: same
``model.model.layers``, ``embed_tokens``, ``rotary_emb``, ``norm``, ``lm_head`` layout). HF's own
attention only sees this rank's chunk, so the adapter is limited to sp_size 1 unless the model runs the
DCP Ulysses attention (``dcp.integrations.hf.prepare(model)`` switches it to ``"dcp_ulysses"``, which
the adapter detects): then every layer receives the profiler's SPContext as the ``dcp_ctx`` keyword,
which HF forwards to the attention function, and SP-p candidates attend over the whole sequence
through the profiler's SP group.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from dcp.memory import LOSS_CHUNK_TOKENS
from dcp.models.loss import chunked_cross_entropy

RecomputeFn = Callable[..., torch.Tensor]


class AdapterError(ValueError):
    """The model lacks what the profiler needs; the message says what is missing and how to fix it."""


def _config_dict(config: Any) -> dict[str, Any]:
    if config is None:
        return {}
    if isinstance(config, dict):
        return dict(config)
    if hasattr(config, "to_dict"):
        return dict(config.to_dict())
    if hasattr(config, "__dataclass_fields__"):
        import dataclasses

        return dataclasses.asdict(config)
    return {k: v for k, v in vars(config).items() if not k.startswith("_")}


def config_hash(config: Any) -> str:
    """Short stable hash of a model config (cache key): JSON of its fields, sorted."""
    raw = json.dumps(_config_dict(config), sort_keys=True, default=str)
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


class ModelAdapter:
    """Base class: what the profiler calls. Subclasses wrap one kind of model."""

    module: nn.Module
    name: str = "model"

    @property
    def num_layers(self) -> int:
        raise NotImplementedError

    @property
    def num_heads(self) -> int:
        raise NotImplementedError

    @property
    def num_kv_heads(self) -> int | None:
        """K/V heads (grouped-query attention), or None where the model cannot run SP sizes past its heads
        (a context axis there: ``dcp.planner.layout``)."""
        return None

    @property
    def max_sp_size(self) -> int | None:
        """Largest SP size this adapter can run correctly (None: any size with a layout for its heads)."""
        return None

    def config_hash(self) -> str:
        return config_hash(getattr(self.module, "config", None))

    def synthetic_batch(self, batch_size: int, seq_len: int, *, generator: torch.Generator) -> Any:
        raise NotImplementedError

    def layer_inputs(self, batch: Any, ctx: Any) -> tuple[torch.Tensor, Any]:
        raise NotImplementedError

    def run_layer(self, i: int, hidden: torch.Tensor, aux: Any, ctx: Any) -> torch.Tensor:
        raise NotImplementedError

    def head_loss(self, hidden: torch.Tensor, batch: Any, ctx: Any, aux: Any) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def full_loss(self, batch: Any, ctx: Any, recompute: RecomputeFn | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The whole model; each layer runs as ``recompute(run_one, hidden)`` when ``recompute`` is given."""
        hidden, aux = self.layer_inputs(batch, ctx)
        for i in range(self.num_layers):
            if recompute is None:
                hidden = self.run_layer(i, hidden, aux, ctx)
            else:
                hidden = recompute(_LayerCall(self, i, aux, ctx), hidden)
        return self.head_loss(hidden, batch, ctx, aux)


class _LayerCall:
    """``hidden -> run_layer(i, hidden, aux, ctx)`` as a picklable-free callable for checkpoint."""

    __slots__ = ("adapter", "i", "aux", "ctx")

    def __init__(self, adapter: ModelAdapter, i: int, aux: Any, ctx: Any) -> None:
        self.adapter, self.i, self.aux, self.ctx = adapter, i, aux, ctx

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.adapter.run_layer(self.i, hidden, self.aux, self.ctx)


class ProtocolAdapter(ModelAdapter):
    """A model exposing ``layers``, ``synthetic_batch``, ``layer_inputs``, ``run_layer``, ``head_loss``."""

    REQUIRED = ("layers", "synthetic_batch", "layer_inputs", "run_layer", "head_loss")

    def __init__(self, model: nn.Module) -> None:
        missing = [n for n in self.REQUIRED if not hasattr(model, n)]
        if missing:
            raise AdapterError(
                f"model ({type(model).__name__}) lacks {missing}: implement the profiler protocol "
                f"({list(self.REQUIRED)}) or pass adapter=HFLlamaAdapter(model) / your own ModelAdapter"
            )
        self.module = model
        config = getattr(model, "config", None)
        self.name = str(getattr(config, "name", type(model).__name__))

    @property
    def num_layers(self) -> int:
        return len(self.module.layers)

    @property
    def num_heads(self) -> int:
        return int(self.module.config.num_heads)

    @property
    def num_kv_heads(self) -> int | None:
        # a model whose config states its shape (the reference models) says its K/V heads; a 2D model's two
        # attentions per layer are Ulysses only, so it has no sizes past its heads
        config = self.module.config
        shape = config.shape() if callable(getattr(config, "shape", None)) else None
        return None if shape is None or shape.attentions_per_layer > 1 else shape.kv_heads

    def synthetic_batch(self, batch_size: int, seq_len: int, *, generator: torch.Generator) -> Any:
        return self.module.synthetic_batch(batch_size, seq_len, generator=generator)

    def layer_inputs(self, batch: Any, ctx: Any) -> tuple[torch.Tensor, Any]:
        return self.module.layer_inputs(batch, ctx)

    def run_layer(self, i: int, hidden: torch.Tensor, aux: Any, ctx: Any) -> torch.Tensor:
        return self.module.run_layer(i, hidden, aux, ctx)

    def head_loss(self, hidden: torch.Tensor, batch: Any, ctx: Any, aux: Any) -> tuple[torch.Tensor, torch.Tensor]:
        return self.module.head_loss(hidden, batch, ctx, aux)


class HFLlamaAdapter(ModelAdapter):
    """A Hugging Face LlamaForCausalLM (or any model with the same ``model.model.*`` layout)."""

    def __init__(self, model: nn.Module, *, sp_aware: bool | None = None) -> None:
        inner = getattr(model, "model", None)
        missing = [n for n in ("layers", "embed_tokens", "norm", "rotary_emb") if not hasattr(inner, n)]
        if not hasattr(model, "lm_head"):
            missing.append("lm_head")
        if missing:
            raise AdapterError(
                f"model ({type(model).__name__}) lacks model.{missing}: HFLlamaAdapter expects a Llama-style "
                "causal LM (model.model.layers, embed_tokens, rotary_emb, norm, and lm_head); write a ModelAdapter"
            )
        self.module = model
        attn = getattr(model.config, "_attn_implementation", None)
        # None: SP-aware exactly when the model runs the DCP Ulysses attention (dcp.integrations.hf)
        self.sp_aware = attn == "dcp_ulysses" if sp_aware is None else bool(sp_aware)
        if self.sp_aware and attn != "dcp_ulysses":
            raise AdapterError(
                f"HFLlamaAdapter(sp_aware=True) but the model's attention is {attn!r}, which only sees this "
                "rank's chunk: call dcp.integrations.hf.prepare(model) first (it selects 'dcp_ulysses')"
            )
        self.name = str(getattr(model.config, "model_type", "hf")) + "-hf"

    @property
    def num_layers(self) -> int:
        return len(self.module.model.layers)

    @property
    def num_heads(self) -> int:
        return int(self.module.config.num_attention_heads)

    @property
    def num_kv_heads(self) -> int | None:
        return int(getattr(self.module.config, "num_key_value_heads", None) or self.num_heads)

    @property
    def max_sp_size(self) -> int | None:
        return None if self.sp_aware else 1

    def synthetic_batch(self, batch_size: int, seq_len: int, *, generator: torch.Generator) -> Any:
        from dcp.data import collate_tokens

        ids = torch.randint(0, int(self.module.config.vocab_size), (batch_size, seq_len), generator=generator)
        return collate_tokens(list(ids))

    def _chunk(self, t: torch.Tensor, ctx: Any, value: int) -> torch.Tensor:
        from dcp.runtime.context_parallel import take_shard

        s = t.shape[1]
        return take_shard(F.pad(t, (0, ctx.padded_len(s) - s), value=value), ctx.shard_ranges(s))

    def config_hash(self) -> str:
        # the attention implementation is part of what was measured (SP-aware or not); use_cache is not (the
        # profiled forwards pass use_cache=False; transformers.Trainer turns it off on the model it trains)
        fields = {k: v for k, v in _config_dict(self.module.config).items() if k != "use_cache"}
        return config_hash({**fields, "dcp_sp_aware": self.sp_aware, "dcp_loss_chunk_tokens": LOSS_CHUNK_TOKENS})

    def layer_inputs(self, batch: Any, ctx: Any) -> tuple[torch.Tensor, Any]:
        inner = self.module.model
        device = inner.embed_tokens.weight.device
        ids = self._chunk(batch.inputs.to(device), ctx, 0)
        hidden = inner.embed_tokens(ids)
        # Global positions: a token gets the same rotation whatever the SP layout.
        position_ids = self._chunk(torch.arange(ctx.padded_len(batch.inputs.shape[1]), device=device)[None, :], ctx, 0)
        cos, sin = inner.rotary_emb(hidden, position_ids)
        return hidden, {"position_embeddings": (cos, sin), "position_ids": position_ids}

    def run_layer(self, i: int, hidden: torch.Tensor, aux: Any, ctx: Any) -> torch.Tensor:
        out = self.module.model.layers[i](
            hidden,
            attention_mask=None,
            position_ids=aux["position_ids"],
            position_embeddings=aux["position_embeddings"],
            use_cache=False,
            **({"dcp_ctx": ctx} if self.sp_aware else {}),  # HF hands it to the attention function
        )
        return out[0] if isinstance(out, tuple) else out

    def head_loss(self, hidden: torch.Tensor, batch: Any, ctx: Any, aux: Any) -> tuple[torch.Tensor, torch.Tensor]:
        from dcp.data import IGNORE_INDEX

        targets = self._chunk(batch.targets.to(hidden.device), ctx, IGNORE_INDEX)
        loss_sum = chunked_cross_entropy(hidden, targets, lambda h: self.module.lm_head(self.module.model.norm(h)),
                                         LOSS_CHUNK_TOKENS)
        return loss_sum, (targets != IGNORE_INDEX).sum()


def get_adapter(model: Any) -> ModelAdapter:
    """The adapter for ``model``: itself if it is one, the protocol adapter, or the HF Llama adapter."""
    if isinstance(model, ModelAdapter):
        return model
    if all(hasattr(model, n) for n in ProtocolAdapter.REQUIRED):
        return ProtocolAdapter(model)
    inner = getattr(model, "model", None)
    if inner is not None and hasattr(inner, "layers") and hasattr(inner, "embed_tokens"):
        return HFLlamaAdapter(model)
    raise AdapterError(
        f"model ({type(model).__name__}) exposes neither the profiler protocol "
        f"({list(ProtocolAdapter.REQUIRED)}) nor a Llama layout (model.model.layers, embed_tokens): "
        "pass adapter=<a dcp.profiler.adapters.ModelAdapter subclass> to profile_table"
    )
