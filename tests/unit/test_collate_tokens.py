"""collate_tokens: the row-by-row path and the one-call padding of larger micro-batches build the same batch as
the plain definition (right-pad with 0; targets the next token, -100 from each sample's last token on)."""

from __future__ import annotations

import pytest
import torch

from dcp.data.batch import IGNORE_INDEX, ROW_COPY_MAX_SAMPLES, collate_tokens


def _reference(samples):
    m = max(len(s) for s in samples)
    inputs = [[int(t) for t in s] + [0] * (m - len(s)) for s in samples]
    targets = [[int(t) for t in s[1:]] + [IGNORE_INDEX] * (m - len(s) + 1) for s in samples]
    return torch.tensor(inputs, dtype=torch.long), torch.tensor(targets, dtype=torch.long)


@pytest.mark.parametrize("b", [1, 3, ROW_COPY_MAX_SAMPLES, ROW_COPY_MAX_SAMPLES + 1, 40])
@pytest.mark.parametrize("dtype", [torch.long, torch.int32])
def test_both_paths_build_the_plain_batch(b, dtype):
    gen = torch.Generator().manual_seed(b)
    lens = torch.randint(1, 30, (b,), generator=gen).tolist()
    lens[0] = 1  # a one-token sample: no target at all
    samples = [torch.randint(1, 1000, (n,), generator=gen, dtype=dtype) for n in lens]
    batch = collate_tokens(samples, list(range(100, 100 + b)))
    inputs, targets = _reference(samples)
    assert batch.inputs.dtype == batch.targets.dtype == torch.long
    assert torch.equal(batch.inputs, inputs) and torch.equal(batch.targets, targets)
    assert batch.seq_lens == tuple(lens) and batch.sample_ids == tuple(range(100, 100 + b))
    assert all(s.dtype == dtype for s in samples)  # the dataset's tensors are not changed
