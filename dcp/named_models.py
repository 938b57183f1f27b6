"""The one registry of named models: every name a CLI, a sweep, the simulator or ``build_model`` accepts.

A name maps to its family (``t1d``: LLM-like, one attention per layer; ``t2d``: spatial + temporal attention),
the preset of the family's config class (``T1DConfig.<preset>()`` in ``dcp.models``), and, for the paper's
models, the shape the simulator and the planner's analytic tables use (bf16 weights, Adam in mixed precision)
and the SP sizes the planner may use. ``dcp.models`` builds its configs from the same shape numbers, so a
paper model's layers, width, heads and MLP width are written once, here.

Standard library and ``dcp.config`` only: the planner, the simulator and the sweeps import it without torch.
To add a model: a preset on its family's config class (``dcp/models/t1d.py`` or ``t2d.py``) and an entry in
``MODELS`` below (with ``paper_shape`` if the simulator should know it).
"""

from __future__ import annotations

from dataclasses import dataclass

from dcp.config import ModelShapeConfig

FAMILIES = ("t1d", "t2d")
"""Model families: ``t1d`` (Transformer-1D, 1d attention) and ``t2d`` (Transformer-2D, 2d attention)."""

T1D_5B = ModelShapeConfig(
    name="t1d-5b",
    num_layers=42,  # [paper] Appendix B, Table 1
    hidden_size=3072,
    num_heads=48,
    # Gated MLP of width 8192 (= 8/3 h, Llama style) gives 12 h^2 per layer like a 4h plain MLP:
    # 42 * 12 * 3072^2 + embeddings = 4.95e9 parameters, the paper's "5B".
    ffn_hidden_size=8192,
    vocab_size=32000,
    param_bytes=2,  # bf16 weights and gradients
    optimizer_bytes_per_param=12,  # Adam in mixed precision: fp32 master weights + 2 moments, ZeRO-1 sharded
)
"""Transformer-1D of the paper: 5B parameters, LLM-like (Dubey et al., 2024)."""

T2D_1B2 = ModelShapeConfig(
    name="t2d-1.2b",
    num_layers=28,  # [paper] Appendix B, Table 1
    hidden_size=1152,
    num_heads=16,
    # An Open-Sora STDiT layer holds a spatial and a temporal block, each with self-attention, cross-attention
    # and a 4h MLP: 32 h^2 per layer. The planner counts 2 self-attentions (8 h^2) + a gated MLP (3 h f), so
    # f = 8h = 9216 folds the cross-attentions in: 28 * 32 * 1152^2 = 1.19e9 parameters, the paper's "1.2B",
    # both in analytic.layer_linear_params(model, "2d") (FLOPs) and in ModelShapeConfig.num_params (memory, sync).
    ffn_hidden_size=9216,
    attentions_per_layer=2,
    vocab_size=64,  # patch-embedding input (2x2 patches of 16 latent channels); negligible next to the layers
    param_bytes=2,
    optimizer_bytes_per_param=12,
)
"""Transformer-2D of the paper: 1.2B parameters, spatial then temporal attention (video DiT)."""


@dataclass(kw_only=True, slots=True, frozen=True)
class NamedModel:
    """One registered model name."""

    name: str
    """The name users type (``--model``, ``sweep.models``, ``build_model(name)``)."""
    family: str
    """One of FAMILIES: picks the config and model classes of ``dcp.models``."""
    preset: str
    """Name of the family config's classmethod that builds this model's config (``T1DConfig.tiny``)."""
    paper_shape: ModelShapeConfig | None = None
    """The shape the simulator and the analytic tables use (paper models only; None for CPU-sized ones)."""
    sp_sizes: tuple[int, ...] = ()
    """SP sizes the simulator's planner may use: powers of two dividing the head count (paper models)."""

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ValueError(f"NamedModel.family ({self.family!r}) is not one of {FAMILIES}: use one of those")
        if self.paper_shape is not None and self.paper_shape.name != self.name:
            raise ValueError(f"NamedModel.paper_shape.name ({self.paper_shape.name!r}) differs from name "
                             f"({self.name!r}): give the shape the model's name")
        bad = [p for p in self.sp_sizes if self.paper_shape is not None and self.paper_shape.num_heads % p]
        if bad:
            raise ValueError(f"NamedModel.sp_sizes ({self.sp_sizes}) holds {bad[0]}, which does not divide "
                             f"num_heads ({self.paper_shape.num_heads}): Ulysses shards heads; drop it")

    @property
    def attention(self) -> str:
        """The analytic model's attention layout: "1d" (t1d) or "2d" (t2d)."""
        return "1d" if self.family == "t1d" else "2d"


MODELS: dict[str, NamedModel] = {
    m.name: m
    for m in (
        NamedModel(name="t1d-tiny", family="t1d", preset="tiny"),
        NamedModel(name="t2d-tiny", family="t2d", preset="tiny"),
        NamedModel(name="t1d-5b", family="t1d", preset="paper_5b", paper_shape=T1D_5B, sp_sizes=(1, 2, 4, 8, 16)),
        NamedModel(name="t2d-1.2b", family="t2d", preset="paper_1_2b", paper_shape=T2D_1B2,
                   sp_sizes=(1, 2, 4, 8, 16)),
    )
}
"""Every model name, in this order: CPU-sized ones first, then the paper's (Table 1)."""

MODEL_NAMES = tuple(MODELS)
"""The names of MODELS."""

PAPER_MODELS = tuple(n for n, m in MODELS.items() if m.paper_shape is not None)
"""The paper's models, the ones the simulator knows: t1d-5b, t2d-1.2b."""


def named_model(name: str) -> NamedModel:
    """The registered model ``name``; ValueError naming the valid names otherwise."""
    if name not in MODELS:
        raise ValueError(f"model name ({name!r}) is not one of {sorted(MODELS)}: pick one of those")
    return MODELS[name]
