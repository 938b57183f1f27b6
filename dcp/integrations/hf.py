"""Hugging Face ``transformers`` causal LMs under DCP: one call, :func:`prepare`, and one dataset wrapper.

``prepare(model)`` makes any ``*ForCausalLM`` whose attention goes through transformers'
``AttentionInterface`` (Llama, Qwen2, Qwen3, Mistral, Gemma, Gemma-2, Phi, Phi-3, GPT-NeoX, OLMo, GPT-2 ...)
trainable by the DCP manager without touching its code and without a per-model adapter:

- **Ulysses attention through transformers' attention interface.** :func:`ulysses_attention_hf` is
  registered in ``transformers.AttentionInterface`` as ``"dcp_ulysses"`` and the model is switched to it
  (``model.set_attn_implementation``). HF hands it ``q, k, v`` as ``[b, heads, s_local, d]`` of this
  rank's chunk; it all-to-alls them over the SP group of the ``dcp_ctx`` keyword (an ``SPContext``)
  so every rank attends causally over the WHOLE sequence for its heads, and returns
  ``[b, s_local, heads, d]``. The context is an explicit keyword that HF forwards from
  ``model(..., dcp_ctx=ctx)`` through every decoder layer to the attention function: no global state, and
  the profiler reaches the same attention with ITS SP groups (the adapter passes its context the same way).
  A model's own attention scale (Gemma-2's ``query_pre_attn_scalar``) is applied exactly.
- **The forward** (:meth:`HFCausalLM.forward`, the manager's ``forward_fn``): samples of unequal lengths
  run as one row of documents (no layer computes on padding), the row is padded to a multiple of the SP
  size, this rank keeps its contiguous chunk with its GLOBAL ``position_ids`` (RoPE rotates every token as
  without SP, restarting at every document), and it returns ``(loss_sum, labelled_count)`` of the chunk.
- **The profiler adapter, the shape and the decoder layers** come from the model itself
  (:mod:`dcp.integrations.hf_model`): the config's sizes, the ``nn.ModuleList`` of decoder layers (where
  the recompute switch goes) and a generic adapter that runs the model's own embedding code.
- **The dataset** (:class:`TokenDataset`, :mod:`dcp.integrations.hf_data`): a ``datasets.Dataset`` (or any
  sequence) of ``input_ids`` with optional ``labels`` (``-100`` ignored) in one line.

``dcp.set_manager(model, dataset)`` calls :func:`prepare` itself; call it yourself only to pass
``layers=`` / ``final_norm=`` for a model where they cannot be found, or to use the pieces elsewhere.
Without a ``dcp_ctx`` (evaluation, generation) the attention is plain causal SDPA on what it is given (an
explicit attention mask falls back to HF's SDPA).
"""

from __future__ import annotations

import functools
import inspect
import math
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from dcp.config import ModelShapeConfig
from dcp.data import IGNORE_INDEX
from dcp.integrations.hf_data import TokenDataset, cached_lengths, dataset_fingerprint
from dcp.integrations.hf_defaults import fit_config, sp_sizes_for
from dcp.integrations.hf_model import (
    HFCausalLMAdapter,
    HFModelError,
    chunk,
    find_decoder_layers,
    hf_shape,
    logits_fn,
    model_shape,
)
from dcp.memory import LOSS_CHUNK_TOKENS
from dcp.models.common import pack_rows
from dcp.models.loss import chunked_cross_entropy
from dcp.runtime.attention import DocLens
from dcp.runtime.context import SPContext

ATTENTION_NAME = "dcp_ulysses"
"""Name under which the Ulysses attention is registered in ``transformers.AttentionInterface``."""
TESTED_MODEL_TYPES = ("llama", "qwen2", "qwen3", "mistral", "gemma", "gemma2", "phi", "phi3", "gpt_neox", "olmo",
                      "gpt2")
"""HF ``config.model_type`` values whose SP-2 loss is tested against the unmodified model; any other causal LM
whose class sets ``_supports_attention_backend`` is prepared the same way."""


class HFIntegrationError(ValueError):
    """The model (or a call) breaks a rule of the HF integration; the message names the fix."""


def is_hf_model(model: Any) -> bool:
    """True for a ``transformers.PreTrainedModel`` (without importing transformers when it is absent)."""
    for cls in type(model).__mro__:
        if cls.__name__ == "PreTrainedModel" and cls.__module__.startswith("transformers"):
            return True
    return False


