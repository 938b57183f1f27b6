"""Static shapes under torch.compile(dynamic=False): every graph is built during the warm-up steps."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dcp.loaders import StaticShapeConfig, plan_static_shapes


class CountingBackend:
    """A torch.compile backend that records the step at which each graph is built, then runs it eagerly."""

    def __init__(self) -> None:
        self.step = 0
        self.compiled_at: list[int] = []

    def __call__(self, gm, example_inputs):
        self.compiled_at.append(self.step)
        return gm.forward


@pytest.mark.slow
def test_every_rank_compiles_all_shapes_in_the_warmup_and_never_after():
    lengths = np.random.default_rng(0).integers(1, 200, 300).tolist()
    plan = plan_static_shapes(lengths, StaticShapeConfig(max_shapes=4, max_tokens_per_batch=1024), world_size=2)
    for rank in range(2):
        torch._dynamo.reset()
        backend = CountingBackend()
        model = torch.compile(torch.nn.Linear(4, 4), backend=backend, dynamic=False)
        for k, batch in enumerate(plan.for_rank(rank)):
            backend.step = k
            model(torch.zeros(batch.rows, batch.padded_len, 4))
        assert backend.compiled_at == list(range(plan.warmup_steps)) and len(plan.shapes) == plan.warmup_steps
        assert len(plan.steps) > 3 * plan.warmup_steps  # the rest of the epoch ran on cached graphs
