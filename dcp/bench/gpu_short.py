"""``dcp bench gpu --only short``: how busy short micro-batches keep one GPU, eager against compiled blocks.

A 1024-token Transformer-1D micro-batch kept an H100 0.78 busy (docs/benchmarks.md, *GPU*): the host
enqueues ~760 kernels more slowly than the GPU runs them. For each variant, a fresh copy of one model runs
micro-batches of 1k, 2k and 8k tokens, as one row of one sample ("row") and as one row of four documents
("packed": attention per document, as a padded or packed micro-batch runs), and reports per micro-batch:

- ``wall_ms``: median forward + backward wall time of ``reps`` steps (synchronised), and ``tokens_per_s``;
- ``busy``: union of the GPU's kernel intervals of one profiled step over that wall (CUDA only);
- ``host_ms`` / ``gpu_ms``: the host's time to enqueue the step and the GPU's to run it (CUDA only);
- ``first_step_s``: the variant's first step at that shape (compilation included).

Variants: ``eager`` and ``compiled`` (dcp.runtime.compiled: each block under ``torch.compile``, attention
eager), each with autocast over fp32 weights (how the ddp engine runs bf16) or on a bf16 module
without autocast (DeepSpeed's bf16 mode: no weight casts, no fp32 gradient accumulation in the step).
Not ``mode="reduce-overhead"``: CUDA graphs of a compiled block are one graph replayed for every layer, and
each replay overwrites the output of the layer before, which autograd still holds (an H200 run stopped with
"accessing tensor output of CUDAGraphs that has been overwritten by a subsequent run").
"""

from __future__ import annotations

import copy
import time
from typing import Any

SHORT_LAYOUTS = (("row", (1024,)), ("packed", (512, 256, 128, 128)),
                 ("row", (2048,)), ("packed", (1024, 512, 256, 256)),
                 ("row", (8192,)), ("packed", (4096, 2048, 1024, 1024)))
"""(layout, document lengths) of the measured micro-batches: 1k, 2k and 8k tokens, one sample or four."""
VARIANTS = (("eager", "off", "autocast"), ("eager", "off", "bf16-module"),
            ("compiled", "default", "autocast"), ("compiled", "default", "bf16-module"))
"""(name, runtime.compile mode, weights) of the measured variants."""


def _batches(vocab: int, scale: int) -> list[tuple[str, tuple[int, ...], Any]]:
    import torch

    from dcp.data import collate_tokens

    gen = torch.Generator().manual_seed(3)
    out = []
    for layout, lengths in SHORT_LAYOUTS:
        lens = tuple(max(1, n // scale) for n in lengths)
        out.append((layout, lens, collate_tokens([torch.randint(0, vocab, (n,), generator=gen) for n in lens])))
    return out


def _measure(model: Any, batch: Any, device: Any, precision: str, reps: int) -> dict:
    from dcp.bench.gpu_steps import busy_and_wall_s, host_and_gpu_ms, sync_device, train_step
    from dcp.runtime.context import SPContext

    ctx = SPContext.single(attention="auto")
    sync_device(device)
    t0 = time.perf_counter()
    train_step(model, batch, ctx, 0, precision, device)  # first step at this shape: compiles when compiled
    sync_device(device)
    first = time.perf_counter() - t0
    busy, wall = busy_and_wall_s(model, batch, device, precision, reps)
    busy = None if busy != busy else busy  # NaN off CUDA: null in the JSON
    host_ms, gpu_ms = host_and_gpu_ms(model, batch, device, precision) if device.type == "cuda" else (None, None)
    model.zero_grad(set_to_none=True)
    return {"wall_ms": wall * 1e3, "busy": busy, "host_ms": host_ms, "gpu_ms": gpu_ms, "first_step_s": first}


def short_rows(name: str, device: Any, precision: str, layers: int, reps: int, *, scale: int = 1,
               backend: str = "inductor", variants: tuple = VARIANTS, progress: Any = None) -> list[dict]:
    """One row per (variant, micro-batch): the figures of the module docstring. ``scale`` divides every
    length (the CPU tests' tiny shapes); ``backend`` is torch.compile's ("aot_eager" in the CPU tests)."""
    import torch

    from dcp.models import build_model
    from dcp.runtime.compiled import compile_layers

    base = build_model(name, num_layers=layers).to(device)
    batches = [(lay, lens, b.to(device)) for lay, lens, b in _batches(base.config.vocab_size, scale)]
    rows = []
    for variant, mode, weights in variants:
        model = copy.deepcopy(base)
        if weights == "bf16-module":
            model.to(torch.bfloat16)
        step_precision = precision if weights == "autocast" else "fp32"  # "fp32": no autocast around the step
        if mode != "off":
            torch._dynamo.reset()  # each compiled variant compiles from scratch (first_step_s), its own graphs
        compile_layers(model, mode, backend=backend)
        for layout, lens, batch in batches:
            m = _measure(model, batch, device, step_precision, reps)
            tokens = sum(lens)
            rows.append({"variant": variant, "compile": mode, "weights": weights, "layout": layout,
                         "tokens": tokens, "docs": len(lens), **m,
                         "tokens_per_s": tokens / (m["wall_ms"] / 1e3) if m["wall_ms"] > 0 else float("nan")})
            if progress is not None:
                progress(rows[-1])
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows


def print_short(rows: list[dict]) -> None:
    print(f"{'variant':<11} {'weights':<12} {'layout':<7} {'tokens':>6} {'wall_ms':>8} {'tok/s':>10} {'busy':>6} "
          f"{'host_ms':>8} {'gpu_ms':>8} {'first_s':>8}")
    for r in rows:
        def f(x: Any, spec: str) -> str:
            return "-" if x is None or x != x else format(x, spec)

        print(f"{r['variant']:<11} {r['weights']:<12} {r['layout']:<7} {r['tokens']:>6} {r['wall_ms']:>8.2f} "
              f"{r['tokens_per_s']:>10.0f} {f(r['busy'], '.3f'):>6} {f(r['host_ms'], '.2f'):>8} "
              f"{f(r['gpu_ms'], '.2f'):>8} {r['first_step_s']:>8.2f}")


def best_busy(rows: list[dict], tokens: int) -> dict[str, float]:
    """Busy share of the 1-sample micro-batch of ``tokens`` tokens per variant (name/weights)."""
    return {f"{r['variant']}/{r['weights']}": round(r["busy"], 3) for r in rows
            if r["tokens"] == tokens and r["layout"] == "row" and r["busy"] is not None}