def is_supported(model: Any) -> bool:
    """True when :func:`prepare` can drive ``model``: an HF model with an LM head whose attention goes through
    transformers' ``AttentionInterface`` (``_supports_attention_backend``)."""
    return is_hf_model(model) and bool(getattr(model, "_supports_attention_backend", False)) \
        and getattr(model, "get_output_embeddings", lambda: None)() is not None


def ulysses_attention_hf(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                         attention_mask: torch.Tensor | None, *, dcp_ctx: SPContext | None = None,
                         dcp_docs: DocLens | None = None, dropout: float = 0.0, scaling: float | None = None,
                         sliding_window: int | None = None, softcap: float | None = None,
                         **kwargs: Any) -> tuple[torch.Tensor, None]:
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
    if softcap:
        raise HFIntegrationError(
            f"attention logit soft-capping ({softcap}) is not supported by the DCP Ulysses attention (SDPA / "
            "flash kernels): build the model with config.attn_logit_softcapping = None"
        )
    if kwargs.get("s_aux") is not None:
        raise HFIntegrationError("attention sinks (s_aux) are not supported by the DCP Ulysses attention: "
                                 "use a model without attention sinks")
    if dcp_ctx is None:
        if attention_mask is not None:
            from transformers.integrations.sdpa_attention import sdpa_attention_forward

            return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=0.0,
                                          scaling=scaling, **kwargs)
        dcp_ctx = SPContext.single()
    head_dim = query.shape[-1]
    if scaling is not None and not math.isclose(scaling, head_dim ** -0.5, rel_tol=1e-6):
        # the kernels use 1/sqrt(d): scaling q by scaling * sqrt(d) gives the model's own q.k * scaling
        query = query * (scaling * math.sqrt(head_dim))
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


