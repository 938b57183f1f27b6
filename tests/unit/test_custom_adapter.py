"""A model of the user's own, driven through ``forward_fn=`` and profiled through ``adapter=`` (a ModelAdapter
subclass): set_manager uses the adapter wherever it looks at the model for profiling."""

from __future__ import annotations

import torch
from torch import nn

from dcp.api import set_manager
from dcp.config import DCPConfig, ModelShapeConfig, PlanningConfig, ProfilingConfig
from dcp.data import IGNORE_INDEX, collate_tokens
from dcp.profiler.adapters import ModelAdapter
from dcp.runtime.data import sample_generator

VOCAB = 31


class _Data:
    def __init__(self, lens: list[int]) -> None:
        self.lens = lens

    def __len__(self) -> int:
        return len(self.lens)

    def __getitem__(self, i: int):
        return i, torch.randint(0, VOCAB, (self.lens[i],), generator=sample_generator(0, 0, i))

    def lengths(self) -> list[int]:
        return self.lens

    def target_counts(self) -> list[int]:
        return [n - 1 for n in self.lens]  # collate_tokens labels every token but the last

    def collate(self, samples):
        return collate_tokens([t for _, t in samples], [i for i, _ in samples])


class _Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.norm, self.ff = nn.LayerNorm(d), nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.ff(self.norm(x))


class _LM(nn.Module):
    """No profiler protocol (no synthetic_batch / layer_inputs / ...), no Llama layout."""

    def __init__(self, d: int = 16, layers: int = 2) -> None:
        super().__init__()
        self.emb, self.head = nn.Embedding(VOCAB, d), nn.Linear(d, VOCAB)
        self.blocks = nn.ModuleList(_Block(d) for _ in range(layers))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.emb(ids)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def _loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE_INDEX,
                                       reduction="sum")


class _Adapter(ModelAdapter):
    def __init__(self, module: _LM) -> None:
        self.module, self.name = module, "own-lm"

    @property
    def num_layers(self) -> int:
        return len(self.module.blocks)

    @property
    def num_heads(self) -> int:
        return 1

    def synthetic_batch(self, batch_size: int, seq_len: int, *, generator: torch.Generator):
        return collate_tokens([torch.randint(0, VOCAB, (seq_len,), generator=generator) for _ in range(batch_size)])

    def layer_inputs(self, batch, ctx):
        return self.module.emb(batch.inputs), None

    def run_layer(self, i, hidden, aux, ctx):
        return self.module.blocks[i](hidden)

    def head_loss(self, hidden, batch, ctx, aux):
        return _loss(self.module.head(hidden), batch.targets), (batch.targets != IGNORE_INDEX).sum()


def _forward(model, batch, ctx):
    return _loss(model(batch.inputs), batch.targets), (batch.targets != IGNORE_INDEX).sum()


def test_a_custom_model_with_its_own_adapter_and_default_profiling_trains_an_epoch(tmp_path):
    """The default profiling settings are fitted to the data and the cache is looked up before profiling:
    that lookup went to the model (no protocol: AdapterError naming profile_table) instead of the adapter."""
    torch.manual_seed(0)
    model, data = _LM(), _Data([20, 35, 64, 100, 12, 50, 80, 128])
    config = DCPConfig(model=ModelShapeConfig(num_layers=2, hidden_size=16, num_heads=1, vocab_size=VOCAB),
                       planning=PlanningConfig(sp_sizes=(1,)), profiling=ProfilingConfig(cache_dir=str(tmp_path)))
    mgr = set_manager(model, data, config, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                      forward_fn=_forward, adapter=_Adapter(model))
    seen = []
    for batch in mgr.get_data_iter():
        seen += batch.sample_ids
        mgr.train_micro_batch(batch)
    assert sorted(seen) == list(range(len(data))) and mgr.epoch == 1
