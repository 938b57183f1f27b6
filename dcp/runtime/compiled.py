"""Compiled repeated layers: ``torch.compile`` of each block, with DCP's attention left eager.

A short micro-batch on a GPU is bound by the host: an eager Transformer-1D layer launches ~95 kernels per
forward + backward (norms, RoPE, SwiGLU, residual adds, autocast's casts). Compiling a block fuses the
element-wise kernels and the weight casts (Inductor). Measured on an H200 (docs/benchmarks.md, *GPU*): 6-14 %
off every autocast micro-batch from 1k to 8k tokens, 10-12 % off a bf16 module's at 8k, nothing at 1-2k on a
bf16 module, which stays host-bound. No CUDA graphs (``mode="reduce-overhead"``): one graph replayed for every
layer overwrites the output of the layer before, which autograd still holds (seen on that H200).

The attention stays out of the graph: ``ulysses_attention`` and ``local_attention`` are
``torch.compiler.disable``'d and the reference blocks hand them their ``aux`` whole, so a compiled block is
two graphs (before and after attention) around an eager call. That call decides its layout from host ints
(documents of a packed micro-batch, which change every micro-batch) and runs the SP group's all-to-all;
tracing it, or even reading the lengths in the block, would make torch.compile guard on each micro-batch's
layout and recompile. What is compiled sees only tensors, so with ``dynamic=None`` torch marks the length
dynamic after the second one it sees; the graph after attention keeps one more entry for packed rows
(attention returns a view for one document per row, a new tensor for several). Then no new length or layout
compiles anything (``tests/unit/test_compiled.py``).

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
