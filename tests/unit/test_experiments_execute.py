"""Executor helpers: packed micro-batches run sample by sample without padding; predicted peak memory."""

from __future__ import annotations

import torch

from dcp.data import collate_tokens, collate_video
from dcp.experiments.execute import packed_forward, predicted_peak, split_samples
from dcp.planner.plan import GroupPlan, MicroBatch, StepPlan
from dcp.planner.table import ProfileRow, ProfileTable, TableMeta


def test_split_samples_cuts_each_sample_to_its_length():
    batch = collate_tokens([torch.arange(1, 4), torch.arange(1, 6)], sample_ids=(7, 9))
    parts = split_samples(batch)
    assert [p.inputs.shape for p in parts] == [torch.Size([1, 3]), torch.Size([1, 5])]
    assert [p.sample_ids for p in parts] == [(7,), (9,)]
    torch.testing.assert_close(parts[0].targets, batch.targets[:1, :3])


def test_split_samples_video_keeps_shapes():
    x = [(torch.randn(2, 3, 4), torch.randn(2, 3, 4)), (torch.randn(4, 5, 4), torch.randn(4, 5, 4))]
    parts = split_samples(collate_video(x))
    assert [p.shapes for p in parts] == [((2, 3),), ((4, 5),)]
    torch.testing.assert_close(parts[0].inputs[0], x[0][0])


class _Count(torch.nn.Module):
    """(sum of token ids, number of token positions) of the batch it sees: exposes padding."""

    def forward(self, batch, ctx):
        return batch.inputs.sum().float(), batch.inputs.numel()


def test_packed_forward_sums_unpadded_samples():
    # 2D packs run sample by sample: padded positions never count
    video = collate_video([(torch.full((1, 3, 1), 2.0), torch.zeros(1, 3, 1)),
                           (torch.full((2, 1, 1), 1.0), torch.zeros(2, 1, 1))])
    loss, count = packed_forward(_Count(), video, None)
    assert float(loss) == 3 * 2 + 2 * 1 and count == 5  # padded would count 2 x 2 x 3 = 12 positions
    # 1D packs go to the model whole: Transformer-1D runs them as one row of documents
    batch = collate_tokens([torch.full((3,), 2), torch.full((5,), 1)])
    seen = []
    packed_forward(type("M", (), {"__call__": lambda self, b, ctx: seen.append(b) or (0, 0)})(), batch, None)
    assert seen == [batch]


def _row(b: int, m_act: float) -> ProfileRow:
    return ProfileRow(seq_group=0, seq_len=128, micro_batch_size=b, sp_size=1, t_f_s=0.1, t_b_s=0.2,
                      m_act_bytes=m_act, m_inp_bytes=1.0, t_const_s=0.0, m_const_bytes=10.0, num_layers=2)


def test_predicted_peak_uses_smallest_profiled_b_that_covers_the_micro_batch():
    table = ProfileTable([_row(1, 100.0), _row(4, 400.0)], TableMeta(model="m", hardware="cpu", dtype="float32",
                                                                    world_size=1, seq_group_edges=(128,)))
    mb = MicroBatch((0, 1), (100, 120), 0, 1.0)
    plan = StepPlan(epoch=0, step=0, world_size=1, method="dcp-intra",
                    groups=(GroupPlan(first_rank=0, sp_size=1, recompute_layers=1, micro_batches=(mb,)),))
    # b = 2 is covered by the b = 4 row; Eq. 6 with r = 1 of L = 2: (2 - 1) * 400 + 2 * 1 + 10
    assert predicted_peak([plan], table) == 412.0


def test_replay_peak_meters_what_the_timed_steps_ran_and_drops_gradients():
    """CPU runs are metered in an untimed replay: it sees the same peak as metering every micro-batch inline."""
    from dcp.experiments.execute import Meter, _plain_forward, replay_peak
    from dcp.models import build_model
    from dcp.runtime.data import SyntheticTokenDataset
    from dcp.runtime.registry import SPGroupRegistry

    model = build_model("t1d-tiny")
    params = [p for p in model.parameters()]
    data = SyntheticTokenDataset([40, 90, 60, 200], vocab_size=model.config.vocab_size, seed=0)
    mbs = (MicroBatch((0, 1), (40, 90), 0), MicroBatch((3,), (200,), 1))
    plan = StepPlan(0, 0, 1, "dcp-intra", (GroupPlan(0, 1, 2, mbs),))
    registry = SPGroupRegistry(1, 1, [1])
    ctx = registry.context(plan.groups[0], 0, "sdpa")
    inline = 0.0
    for mb in mbs:
        with Meter(torch.device("cpu"), params) as meter:
            loss, _ = model(data.collate([data[i] for i in mb.sample_ids]), ctx)
            loss.backward()
        inline = max(inline, meter.peak())
    model.zero_grad(set_to_none=True)
    got = replay_peak([plan], 0, registry, model, data, "sdpa", _plain_forward, torch.device("cpu"), params)
    assert got == inline > 0
    assert all(p.grad is None for p in params)
