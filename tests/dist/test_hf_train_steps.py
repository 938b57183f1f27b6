"""The ten-line Hugging Face path (examples/hf_train.py) states the plain loop's global batch in its one config line
(``planning.samples_per_step`` = ``batch_size`` 4 x the ranks) and so trains as many optimizer steps as its plain
twin (examples/hf_train_plain.py) on the same data: 2 gloo processes, 32 samples of at most 128 tokens."""

from __future__ import annotations

import pytest
from tests.dist.test_hf_archs import example

from dcp.distributed.launch import run_distributed

pytestmark = pytest.mark.dist
pytest.importorskip("transformers")
pytest.importorskip("datasets")

SAMPLES, MAX_LEN = 32, 128


def _twins(rank: int, world: int) -> tuple[int, int]:
    plain = example("hf_train_plain").train(rank, world, "llama", 1, SAMPLES, MAX_LEN)
    dcp_losses = example("hf_train").train(rank, world, "llama", 1, SAMPLES, MAX_LEN)
    return len(plain), len(dcp_losses)


def test_the_dcp_twin_trains_the_plain_loops_optimizer_steps(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the DCP twin caches its profile table in ./.dcp_cache
    plain_steps, dcp_steps = run_distributed(_twins, 2, timeout_s=300)[0]
    assert plain_steps == SAMPLES // (4 * 2)  # DistributedSampler: 16 samples a rank in batches of 4
    assert dcp_steps == plain_steps