@dataclass(frozen=True, eq=False)
class HFCausalLM:
    """An HF causal LM prepared for DCP (see the module docstring); build it with :func:`prepare`."""

    model: Any
    """The transformers model, its attention switched to ``"dcp_ulysses"``."""
    layers: Any
    """Its decoder layers (an ``nn.ModuleList``): the recompute switch goes on each."""
    final_norm: Any = field(default=None)
    """Its final norm (None: found by name when the profiler adapter is built)."""
    loss_chunk_tokens: int = LOSS_CHUNK_TOKENS
    """Tokens per piece of the head + cross-entropy (one piece's logits alive at a time; 0: one piece)."""
    checked: list = field(default_factory=list, init=False, repr=False)
    """Non-empty once the chunked head was checked against the model's own logits (the first forward)."""

    @functools.cached_property
    def chunks_loss(self) -> bool:
        """Whether the forward chunks the loss: a chunk size is set and the model's forward takes
        ``logits_to_keep`` (read once: the signature does not change)."""
        return bool(self.loss_chunk_tokens) and "logits_to_keep" in inspect.signature(self.model.forward).parameters

    def _check_logits(self, own: torch.Tensor, ours: torch.Tensor) -> None:
        """Refuse, in one line, a model whose forward computes its logits otherwise than ``logits_fn`` (a scale
        or soft-cap of its own after the head): the chunked loss would be another loss."""
        own, ours = own.detach().float(), ours.float()
        if own.shape != ours.shape or not torch.allclose(ours, own, rtol=1e-2, atol=1e-2 * float(own.abs().max())):
            raise HFIntegrationError(
                f"{type(self.model).__name__}'s forward computes its logits otherwise than norm + head (+ the "
                "soft-capping or logit scaling its config names), so the loss cannot be chunked: prepare it with "
                "dcp.integrations.hf.prepare(model, loss_chunk_tokens=0) before set_manager (the model's whole logits)")
        self.checked.append(True)

    def forward(self, model: Any, batch: Any, ctx: SPContext) -> tuple[torch.Tensor, torch.Tensor]:
        """The manager's ``forward_fn``: ``(loss_sum, labelled tokens)`` over this rank's chunk of ``batch``.

        Samples of unequal lengths (a right-padded micro-batch) run as ONE row of their real tokens, the
        samples back to back as documents: position ids restart at every document and attention stays
        inside each (``dcp_docs``), so no layer computes on padding and the result is that of the samples one
        at a time, the cost the planner prices (its real lengths, not b x the longest). The layout is decided
        from ``batch.seq_lens`` (host ints), never from a tensor value."""
        device = self.model.get_output_embeddings().weight.device
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
        kwargs = dict(input_ids=ids, position_ids=position_ids, use_cache=False, dcp_ctx=ctx, dcp_docs=docs)
        if not self.chunks_loss:
            logits = model(**kwargs).logits
            loss_sum = F.cross_entropy(logits.flatten(0, 1).float(), labels.reshape(-1), ignore_index=IGNORE_INDEX,
                                       reduction="sum")
            return loss_sum, (labels != IGNORE_INDEX).sum()
        # The model's own forward runs, its head on one row (logits_to_keep: the last position); a hook takes the
        # base model's output (after the final norm) and the head + cross-entropy run in token chunks, recomputed
        # in backward. The loss is computed INSIDE the root module's forward and returned as its output (a hook
        # placed before the engine's own): under fsdp2-zero3 the root's parameters (the head) are gathered only
        # there, and the engine's backward hooks on the root's outputs gather them again for the recompute.
        hidden: list[torch.Tensor] = []

        def take_hidden(_m: Any, _a: Any, out: Any) -> None:
            hidden.append(out[0] if isinstance(out, tuple) else out.last_hidden_state)

        def loss_as_output(_m: Any, _a: Any, out: Any) -> Any:
            logits = logits_fn(self.model)
            if not self.checked:  # once: the model's own logits of the last position against ours
                self._check_logits(out.logits, logits(hidden[-1][:, -1:].detach()))
            out.logits = chunked_cross_entropy(hidden[-1], labels, logits, self.loss_chunk_tokens)
            return out

        hooks = [self.model.base_model.register_forward_hook(take_hidden),
                 model.register_forward_hook(loss_as_output, prepend=True)]
        try:
            last = torch.tensor([ids.shape[1] - 1], dtype=torch.long, device=device)  # the head's one row
            loss_sum = model(**kwargs, logits_to_keep=last).logits
        finally:
            for hook in hooks:
                hook.remove()
        return loss_sum, (labels != IGNORE_INDEX).sum()

    def adapter(self) -> HFCausalLMAdapter:
        """The profiler adapter: the model's own layers, attention over the profiler's SP groups."""
        return HFCausalLMAdapter(self.model, layers=self.layers, final_norm=self.final_norm, sp_aware=True,
                                 loss_chunk_tokens=self.loss_chunk_tokens)

    def shape(self) -> ModelShapeConfig:
        """The planner's model shape (layers, width, heads, FFN, vocabulary, bytes per parameter)."""
        return model_shape(self.model)

    @property
    def num_kv_heads(self) -> int:
        """K/V heads (the heads where the config declares none), for the default SP sizes."""
        return hf_shape(self.model).num_kv_heads

    def attach(self, manager: Any) -> None:
        """Put the manager's recompute switch on every decoder layer (layer i is checkpointed when
        i < the micro-batch's recompute_layers)."""
        manager.wrap_layers(self.layers)


def prepare(model: Any, *, layers: Any = None, final_norm: Any = None,
            loss_chunk_tokens: int = LOSS_CHUNK_TOKENS) -> HFCausalLM:
    """Prepare an HF causal LM for DCP: register and select the Ulysses attention; return the pieces.

    ``layers`` (the model's ``nn.ModuleList`` of decoder layers) and ``final_norm`` are found in the model
    when left out; pass them for a model where they cannot be. ``loss_chunk_tokens``: tokens per piece of the
    head + cross-entropy (0: the model's own whole logits). A second call on the same model returns the
    first call's result (``set_manager`` calls it too). Raises :class:`HFIntegrationError` for a model
    it cannot drive, naming what to pass instead.
    """
    if not is_hf_model(model):
        raise HFIntegrationError(
            f"model ({type(model).__name__}) is not a transformers PreTrainedModel: dcp.integrations.hf "
            "prepares Hugging Face causal LMs; pass forward_fn= (and adapter= to profile) to set_manager"
        )
    done = model.__dict__.get("_dcp_hf")
    if loss_chunk_tokens < 0:
        raise HFIntegrationError(f"loss_chunk_tokens ({loss_chunk_tokens}) must be >= 0: use 0 for the whole logits")
    if done is not None and layers is None and final_norm is None and loss_chunk_tokens == done.loss_chunk_tokens:
        return done
    name = f"{type(model).__name__} (model_type {getattr(model.config, 'model_type', None)!r})"
    if getattr(model, "get_output_embeddings", lambda: None)() is None:
        raise HFIntegrationError(
            f"{name} has no LM head (get_output_embeddings() is None): load the *ForCausalLM class of the model"
        )
    if not getattr(model, "_supports_attention_backend", False):
        raise HFIntegrationError(
            f"{name} does not route its attention through transformers.AttentionInterface "
            "(_supports_attention_backend is False): pass set_manager(..., forward_fn=fn, adapter=<a "
            "dcp.profiler.adapters.ModelAdapter>) and call mgr.wrap_layers(<its decoder layers>)"
        )
    if getattr(model.config, "attention_dropout", 0.0):
        raise HFIntegrationError(
            f"config.attention_dropout ({model.config.attention_dropout}) must be 0.0 for the DCP Ulysses "
            "attention: build the model with attention_dropout=0.0"
        )
    if getattr(model.config, "attn_logit_softcapping", None):
        raise HFIntegrationError(
            f"config.attn_logit_softcapping ({model.config.attn_logit_softcapping}) is not supported by the DCP "
            "Ulysses attention (SDPA / flash kernels): build the model with attn_logit_softcapping=None"
        )
    try:
        found = find_decoder_layers(model) if layers is None else layers
    except HFModelError as exc:
        raise HFIntegrationError(str(exc)) from None
    register_attention()
    model.set_attn_implementation(ATTENTION_NAME)
    prepared = HFCausalLM(model, found, final_norm, loss_chunk_tokens)
    model.__dict__["_dcp_hf"] = prepared  # not a module attribute: parameters and state_dict are unchanged
    return prepared


