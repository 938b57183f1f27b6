"""gloo children get DeepSpeed's CPU accelerator by default (so a CPU test never asks for cuda:<rank> on a
host with GPUs); an explicit env entry wins (the GPU tests pass DS_ACCELERATOR=cuda)."""

from __future__ import annotations

import os

import pytest

from dcp.distributed.launch import run_distributed

pytestmark = pytest.mark.dist


def _accelerator(rank: int, world: int) -> str | None:
    return os.environ.get("DS_ACCELERATOR")


def test_gloo_children_default_to_the_cpu_accelerator(monkeypatch):
    monkeypatch.delenv("DS_ACCELERATOR", raising=False)  # tests/conftest.py sets it for this process
    assert run_distributed(_accelerator, 1) == ["cpu"]
    assert run_distributed(_accelerator, 1, env={"DS_ACCELERATOR": "cuda"}) == ["cuda"]
