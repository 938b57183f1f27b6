"""``dcp bench gpu --only cp``: the context-parallel attention kernels on one device against one call's attention.

Context parallelism runs each context rank's queries over the all-gathered K/V of the whole sequence
(``dcp.runtime.context_parallel``). One GPU cannot hold an NCCL group of several ranks, so this check runs
every context rank's part in one process: K/V are the whole sequence's (what the all-gather returns; the
all-gather itself is tested over gloo in ``tests/dist``), each rank's queries are its two balanced chunks,
and ``attend_gathered`` runs the kernels the runtime runs (one SDPA call per chunk and document under a
lower-right causal bias). The ranks' outputs put back in position order must
equal the reference, and the gradients summed over the ranks (what the all-gather's reduce-scatter makes of
them) must equal the reference's.

Reference: one causal SDPA call per document over the whole sequence, in the same precision. The error of
each side is taken against the same computation in fp32, so "equal" means: the CP path's error is at most
``ERROR_SLACK`` times the reference's own rounding error (plus a floor for exact-zero cases).

Time: each context rank's forward + backward (median of ``reps``, the host clock between device syncs), the
slowest rank being the layer's attention time at c ranks; against the analytic model's attention time of one
rank (``dcp.planner.analytic.attention_time_s`` at SP size c over ``context_attention_efficiency``, on
``dcp.sim.hardware.H200``) and against the one call's time over c (perfect balance).
"""

from __future__ import annotations

from typing import Any

CP_CASES = (
    # (tokens, context ranks, query heads, K/V heads, head dim, documents per row)
    (32768, 4, 32, 8, 128, 1),
    (65536, 8, 32, 8, 128, 1),
    (131072, 8, 32, 8, 128, 1),
    (16384, 4, 32, 8, 128, 4),
)
"""An 8B GQA layer's heads (32 query, 8 K/V, 128 wide): one long document a row at 32k-128k tokens, and a row
of four packed documents (calls per document across the chunk edges)."""
TINY_CASES = ((256, 2, 4, 2, 16, 1), (256, 4, 4, 2, 16, 3))
ERROR_SLACK = 2.0
"""The CP path may round up to this many times as far from fp32 as the reference does."""


