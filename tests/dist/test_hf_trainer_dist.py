"""DCPTrainer on 2 gloo processes: the example's DCP twin trains a tiny Llama with SP 2 forced by the emulated
memory, its losses logged through Trainer, in the plain Trainer's optimizer steps (within the rule of
tests/unit/test_hf_trainer.py)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

from dcp.distributed.launch import run_distributed

pytestmark = pytest.mark.dist
pytest.importorskip("transformers")
pytest.importorskip("datasets")
pytest.importorskip("accelerate")
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _twins(rank: int, world: int, out: str) -> tuple[list[dict], list[dict], list[str]]:
    sys.path.insert(0, str(EXAMPLES))
    import hf_trainer
    import hf_trainer_plain

    import dcp
    from dcp.config import PlanningConfig, ProfilingConfig

    config = dcp.DCPConfig(profiling=ProfilingConfig(seq_group_edges=(128, 256, 512), max_micro_batch_size=4),
                           planning=PlanningConfig(sp_sizes=(1, 2), mem_capacity_gib=0.005))  # a 512-token sample needs SP 2
    dcp_history = hf_trainer.train(rank, world, f"{out}/dcp", 16, 512, config=config)
    plain_history = hf_trainer_plain.train(rank, world, f"{out}/plain", 16, 512)
    return dcp_history, plain_history


def test_the_dcp_twin_trains_on_two_ranks_with_sp2_in_the_plain_trainers_steps(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the profile table is cached in ./.dcp_cache
    dcp_history, plain_history = run_distributed(_twins, 2, str(tmp_path), timeout_s=300)[0]
    dcp_losses = [h["loss"] for h in dcp_history if "loss" in h]
    plain_losses = [h["loss"] for h in plain_history if "loss" in h]
    assert dcp_losses and all(math.isfinite(x) for x in dcp_losses)
    assert any("sp=[2]" in h["dcp_groups"] for h in dcp_history if "dcp_groups" in h)  # one group over both ranks
    assert abs(len(dcp_losses) - len(plain_losses)) <= 1 + 0.1 * len(plain_losses)
