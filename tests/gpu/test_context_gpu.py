"""CUDA check (skipped without a GPU): every context rank's attention kernels in bf16 (SDPA, lower-right causal,
one call per chunk and document, K/V unexpanded) against one call over the sequence, each side against fp32,
as ``dcp bench gpu --only cp`` measures them; documents one a row and packed across chunk edges."""

from __future__ import annotations

import pytest
import torch

from dcp.bench.gpu_cp import ERROR_SLACK, cp_case

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


@pytest.mark.parametrize("tokens,context,docs", [(4096, 2, 1), (4096, 4, 1), (4096, 4, 5), (8192, 8, 3)])
def test_context_ranks_equal_one_call_in_bf16(tokens, context, docs):
    row = cp_case(tokens, context, 32, 8, 128, docs, device=torch.device("cuda"), dtype=torch.bfloat16, reps=1)
    assert row["equal"], (f"context ranks off fp32 by {row['cp_err']:.2e}, one call by {row['ref_err']:.2e} "
                          f"(allowed {ERROR_SLACK} x)")
    assert 0 < row["ref_err"] < 0.05
