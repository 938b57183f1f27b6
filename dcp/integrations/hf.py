"""Hugging Face ``transformers`` causal LMs under DCP: one call, :func:`prepare`.

``prepare(model)`` makes a ``LlamaForCausalLM`` (or a Qwen2 / Mistral causal LM: same ``model.model``
layout) trainable by the DCP manager without touching its code:

- **Ulysses attention through transformers' attention interface.** :func:`ulysses_attention_hf` is
  registered in ``transformers.AttentionInterface`` as ``"dcp_ulysses"`` and the model is switched to it
  (``model.set_attn_implementation``). HF hands it ``q, k, v`` as ``[b, heads, s_local, d]`` of this
  rank's chunk; it all-to-alls them over the SP group of the ``dcp_ctx`` keyword (an ``SPContext``)
  so every rank attends causally over the WHOLE sequence for its heads, and returns
  ``[b, s_local, heads, d]``. The context is an explicit keyword that HF forwards from
  ``model(..., dcp_ctx=ctx)`` through every decoder layer to the attention function: no global state, and
  the profiler reaches the same attention with ITS SP groups (the adapter passes its context the same way).
- **The forward** (:meth:`HFCausalLM.forward`, the manager's ``forward_fn``): samples of unequal lengths
  run as one row of documents (no layer computes on padding), the row is padded to a multiple of the SP
  size, this rank keeps its contiguous chunk with its GLOBAL ``position_ids`` (RoPE rotates every token as
  without SP, restarting at every document), and it returns ``(loss_sum, labelled_count)`` of the chunk.
- **The profiler adapter** (:meth:`HFCausalLM.adapter`): ``HFLlamaAdapter(model, sp_aware=True)``, whose
  layers receive the profiler's context, so SP-2 candidates are measured with the real all-to-all.
- **The model shape** (:meth:`HFCausalLM.shape`) the planner needs, from the HF config.

``dcp.set_manager(model, dataset)`` calls :func:`prepare` itself for a supported HF model; call it
yourself only to use the pieces elsewhere. Without a ``dcp_ctx`` (evaluation, generation) the attention
is plain causal SDPA on what it is given (an explicit attention mask falls back to HF's SDPA).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from dcp.config import ModelShapeConfig
from dcp.data import IGNORE_INDEX
from dcp.models.common import pack_rows
from dcp.runtime.attention import DocLens
from dcp.runtime.context import SPContext

ATTENTION_NAME = "dcp_ulysses"
"""Name under which the Ulysses attention is registered in ``transformers.AttentionInterface``."""
SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "mistral")
"""HF ``config.model_type`` values with the Llama layout (``model.model.layers``, ``embed_tokens``,
``rotary_emb``, ``norm``, ``lm_head``) and RoPE attention that :func:`prepare` supports."""


class HFIntegrationError(ValueError):
    """The model (or a call) breaks a rule of the HF integration; the message names the fix."""


def is_hf_model(model: Any) -> bool:
    """True for a ``transformers.PreTrainedModel`` (without importing transformers when it is absent)."""
    for cls in type(model).__mro__:
        if cls.__name__ == "PreTrainedModel" and cls.__module__.startswith("transformers"):
            return True
    return False


def is_supported(model: Any) -> bool:
    """True when :func:`prepare` can drive ``model`` (an HF causal LM of a supported family)."""
    return is_hf_model(model) and getattr(model.config, "model_type", None) in SUPPORTED_MODEL_TYPES \
        and hasattr(model, "lm_head") and hasattr(getattr(model, "model", None), "layers")


def ulysses_attention_hf(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                         attention_mask: torch.Tensor | None, *, dcp_ctx: SPContext | None = None,
                         dcp_docs: DocLens | None = None, dropout: float = 0.0, scaling: float | None = None,
                         sliding_window: int | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers attention function: ``[b, H, s_local, d]`` q, k, v in, ``([b, s_local, H, d], None)`` out.

    With ``dcp_ctx`` (every DCP forward and every profiled candidate) it is Ulysses over ``dcp_ctx.group``,
    causal over the full sequence; ``dcp_docs`` (host ints, ``dcp.runtime.attention.DocLens``) splits each
    row into documents that attend only within themselves (a micro-batch of unequal lengths packed into one
    row by :meth:`HFCausalLM.forward`). Without ``dcp_ctx``, plain causal attention on the given tokens.
    """
    from dcp.runtime.ulysses import ulysses_attention

    if dropout:
        raise HFIntegrationError(
            f"attention dropout ({dropout}) is not supported by the DCP Ulysses attention: set the model "
            "config's attention_dropout = 0.0"
        )
    head_dim = query.shape[-1]
    if scaling is not None and not math.isclose(scaling, head_dim ** -0.5, rel_tol=1e-6):
        raise HFIntegrationError(
            f"attention scaling ({scaling}) differs from 1/sqrt(head_dim) ({head_dim ** -0.5:.6g}): the DCP "
            "Ulysses attention uses the standard scale; use a model whose attention does"
        )
    if dcp_ctx is None:
        if attention_mask is not None:
            from transformers.integrations.sdpa_attention import sdpa_attention_forward

            return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=0.0,
                                          scaling=scaling, **kwargs)
        dcp_ctx = SPContext.single()
    full_len = query.shape[2] * dcp_ctx.sp_size
    if sliding_window is not None and full_len > sliding_window:
        raise HFIntegrationError(
            f"sequence of {full_len} tokens exceeds the model's sliding_window ({sliding_window}): the DCP "
            "Ulysses attention is full causal attention; set config.sliding_window = None (or >= the longest "
            "sample) or keep samples within the window"
        )
    out = ulysses_attention(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), dcp_ctx,
                            causal=True, doc_lens=dcp_docs)
    return out, None


