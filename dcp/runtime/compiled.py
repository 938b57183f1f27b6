"""Compiled repeated layers: ``torch.compile`` of each block, with DCP's attention left eager.

A short micro-batch on a GPU is bound by the host: an eager Transformer-1D layer launches ~95 kernels per
forward + backward (norms, RoPE, SwiGLU, residual adds, autocast's casts), and at 1024 tokens the host
takes longer to enqueue them than the GPU takes to run them (docs/benchmarks.md, *GPU*). Compiling a block
fuses those element-wise kernels (Inductor), and ``mode="reduce-overhead"`` also replays them as CUDA
graphs, so the host enqueues a few launches per layer instead of ~95.

The attention stays out of the graph: ``ulysses_attention`` and ``local_attention`` are
``torch.compiler.disable``'d, so a compiled block is two graphs (before and after attention) around an
eager call. That call decides its layout from host ints (documents of a packed micro-batch, which change
every micro-batch) and runs the SP group's all-to-all; tracing it would specialise the graph on each
micro-batch's document lengths and recompile every step. What is compiled depends only on the tensors'
shapes, so with ``dynamic=None`` torch marks the sequence length dynamic after the second length it sees
and one graph serves every length. (CUDA graphs still record one graph per distinct shape:
``dcp.loaders.static_shapes`` bounds how many a run meets.)

The blocks are the model's ``layers`` (the reference models' profiler protocol), which the profiler and the
training step both run, so the profile table prices what the run executes. Hugging Face models are refused
by ``set_manager``: their decoder layers take the document layout and the call pattern as Python
arguments, and recompiled for every new layout until torch.compile's recompile limit (measured on a tiny
Llama on CPU).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from dcp.config import COMPILE_MODES


def layer_modules(model: nn.Module) -> list[nn.Module]:
    """The repeated blocks of ``model``: its ``layers`` (the profiler protocol of the reference models)."""
    layers = getattr(model, "layers", None)
    if isinstance(layers, nn.ModuleList) and len(layers) > 0:
        return list(layers)
    raise ValueError(
        f"runtime.compile: model ({type(model).__name__}) has no non-empty `layers` ModuleList to compile: "
        "set runtime.compile = \"off\", or compile the model yourself before set_manager"
    )


def compile_layers(model: nn.Module, mode: str, *, backend: str = "inductor") -> int:
    """Compile each repeated block of ``model`` in place (``nn.Module.compile``); returns how many.

    ``mode`` is one of :data:`COMPILE_MODES` ("off" compiles nothing and returns 0). Parameters, buffers
    and the state dict are untouched (an in-place compile keeps the module's own names, so checkpoints and
    the engines' parameter lists see no ``_orig_mod`` prefix). ``backend`` is torch.compile's: "inductor"
    for speed; the CPU tests use "aot_eager" (the same capture, autograd split and graph breaks, without
    code generation) to check the path against eager."""
    if mode not in COMPILE_MODES:
        raise ValueError(f"runtime.compile ({mode!r}) is not one of {list(COMPILE_MODES)}: pick one of those")
    if mode == "off":
        return 0
    layers = layer_modules(model)
    options: dict[str, Any] = {"backend": backend, "dynamic": None}
    if backend == "inductor":
        options["mode"] = None if mode == "default" else mode
    for layer in layers:
        layer.compile(**options)
    return len(layers)