def _doc_lens(tokens: int, docs: int) -> tuple[int, ...]:
    """``docs`` unequal documents filling ``tokens`` (the first the longest)."""
    if docs == 1:
        return (tokens,)
    weights = list(range(docs, 0, -1))
    lens = [tokens * w // sum(weights) for w in weights]
    lens[0] += tokens - sum(lens)
    return tuple(lens)


def _reference(q: Any, k: Any, v: Any, lens: tuple[int, ...]) -> Any:
    import torch
    import torch.nn.functional as F

    if q.dtype == torch.float32 and q.shape[2] != k.shape[2]:  # fp32 has no fused GQA kernel: expand the heads
        k, v = (t.repeat_interleave(q.shape[2] // k.shape[2], dim=2) for t in (k, v))
    outs, start = [], 0
    for n in lens:
        sl = slice(start, start + n)
        o = F.scaled_dot_product_attention(q[:, sl].transpose(1, 2), k[:, sl].transpose(1, 2),
                                           v[:, sl].transpose(1, 2), is_causal=True,
                                           enable_gqa=q.shape[2] != k.shape[2])
        outs.append(o.transpose(1, 2))
        start += n
    return torch.cat(outs, dim=1)


def _rank_attention(q: Any, k: Any, v: Any, lens: tuple[int, ...], context: int, rank: int) -> tuple[Any, Any]:
    """(the rank's chunk ranges, its output of ``attend_gathered`` over the whole sequence's K/V)."""
    from dcp.runtime.context import balanced_chunks
    from dcp.runtime.context_parallel import attend_gathered, take_shard

    ranges = balanced_chunks(q.shape[1], context, rank)
    return ranges, attend_gathered(take_shard(q, ranges), k, v, context=context, context_rank=rank, causal=True,
                                   doc_lens=(lens,))


def _context_parallel(q: Any, k: Any, v: Any, lens: tuple[int, ...], context: int) -> Any:
    """Every context rank's output of ``attend_gathered``, scattered back into position order."""
    import torch

    out = torch.zeros_like(q)
    for rank in range(context):
        ranges, part = _rank_attention(q, k, v, lens, context, rank)
        half = part.shape[1] // 2
        for (a, e), piece in zip(ranges, (part[:, :half], part[:, half:]), strict=True):
            out[:, a:e] = piece
    return out


def _forward_backward(fn: Any, q: Any, k: Any, v: Any, grad: Any) -> tuple[Any, ...]:
    import torch

    q, k, v = (t.detach().requires_grad_(True) for t in (q, k, v))
    out = fn(q, k, v)
    gq, gk, gv = torch.autograd.grad(out, (q, k, v), grad)
    return out.detach(), gq, gk, gv


def _max_err(got: tuple[Any, ...], exact: tuple[Any, ...]) -> float:
    """Largest abs difference over output and gradients, each relative to the exact tensor's largest magnitude."""
    return max(float((g.float() - e).abs().max()) / max(float(e.abs().max()), 1e-30) for g, e in zip(got, exact,
                                                                                                     strict=True))


def cp_case(tokens: int, context: int, heads: int, kv_heads: int, head_dim: int, docs: int, device: Any,
            dtype: Any, reps: int) -> dict:
    """One case's errors (CP path and reference, each against fp32) and times (see the module docstring)."""
    import torch

    from dcp.config import ModelShapeConfig
    from dcp.planner.analytic import attention_time_s
    from dcp.profiler.update import median_time
    from dcp.runtime.context_parallel import take_shard
    from dcp.sim.hardware import H200

    gen = torch.Generator(device="cpu").manual_seed(tokens + context)
    q, k, v = (torch.randn(1, tokens, h, head_dim, generator=gen).to(device) for h in (heads, kv_heads, kv_heads))
    grad = torch.randn(1, tokens, heads, head_dim, generator=gen).to(device)
    lens = _doc_lens(tokens, docs)
    exact = _forward_backward(lambda *t: _reference(*t, lens), q, k, v, grad)
    low = [t.to(dtype) for t in (q, k, v, grad)]
    ref_err = _max_err(_forward_backward(lambda *t: _reference(*t, lens), *low), exact)
    cp_err = _max_err(_forward_backward(lambda *t: _context_parallel(*t, lens, context), *low), exact)
    del exact

    qd, kd, vd, gd = (t.detach().requires_grad_(t is not low[3]) for t in low)

    def rank_step(rank: int) -> None:
        ranges, out = _rank_attention(qd, kd, vd, lens, context, rank)
        torch.autograd.grad(out, (qd, kd, vd), take_shard(gd, ranges))

    def whole_step() -> None:
        torch.autograd.grad(_reference(qd, kd, vd, lens), (qd, kd, vd), gd)

    rank_s = [median_time(lambda r=r: rank_step(r), reps, device) for r in range(context)]
    whole_s = median_time(whole_step, reps, device)
    shape = ModelShapeConfig(name="cp-check", num_layers=1, hidden_size=heads * head_dim, num_heads=heads,
                             num_kv_heads=kv_heads, vocab_size=1)
    # the model prices one row of ``tokens`` as one sequence; packed rows it prices the same (an upper bound).
    # All heads on each of the c ranks (u = 1): the context axis's rate, whatever layout the planner would pick
    model_s = sum(attention_time_s(shape, tokens, 1, context, H200)) / (
        H200.context_attention_efficiency if context > 1 else 1.0)
    slowest = max(rank_s)
    return {"tokens": tokens, "context": context, "heads": heads, "kv_heads": kv_heads, "head_dim": head_dim,
            "docs": docs, "ref_err": ref_err, "cp_err": cp_err,
            "equal": cp_err <= ERROR_SLACK * ref_err + 1e-6, "rank_ms": [round(t * 1e3, 3) for t in rank_s],
            "slowest_rank_ms": slowest * 1e3, "whole_ms": whole_s * 1e3, "balance": whole_s / context / slowest,
            "model_ms": model_s * 1e3, "model_err_pct": abs(model_s - slowest) / slowest * 100.0}


def run_cp(device: Any, precision: str, reps: int, tiny: bool) -> list[dict]:
    """Every case of ``CP_CASES`` (``TINY_CASES`` on the hidden CPU path)."""
    import torch

    from dcp.distributed import compute_dtype

    rows = []
    for case in TINY_CASES if tiny else CP_CASES:
        try:
            rows.append(cp_case(*case, device=device, dtype=compute_dtype(precision), reps=reps))
        except (torch.OutOfMemoryError, RuntimeError) as exc:  # a case that fails is a result, with its cause
            rows.append({"tokens": case[0], "context": case[1], "docs": case[5], "equal": False,
                         "error": str(exc).strip().splitlines()[0][:300]})
        if device.type == "cuda":
            torch.cuda.empty_cache()
        print(f"[cp] {rows[-1]}", flush=True)
    return rows


def print_cp(rows: list[dict]) -> None:
    print(f"{'tokens':>7} {'c':>2} {'docs':>4} {'ref err':>9} {'cp err':>9} {'equal':>5} {'slowest ms':>10} "
          f"{'whole/c ms':>10} {'balance':>7} {'model ms':>9} {'model err %':>11}")
    for r in rows:
        if "error" in r:
            print(f"{r['tokens']:>7} {r['context']:>2} {r['docs']:>4} failed: {r['error']}")
            continue
        print(f"{r['tokens']:>7} {r['context']:>2} {r['docs']:>4} {r['ref_err']:>9.2e} {r['cp_err']:>9.2e} "
              f"{str(r['equal']):>5} {r['slowest_rank_ms']:>10.2f} {r['whole_ms'] / r['context']:>10.2f} "
              f"{r['balance']:>7.3f} {r['model_ms']:>9.2f} {r['model_err_pct']:>11.1f}")
