"""One-process checks of the runtime primitives: sharding helpers, SPContext, local attention, recompute,
the registry's block layout, and the error paths of Ulysses that need no process group."""

from __future__ import annotations

import logging

import pytest
import torch

from dcp.planner.plan import GroupPlan
from dcp.runtime.attention import flash_attn_module, local_attention, resolve_backend
from dcp.runtime.context import SPContext, SPContextError, pad_to_multiple, shard_range
from dcp.runtime.recompute import checkpoint_layer
from dcp.runtime.registry import SPGroupRegistry, UnknownSPGroupError, sp_blocks
from dcp.runtime.ulysses import all_to_all_sp, check_heads, ulysses_attention


def test_pad_and_shard_cover_the_sequence_in_rank_order():
    assert [pad_to_multiple(n, 4) for n in (0, 1, 4, 5, 8)] == [0, 4, 4, 8, 8]
    padded = pad_to_multiple(13, 3)
    ranges = [shard_range(padded, 3, r) for r in range(3)]
    assert ranges == [(0, 5), (5, 10), (10, 15)]


@pytest.mark.parametrize(
    ("call", "words"),
    [
        (lambda: pad_to_multiple(5, 0), "sp_size (0)"),
        (lambda: pad_to_multiple(-1, 2), "length (-1)"),
        (lambda: shard_range(10, 0, 0), "sp_size (0)"),
        (lambda: shard_range(10, 4, 0), "padded_len (10)"),
        (lambda: shard_range(8, 4, 4), "sp_rank (4)"),
        (lambda: SPContext(sp_size=0), "SPContext.sp_size (0)"),
        (lambda: SPContext(sp_size=2, sp_rank=2, group=object()), "SPContext.sp_rank (2)"),
        (lambda: SPContext(sp_size=2), "SPContext.group (None)"),
        (lambda: SPContext(recompute_layers=-1), "SPContext.recompute_layers (-1)"),
        (lambda: SPContext(attention="xformers"), "SPContext.attention ('xformers')"),
    ],
)
def test_context_and_sharding_errors_name_the_field(call, words):
    with pytest.raises(SPContextError, match=r".*:") as exc:
        call()
    assert words in str(exc.value)


def test_context_single_and_replace():
    ctx = SPContext.single(recompute_layers=3)
    assert (ctx.sp_size, ctx.sp_rank, ctx.group, ctx.recompute_layers) == (1, 0, None, 3)
    assert ctx.replace(recompute_layers=0).recompute_layers == 0
    assert ctx.shard(7) == (0, 7) and ctx.padded_len(7) == 7


def _reference_attention(q, k, v, lens, causal):
    """Per sample, on the unpadded tokens only: the simplest correct attention."""
    out = torch.zeros_like(q)
    for i, n in enumerate(lens):
        qi, ki, vi = (t[i, :n].transpose(0, 1) for t in (q, k, v))  # [h, n, d]
        scores = qi @ ki.transpose(-1, -2) / q.shape[-1] ** 0.5
        if causal:
            scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
        out[i, :n] = (scores.softmax(-1) @ vi).transpose(0, 1)
    return out


@pytest.mark.parametrize("causal", [True, False])
def test_sdpa_masks_padded_keys_and_zeroes_padded_queries(causal):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(3, 7, 2, 4, generator=g) for _ in range(3))
    lens = [7, 3, 5]
    mask = torch.arange(7)[None, :] < torch.tensor(lens)[:, None]
    out = local_attention(q, k, v, causal=causal, key_padding_mask=mask, backend="sdpa")
    torch.testing.assert_close(out, _reference_attention(q, k, v, lens, causal))
    full = local_attention(q, k, v, causal=causal, key_padding_mask=torch.ones_like(mask), backend="auto")
    torch.testing.assert_close(full, _reference_attention(q, k, v, [7, 7, 7], causal))


def test_attention_errors():
    q = torch.zeros(1, 4, 2, 4)
    with pytest.raises(ValueError, match=r"q, k, v shapes"):
        local_attention(q, q[:, :3], q, causal=False, backend="sdpa")
    with pytest.raises(ValueError, match=r"key_padding_mask shape"):
        local_attention(q, q, q, causal=False, key_padding_mask=torch.ones(1, 3, dtype=torch.bool), backend="sdpa")
    with pytest.raises(ValueError, match=r"attention backend \('nope'\)"):
        resolve_backend("nope", q)
    with pytest.raises(ValueError, match=r"needs CUDA fp16/bf16"):
        resolve_backend("flash", q)
    assert resolve_backend("auto", q) == "sdpa"


def test_missing_flash_attn_is_logged_once(caplog):
    flash_attn_module.cache_clear()
    with caplog.at_level(logging.INFO, logger="dcp"):
        if flash_attn_module() is not None:
            pytest.skip("flash-attn is installed")
        flash_attn_module()
    assert sum("flash-attn is not installed" in r.message for r in caplog.records) == 1


def test_checkpoint_layer_matches_plain_call_and_saves_less():
    layer = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.GELU(), torch.nn.Linear(32, 8))
    x = torch.randn(4, 8, requires_grad=True)
    grads = []
    saved = []
    for enabled in (False, True):
        count = [0]

        def pack(t, count=count):
            count[0] += 1
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            y = checkpoint_layer(layer, x, enabled=enabled)
        saved.append(count[0])
        grads.append(torch.autograd.grad(y.square().sum(), (x, *layer.parameters())))
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b)
    assert saved[1] < saved[0]