@dataclass(frozen=True)
class ManagerParts:
    """What ``set_manager`` takes from the HF integration for an HF model (see :func:`for_manager`)."""

    config: Any
    """The DCPConfig: the model's shape where ``[model]`` was left at its default, and the fitted defaults."""
    forward_fn: Any
    """The user's forward_fn, or the integration's."""
    adapter: Any
    """The user's adapter, or the integration's (SP-aware), or an SP-1 generic one beside a user forward_fn."""
    integration: HFCausalLM | None
    """The prepared model (None when the user's forward_fn drives it); ``attach(manager)`` after building."""


def for_manager(model: Any, lengths: Any, config: Any, *, forward_fn: Any, adapter: Any,
                world_size: int) -> ManagerParts:
    """The forward, the profiler adapter and the config ``set_manager`` uses for an HF model.

    Without ``forward_fn`` the model is prepared (:func:`prepare`; it raises, naming what to pass, for a
    model it cannot drive). With one, the user's forward runs the model as it is (its own attention) and,
    unless ``adapter`` is given, the profiler gets the generic adapter limited to SP 1 (its attention only
    sees a rank's chunk). The config's settings left at the library defaults (profile edges, micro-batch
    cap, SP sizes) are fitted to ``lengths``, the heads and the world size (:func:`fit_config`).
    """
    from dcp.config import DCPConfig

    integration = None
    sp_world = world_size  # SP sizes > 1 need a forward and an adapter that run Ulysses
    if forward_fn is None:
        integration = prepare(model)
        forward_fn = integration.forward
        adapter = adapter if adapter is not None else integration.adapter()
    elif adapter is None:
        try:
            adapter, sp_world = HFCausalLMAdapter(model, sp_aware=False), 1
        except HFModelError as exc:
            raise HFIntegrationError(f"{exc}, or pass set_manager(..., adapter=<a dcp.profiler.adapters."
                                     "ModelAdapter>) beside your forward_fn") from None
    shape = hf_shape(model)
    try:
        lengths = [int(n) for n in lengths]
    except (TypeError, ValueError):
        lengths = []  # the manager's dataset check names the problem
    base = DCPConfig() if config is None else config
    derived = model_shape(model) if base.model == ModelShapeConfig() else None  # [model] left at its default
    config = fit_config(base, lengths=lengths, num_heads=shape.num_heads, num_kv_heads=shape.num_kv_heads,
                        world_size=sp_world, model=derived)
    return ManagerParts(config=config, forward_fn=forward_fn, adapter=adapter, integration=integration)


__all__ = ["ATTENTION_NAME", "HFCausalLM", "ManagerParts", "for_manager", "HFCausalLMAdapter", "HFIntegrationError", "HFModelError", "TokenDataset",
           "cached_lengths", "dataset_fingerprint", "fit_config", "hf_shape", "is_hf_model", "is_supported",
           "model_shape", "prepare", "register_attention", "sp_sizes_for", "ulysses_attention_hf"]
