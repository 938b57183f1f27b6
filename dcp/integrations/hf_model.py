"""What DCP reads from any Hugging Face causal LM: its shape, its decoder layers, its final norm and head,
and a profiler adapter built from those, with no per-architecture code.

- **Shape** from the config (:func:`hf_shape`): layers, hidden size, heads and K/V heads. transformers'
  ``attribute_map`` already maps GPT-2's ``n_layer`` / ``n_head`` / ``n_embd``; K/V heads are read only
  where the config class declares ``num_key_value_heads`` (GPT-NeoX accepts the keyword but its attention
  ignores it), otherwise they equal the heads.
- **Decoder layers** (:func:`find_decoder_layers`): the shallowest ``nn.ModuleList`` holding
  ``config.num_hidden_layers`` modules of one class (``model.model.layers``, ``model.gpt_neox.layers``,
  ``transformer.h`` ...).
- **Final norm** (:func:`find_final_norm`): the base model's child named ``norm``, ``final_layernorm``,
  ``final_layer_norm``, ``ln_f`` or ``final_norm``; the head is ``model.get_output_embeddings()``.
- **Profiler adapter** (:class:`HFCausalLMAdapter`): ``layer_inputs`` runs the base model's own forward
  up to the first decoder layer and captures what that layer receives (hidden states after the
  embedding, Gemma's scaling or GPT-2's position embedding; rotary tables; position ids; the DCP
  context), so every architecture's embedding is the model's own code; ``run_layer`` calls layer i with
  the same keywords; ``head_loss`` applies the final norm, the head and Gemma-2's logit soft-capping, and the cross-entropy
  in chunks of ``loss_chunk_tokens`` tokens (:func:`dcp.models.loss.chunked_cross_entropy`: never every logit).

A model where a piece cannot be found gets one line naming what to pass to
:func:`dcp.integrations.hf.prepare` (``layers=`` or ``final_norm=``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from dcp.config import ModelShapeConfig
from dcp.memory import LOSS_CHUNK_TOKENS
from dcp.models.loss import chunked_cross_entropy
from dcp.profiler.adapters import ModelAdapter, _config_dict, config_hash
from dcp.runtime.context_parallel import take_shard

NORM_NAMES = ("norm", "final_layernorm", "final_layer_norm", "ln_f", "final_norm", "norm_f")
"""Attribute names of a base model's final norm, in the order they are tried."""


class HFModelError(ValueError):
    """A piece of the HF model cannot be found; the message names what to pass instead."""


@dataclass(frozen=True, slots=True)
class HFShape:
    """The sizes DCP reads from an HF config."""

    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    ffn_hidden_size: int
    vocab_size: int


def _declares(config: Any, field: str) -> bool:
    """True when the config's class (not just this instance) defines ``field``."""
    for cls in type(config).__mro__:
        if field in getattr(cls, "__annotations__", {}):
            return True
        init = cls.__dict__.get("__init__")
        if init is not None and field in inspect.signature(init).parameters:
            return True
    return False


def _int_field(config: Any, name: str, model_name: str) -> int:
    value = getattr(config, name, None)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise HFModelError(
            f"config.{name} ({value!r}) of {model_name} is not a positive integer: pass "
            "set_manager(..., config=dcp.DCPConfig(model=dcp.config.ModelShapeConfig(num_layers=..., "
            "hidden_size=..., num_heads=...)))"
        )
    return value


def hf_shape(model: Any) -> HFShape:
    """Layers, width, heads, K/V heads, FFN width and vocabulary from ``model.config``."""
    c, name = model.config, type(model).__name__
    heads = _int_field(c, "num_attention_heads", name)
    kv = getattr(c, "num_key_value_heads", None) if _declares(c, "num_key_value_heads") else None
    hidden = _int_field(c, "hidden_size", name)
    ffn = getattr(c, "intermediate_size", None) or getattr(c, "n_inner", None) or 4 * hidden
    return HFShape(num_layers=_int_field(c, "num_hidden_layers", name), hidden_size=hidden, num_heads=heads,
                   num_kv_heads=int(kv) if isinstance(kv, int) and kv >= 1 else heads,
                   ffn_hidden_size=int(ffn), vocab_size=_int_field(c, "vocab_size", name))