def test_sp_blocks_layout():
    # W = 6 with 4 ranks per node: the second node is partial (ranks 4, 5)
    assert sp_blocks(6, 4, [1, 2, 4, 8]) == (
        [(r, 1) for r in range(6)] + [(0, 2), (2, 2), (4, 2), (0, 4)]
    )
    # sizes above a node: multiples of p that end inside the world
    assert [b for b in sp_blocks(16, 4, [8, 16]) if b[1] > 4] == [(0, 8), (8, 8), (0, 16)]
    # a size that divides nothing (3 with 4 ranks per node) still gets its in-node blocks; size 1 is
    # always there (idle ranks and p = 1 groups get a one-rank group)
    assert sp_blocks(8, 4, [3]) == [(r, 1) for r in range(8)] + [(0, 3), (4, 3)]
    with pytest.raises(ValueError, match=r"world_size \(0\)"):
        sp_blocks(0, 4, [1])
    with pytest.raises(ValueError, match=r"ranks_per_node \(0\)"):
        sp_blocks(4, 0, [1])
    with pytest.raises(ValueError, match=r"sp_sizes \(\[0\]\)"):
        sp_blocks(4, 4, [0])


def test_registry_without_process_group_for_sp_size_one():
    reg = SPGroupRegistry(3, 8, [1])
    assert reg.get(2, 1) is None and reg.blocks == [(0, 1), (1, 1), (2, 1)]
    ctx = reg.context(GroupPlan(first_rank=1, sp_size=1, recompute_layers=2, micro_batches=()), 1, "sdpa")
    assert (ctx.sp_size, ctx.sp_rank, ctx.recompute_layers, ctx.attention) == (1, 0, 2, "sdpa")
    with pytest.raises(UnknownSPGroupError, match=r"first_rank=0, sp_size=2.*valid first ranks"):
        reg.get(0, 2)
    with pytest.raises(KeyError):
        reg.get(5, 1)
    with pytest.raises(ValueError, match=r"rank \(0\) is not in the GroupPlan"):
        reg.context(GroupPlan(first_rank=1, sp_size=1, recompute_layers=0, micro_batches=()), 0)
    with pytest.raises(ValueError, match=r"torch.distributed is not initialised"):
        SPGroupRegistry(4, 4, [1, 2])


def test_ulysses_single_process_and_errors():
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 5, 4, 8, generator=g) for _ in range(3))
    ctx = SPContext.single(attention="sdpa")
    torch.testing.assert_close(
        ulysses_attention(q, k, v, ctx, causal=True), local_attention(q, k, v, causal=True, backend="sdpa")
    )
    assert all_to_all_sp(q, None, 2, 1) is q
    with pytest.raises(ValueError, match=r"sp_size \(3\) does not divide the number of attention heads \(4\)"):
        check_heads(4, 3)
    with pytest.raises(ValueError, match=r"ulysses impl \('megatron'\)"):
        ulysses_attention(q, k, v, ctx, causal=True, impl="megatron")
    with pytest.raises(ValueError, match=r"key_padding_mask length \(4\)"):
        ulysses_attention(q, k, v, ctx, causal=True, key_padding_mask=torch.ones(2, 4, dtype=torch.bool))


def _fake_flash_module():
    """A stand-in for flash_attn built on the reference attention, to check our unpad/varlen plumbing on CPU."""
    import types

    def varlen(q, k, v, cu_q, cu_k, max_q, max_k, causal=False):
        assert torch.equal(cu_q, cu_k) and cu_q.dtype == torch.int32 and int(cu_q[-1]) == q.shape[0]
        out = torch.empty_like(q)
        for a, b in zip(cu_q[:-1].tolist(), cu_q[1:].tolist(), strict=True):
            seg = [t[a:b][None] for t in (q, k, v)]
            out[a:b] = _reference_attention(*seg, [b - a], causal)[0]
        assert max_q == max(int(x) for x in (cu_q[1:] - cu_q[:-1]))
        return out

    def dense(q, k, v, causal=False):
        return _reference_attention(q, k, v, [q.shape[1]] * q.shape[0], causal)

    return types.SimpleNamespace(flash_attn_func=dense, flash_attn_varlen_func=varlen)


@pytest.mark.parametrize("causal", [True, False])
def test_flash_path_unpads_and_repads_like_sdpa(monkeypatch, causal):
    from dcp.runtime import attention

    monkeypatch.setitem(__import__("sys").modules, "flash_attn", _fake_flash_module())
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(3, 9, 2, 4, generator=g) for _ in range(3))
    docs = ((9,), (2,), (6,))
    mask = torch.arange(9)[None, :] < torch.tensor([9, 2, 6])[:, None]
    flash = attention._flash_varlen(q, k, v, causal=causal, docs=docs)
    torch.testing.assert_close(flash, attention._sdpa_masked(q, k, v, causal=causal, key_padding_mask=mask))
    packed = ((4, 3, 2), (), (6,))  # several documents in a row, a row of padding only
    torch.testing.assert_close(attention._flash_varlen(q, k, v, causal=causal, docs=packed),
                               local_attention(q, k, v, causal=causal, doc_lens=packed, backend="sdpa"))
    torch.testing.assert_close(attention._flash_dense(q, k, v, causal), attention._sdpa_dense(q, k, v, causal))
    assert attention._flash_varlen(q, k, v, causal=causal, docs=((), (), ())).abs().max() == 0
