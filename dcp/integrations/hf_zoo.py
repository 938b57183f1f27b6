"""Tiny, randomly initialised causal LMs of several architectures, built from configs (nothing downloaded).

Used by ``examples/hf_train.py`` (``--arch``) and the tests: each has 4 heads (2 K/V heads where the
architecture has grouped-query attention), width 64, a byte vocabulary (256) and no attention dropout,
so the same data trains every one of them.
"""

from __future__ import annotations

from typing import Any

ARCHS = ("llama", "qwen2", "mistral", "gemma", "phi3", "gpt_neox", "qwen3", "gemma2", "olmo", "phi", "gpt2")
"""Architectures :func:`tiny_causal_lm` builds; the first six are the README's and the examples' test set."""


def _spec(arch: str, layers: int, hidden: int) -> tuple[str, str, dict[str, Any]]:
    gqa = dict(vocab_size=256, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096)
    specs: dict[str, tuple[str, str, dict[str, Any]]] = {
        "llama": ("LlamaConfig", "LlamaForCausalLM", gqa),
        "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", gqa),
        "mistral": ("MistralConfig", "MistralForCausalLM", {**gqa, "sliding_window": None}),
        "gemma": ("GemmaConfig", "GemmaForCausalLM", {**gqa, "head_dim": hidden // 4}),
        "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", {**gqa, "head_dim": hidden // 4, "query_pre_attn_scalar": 8,
                                                         "attn_logit_softcapping": None, "sliding_window": 4096}),
        "phi3": ("Phi3Config", "Phi3ForCausalLM", {**gqa, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}),
        "gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM", {**{k: v for k, v in gqa.items() if k != "num_key_value_heads"},
                                                             "intermediate_size": 4 * hidden}),  # its usual 4x MLP
        "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {**gqa, "head_dim": hidden // 4}),
        "olmo": ("OlmoConfig", "OlmoForCausalLM", {**gqa, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}),
        "phi": ("PhiConfig", "PhiForCausalLM", gqa),
        "gpt2": ("GPT2Config", "GPT2LMHeadModel", dict(vocab_size=256, n_embd=hidden, n_layer=layers, n_head=4,
                                                     n_positions=4096, attn_pdrop=0.0, embd_pdrop=0.0,
                                                     resid_pdrop=0.0, bos_token_id=1, eos_token_id=2)),
    }
    if arch not in specs:
        raise ValueError(f"arch ({arch!r}) is not one of {list(ARCHS)}: pick one of those")
    return specs[arch]


def tiny_causal_lm(arch: str = "llama", *, layers: int = 4, hidden: int = 64, seed: int = 0) -> Any:
    """A randomly initialised ``*ForCausalLM`` of ``arch`` (seeded: the same weights on every rank)."""
    import torch
    import transformers

    config_name, model_name, kwargs = _spec(arch, layers, hidden)
    torch.manual_seed(seed)
    return getattr(transformers, model_name)(getattr(transformers, config_name)(**kwargs))