def model_shape(model: Any, *, name: str | None = None) -> ModelShapeConfig:
    """The planner's ModelShapeConfig of an HF causal LM, from its config and parameter dtype."""
    shape = hf_shape(model)
    param = next(model.parameters(), None)
    count = sum(p.numel() for p in model.parameters())
    return ModelShapeConfig(
        name=name or f"{model.config.model_type}-hf-{count / 1e6:.2g}m", num_layers=shape.num_layers,
        hidden_size=shape.hidden_size, num_heads=shape.num_heads, num_kv_heads=shape.num_kv_heads,
        ffn_hidden_size=shape.ffn_hidden_size,
        vocab_size=shape.vocab_size, param_bytes=param.element_size() if param is not None else 4,
    )


def find_decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The shallowest ``nn.ModuleList`` of ``config.num_hidden_layers`` modules of one class."""
    n = getattr(model.config, "num_hidden_layers", None)
    found = [(name.count("."), name, mod) for name, mod in model.named_modules()
             if isinstance(mod, nn.ModuleList) and len(mod) == n and len(mod) > 0
             and len({type(m) for m in mod}) == 1]
    if not found:
        raise HFModelError(
            f"{type(model).__name__} holds no nn.ModuleList of its {n} decoder layers (config.num_hidden_layers): "
            "call dcp.integrations.hf.prepare(model, layers=<the model's list of decoder layers>) before set_manager"
        )
    found.sort(key=lambda t: (t[0], t[1]))
    return found[0][2]


def find_final_norm(model: nn.Module) -> nn.Module:
    """The base model's final norm (one of :data:`NORM_NAMES`)."""
    base = getattr(model, "base_model", model)
    for name in NORM_NAMES:
        mod = getattr(base, name, None)
        if isinstance(mod, nn.Module):
            return mod
    raise HFModelError(
        f"{type(base).__name__} has no final norm named one of {list(NORM_NAMES)}: call "
        "dcp.integrations.hf.prepare(model, final_norm=<its final norm module, or torch.nn.Identity()>) "
        "before set_manager"
    )


def chunk(t: torch.Tensor, ctx: Any, value: int) -> torch.Tensor:
    """This rank's part of ``[b, s]`` right-padded with ``value`` to ``ctx.padded_len``: its contiguous chunk,
    or a context layout's two chunks (``SPContext.shard_ranges``)."""
    s = t.shape[1]
    return take_shard(F.pad(t, (0, ctx.padded_len(s) - s), value=value), ctx.shard_ranges(s))


def logits_fn(model: nn.Module, norm: nn.Module | None = None) -> Callable[[torch.Tensor], torch.Tensor]:
    """Rows of hidden states -> logits as the model's forward computes them: ``norm`` (if given: for hidden
    states taken before the final norm), the head, then what some forwards apply after it (Gemma-2's
    ``final_logit_softcapping``, Cohere's ``logit_scale``, Granite's ``logits_scaling``). Per token, so
    :func:`dcp.models.loss.chunked_cross_entropy` may run it on any chunk of rows."""
    head, config = model.get_output_embeddings(), model.config
    cap = getattr(config, "final_logit_softcapping", None)
    scale = getattr(config, "logit_scale", None)
    divide = getattr(config, "logits_scaling", None)

    def logits(rows: torch.Tensor) -> torch.Tensor:
        out = head(rows if norm is None else norm(rows))
        if cap:
            out = torch.tanh(out / cap) * cap
        if scale:
            out = out * scale
        if divide:
            out = out / divide
        return out

    return logits