def register_attention() -> None:
    """Register :func:`ulysses_attention_hf` as ``"dcp_ulysses"`` (idempotent)."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION_NAME, ulysses_attention_hf)


def model_shape(model: Any, *, name: str | None = None) -> ModelShapeConfig:
    """The planner's ModelShapeConfig of an HF causal LM, from its config and parameter dtype."""
    c = model.config
    param = next(model.parameters(), None)
    param_bytes = param.element_size() if param is not None else 4
    hidden, heads = int(c.hidden_size), int(c.num_attention_heads)
    return ModelShapeConfig(
        name=name or f"{c.model_type}-hf-{_count_params(model) / 1e6:.2g}m",
        num_layers=int(c.num_hidden_layers), hidden_size=hidden, num_heads=heads,
        ffn_hidden_size=int(getattr(c, "intermediate_size", 0) or 0), vocab_size=int(c.vocab_size),
        param_bytes=param_bytes,
    )


def _count_params(model: Any) -> int:
    return sum(p.numel() for p in model.parameters())


def chunk(t: torch.Tensor, ctx: SPContext, value: int) -> torch.Tensor:
    """This rank's contiguous chunk of ``[b, s]``, right-padded with ``value`` to a multiple of sp_size."""
    s = t.shape[1]
    start, end = ctx.shard(s)
    return F.pad(t, (0, ctx.padded_len(s) - s), value=value)[:, start:end]


@dataclass(frozen=True, eq=False)
class HFCausalLM:
    """An HF causal LM prepared for DCP (see the module docstring); build it with :func:`prepare`."""

    model: Any
    """The transformers model, its attention switched to ``"dcp_ulysses"``."""

    def forward(self, model: Any, batch: Any, ctx: SPContext) -> tuple[torch.Tensor, torch.Tensor]:
        """The manager's ``forward_fn``: ``(loss_sum, labelled tokens)`` over this rank's chunk of ``batch``.

        Samples of unequal lengths (a right-padded micro-batch) run as ONE row of their real tokens, the
        samples back to back as documents: position ids restart at every document and attention stays
        inside each (``dcp_docs``), so no layer computes on padding and the result is that of the samples one
        at a time, the cost the planner prices (its real lengths, not b x the longest). The layout is decided
        from ``batch.seq_lens`` (host ints), never from a tensor value."""
        device = self.model.lm_head.weight.device
        inputs, targets = batch.inputs.to(device), batch.targets.to(device)
        lens, docs = batch.seq_lens, None
        if any(n != inputs.shape[1] for n in lens):
            inputs, targets = pack_rows(inputs, lens), pack_rows(targets, lens)
            positions = torch.cat([torch.arange(n, device=device) for n in lens])[None]
            docs = (tuple(lens),)
        else:
            positions = torch.arange(inputs.shape[1], device=device)[None].expand_as(inputs)
        ids = chunk(inputs, ctx, 0)
        labels = chunk(targets, ctx, IGNORE_INDEX)
        # this chunk's GLOBAL positions (RoPE as without SP); SP padding after the last token gets 0 (no label,
        # and causal / per-document attention never lets a real token see it)
        position_ids = chunk(positions, ctx, 0)
        logits = model(input_ids=ids, position_ids=position_ids, use_cache=False, dcp_ctx=ctx, dcp_docs=docs).logits
        loss_sum = F.cross_entropy(logits.flatten(0, 1).float(), labels.reshape(-1), ignore_index=IGNORE_INDEX,
                                   reduction="sum")
        return loss_sum, (labels != IGNORE_INDEX).sum()

    def adapter(self) -> Any:
        """The profiler adapter: the model's own layers, attention over the profiler's SP groups."""
        from dcp.profiler.adapters import HFLlamaAdapter

        return HFLlamaAdapter(self.model, sp_aware=True)

    def shape(self) -> ModelShapeConfig:
        """The planner's model shape (layers, width, heads, FFN, vocabulary, bytes per parameter)."""
        return model_shape(self.model)

    def attach(self, manager: Any) -> None:
        """Put the manager's recompute switch on every decoder layer (layer i is checkpointed when
        i < the micro-batch's recompute_layers)."""
        manager.wrap_layers(self.model.model.layers)


def prepare(model: Any) -> HFCausalLM:
    """Prepare an HF causal LM for DCP: register and select the Ulysses attention; return the pieces.

    Raises :class:`HFIntegrationError` for a model that is not a supported causal LM.
    """
    if not is_hf_model(model):
        raise HFIntegrationError(
            f"model ({type(model).__name__}) is not a transformers PreTrainedModel: dcp.integrations.hf "
            "prepares Hugging Face causal LMs; pass forward_fn= to set_manager for other models"
        )
    model_type = getattr(model.config, "model_type", None)
    if not is_supported(model):
        raise HFIntegrationError(
            f"model_type ({model_type!r}, {type(model).__name__}) is not one of {list(SUPPORTED_MODEL_TYPES)} "
            "causal LMs: use a *ForCausalLM of a supported family, or pass forward_fn= and adapter= "
            "(a dcp.profiler.adapters.ModelAdapter) to set_manager"
        )
    if getattr(model.config, "attention_dropout", 0.0):
        raise HFIntegrationError(
            f"config.attention_dropout ({model.config.attention_dropout}) must be 0.0 for the DCP Ulysses "
            "attention: build the model with attention_dropout=0.0"
        )
    register_attention()
    model.set_attn_implementation(ATTENTION_NAME)
    return HFCausalLM(model)