class _Captured(Exception):  # noqa: N818 (control flow, not an error)
    """Raised by the first decoder layer's pre-hook once its inputs are recorded."""

    def __init__(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        super().__init__()
        self.args, self.kwargs = args, kwargs


def _capture(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    raise _Captured(args, kwargs)


class HFCausalLMAdapter(ModelAdapter):
    """The dual-layer profiler's view of any HF causal LM (see the module docstring)."""

    def __init__(self, model: nn.Module, *, layers: nn.ModuleList | None = None, final_norm: nn.Module | None = None,
                 sp_aware: bool | None = None, loss_chunk_tokens: int = LOSS_CHUNK_TOKENS) -> None:
        if loss_chunk_tokens < 0:
            raise HFModelError(f"loss_chunk_tokens ({loss_chunk_tokens}) must be >= 0: use 0 for one piece")
        self.module = model
        self.loss_chunk_tokens = loss_chunk_tokens
        self.layers = find_decoder_layers(model) if layers is None else layers
        self.norm = find_final_norm(model) if final_norm is None else final_norm
        self.head = model.get_output_embeddings()
        if self.head is None:
            raise HFModelError(f"{type(model).__name__}.get_output_embeddings() is None: use a *ForCausalLM model")
        self.shape = hf_shape(model)
        attn = getattr(model.config, "_attn_implementation", None)
        self.sp_aware = attn == "dcp_ulysses" if sp_aware is None else bool(sp_aware)
        if self.sp_aware and attn != "dcp_ulysses":
            raise HFModelError(
                f"HFCausalLMAdapter(sp_aware=True) but the model's attention is {attn!r}, which only sees this "
                "rank's chunk: call dcp.integrations.hf.prepare(model) first (it selects 'dcp_ulysses')"
            )
        self.name = f"{getattr(model.config, 'model_type', 'hf')}-hf"

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def num_heads(self) -> int:
        return self.shape.num_heads

    @property
    def num_kv_heads(self) -> int | None:
        return self.shape.num_kv_heads

    @property
    def max_sp_size(self) -> int | None:
        return None if self.sp_aware else 1

    def config_hash(self) -> str:
        # the attention implementation is part of what was measured (SP-aware or not); use_cache is not (DCP's
        # forwards pass use_cache=False), and transformers.Trainer turns it off on the model it trains: a Trainer
        # run and a plain loop of the same model share one cached table
        fields = {k: v for k, v in _config_dict(self.module.config).items() if k != "use_cache"}
        return config_hash({**fields, "dcp_sp_aware": self.sp_aware, "dcp_loss_chunk_tokens": self.loss_chunk_tokens})

    def synthetic_batch(self, batch_size: int, seq_len: int, *, generator: torch.Generator) -> Any:
        from dcp.data import collate_tokens

        ids = torch.randint(0, self.shape.vocab_size, (batch_size, seq_len), generator=generator)
        return collate_tokens(list(ids))

    def layer_inputs(self, batch: Any, ctx: Any) -> tuple[torch.Tensor, Any]:
        device = self.head.weight.device
        ids = chunk(batch.inputs.to(device), ctx, 0)
        s = batch.inputs.shape[1]
        # global positions: a token gets the same rotation (or position embedding) whatever the SP layout
        positions = torch.arange(ctx.padded_len(s), device=device)[None, :]
        position_ids = take_shard(positions, ctx.shard_ranges(s)).expand_as(ids)
        extra = {"dcp_ctx": ctx} if self.sp_aware else {}  # HF forwards it through the layer to the attention
        hook = self.layers[0].register_forward_pre_hook(_capture, with_kwargs=True)
        try:
            self.module.base_model(input_ids=ids, position_ids=position_ids, use_cache=False, **extra)
        except _Captured as got:
            return got.args[0], (got.args[1:], got.kwargs)
        finally:
            hook.remove()
        raise HFModelError(f"{type(self.module).__name__}'s forward never called its first decoder layer: pass "
                           "prepare(model, layers=<the list of decoder layers its forward runs>)")

    def run_layer(self, i: int, hidden: torch.Tensor, aux: Any, ctx: Any) -> torch.Tensor:
        args, kwargs = aux
        out = self.layers[i](hidden, *args, **kwargs)
        return out[0] if isinstance(out, tuple) else out

    def head_loss(self, hidden: torch.Tensor, batch: Any, ctx: Any, aux: Any) -> tuple[torch.Tensor, torch.Tensor]:
        from dcp.data import IGNORE_INDEX

        targets = chunk(batch.targets.to(hidden.device), ctx, IGNORE_INDEX)
        loss_sum = chunked_cross_entropy(hidden, targets, logits_fn(self.module, self.norm), self.loss_chunk_tokens)
        return loss_sum, (targets != IGNORE_INDEX).sum()
