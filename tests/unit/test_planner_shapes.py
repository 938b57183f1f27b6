"""2D data: with per-sample (frames, spatial) shapes every micro-batch holds one shape, so nothing is padded."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dcp.planner import EpochPlanner, PlanningError
from dcp.planner.stream import (
    MicroBatchQueues,
    TimeLookup,
    check_shapes,
    micro_batch_times,
    seq_groups_of,
    shuffled_order,
)
from tests.unit.test_planner_assemble import EDGES, make

FRAMES = (4, 8, 12, 16, 20, 32)
SPATIAL = (9, 16, 36, 64, 100)


def video_shapes(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.stack([rng.choice(FRAMES, n), rng.choice(SPATIAL, n)], axis=1)


def queues(shapes: np.ndarray, b: int, seed: int = 0, edges=EDGES):
    lengths = shapes[:, 0] * shapes[:, 1]
    groups = np.searchsorted(np.asarray(edges), lengths, side="left")
    order = shuffled_order(len(lengths), seed, 0)
    return MicroBatchQueues(lengths, groups, order, {g: b for g in range(len(edges))}, shapes=shapes)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 300), b=st.integers(1, 8), seed=st.integers(0, 10_000))
def test_one_shape_per_micro_batch_fifo_within_a_shape(n, b, seed):
    shapes = video_shapes(n, seed)
    mbq = queues(shapes, b, seed)
    position = {int(i): p for p, i in enumerate(shuffled_order(n, seed, 0))}
    seen = []
    for g, ks in mbq.queue.items():
        ids = mbq.ids_list[g]
        last_of_shape: dict[tuple, int] = {}
        partial: set = set()
        for k in ks:
            a, c = mbq.start[k], mbq.count[k]
            member = [ids[i] for i in range(a, a + c)]
            shape = {tuple(shapes[i]) for i in member}
            assert len(shape) == 1 and 1 <= c <= b  # one shape: no padding
            (shape,) = shape
            assert mbq.padded[k] == shape[0] * shape[1] <= EDGES[g]
            # within a shape, micro-batches take samples in stream order and only the last one is partial
            assert shape not in partial
            if c < b:
                partial.add(shape)
            assert all(position[i] > last_of_shape.get(shape, -1) for i in member)
            assert [position[i] for i in member] == sorted(position[i] for i in member)
            last_of_shape[shape] = position[member[-1]]
            seen += member
    assert sorted(seen) == list(range(n))
    assert list(mbq.ready) == sorted(mbq.ready)


def test_mixed_shapes_never_share_a_micro_batch():
    # seq_group 0 (<= 256 tokens): 12x9 = 108 and 4x36 = 144 fit alone, but together pad to 12x36 = 432
    shapes = np.array([[12, 9], [4, 36], [4, 36], [12, 9]])
    lengths = shapes[:, 0] * shapes[:, 1]
    groups = np.zeros(4, dtype=np.int64)
    order = np.arange(4)
    mbq = MicroBatchQueues(lengths, groups, order, {0: 2}, shapes=shapes)
    got = sorted((mbq.micro_batch(k, 0.0).sample_ids, int(mbq.padded[k]), int(mbq.ready[k])) for k in range(mbq.num))
    # (0, 3) is ready at stream position 3 (its 2nd sample), (1, 2) at position 2
    assert got == [((0, 3), 108, 3), ((1, 2), 144, 2)]
    # without shapes (1D) consecutive samples pair up, padded to the longest
    flat = MicroBatchQueues(lengths, groups, order, {0: 2})
    assert [flat.micro_batch(k, 0.0).sample_ids for k in range(flat.num)] == [(0, 1), (2, 3)]
    assert flat.padded.tolist() == [144, 144]


def test_equal_shapes_give_the_1d_micro_batches():
    shapes = np.tile([[8, 16]], (50, 1))
    lengths = shapes[:, 0] * shapes[:, 1]
    groups = np.zeros(50, dtype=np.int64)
    order = shuffled_order(50, 3, 0)
    with_shapes = MicroBatchQueues(lengths, groups, order, {0: 4}, shapes=shapes)
    without = MicroBatchQueues(lengths, groups, order, {0: 4})
    assert with_shapes.count == without.count and with_shapes.start == without.start
    assert with_shapes.ready.tolist() == without.ready.tolist()


def test_padded_size_drives_the_predicted_time():
    cfg, table = make(4)
    shapes = np.array([[12, 9], [4, 36]] * 8)
    lengths, groups = seq_groups_of(shapes[:, 0] * shapes[:, 1], table)
    order = np.arange(len(lengths))
    times = TimeLookup(table)
    setting = {0: (1, 0)}
    tall = MicroBatchQueues(lengths, groups, order, {0: 2}, shapes=shapes)
    flat = MicroBatchQueues(lengths, groups, order, {0: 2})
    # 1D pairs mix the two shapes; 2D pairs two samples of one shape: the same number of full micro-batches,
    # each timed at its own T x S (the length model of TimeLookup, from the real lengths)
    assert tall.num == flat.num == 8 and sorted(set(tall.padded.tolist())) == [108, 144]
    t_tall = micro_batch_times(tall, times, setting)
    assert np.allclose(t_tall, times.padded_times_s(0, 1, 0, 2, tall.padded))
    assert t_tall[tall.padded == 108].max() < t_tall[tall.padded == 144].min() <= times.time_s(0, 1, 0, 2)


@pytest.mark.parametrize("method", ["dcp-inter", "dcp-intra", "bucket"])
def test_planned_micro_batches_collate_without_padding(method):
    from dcp.runtime.data import SyntheticVideoDataset

    cfg, table = make(4, method=method)
    shapes = [tuple(s) for s in video_shapes(400, 1).tolist()]
    data = SyntheticVideoDataset(shapes, in_channels=2)
    plans = list(EpochPlanner(data.lengths(), table, cfg, 4, shapes=data.sample_shapes()))
    placed = 0
    for plan in plans:
        for g in plan.groups:
            for mb in g.micro_batches:
                batch = data.collate([data[i] for i in mb.sample_ids])
                assert batch.inputs.shape[0] * batch.inputs.shape[1] * batch.inputs.shape[2] == mb.tokens
                assert mb.tokens <= mb.size * EDGES[mb.seq_group]
                placed += mb.size
    assert placed == len(shapes)


def test_shape_errors_name_the_sample_and_the_fix():
    lengths = np.array([36, 64])
    with pytest.raises(PlanningError, match=r"sample 1 has shape \(8, 9\) and length 64.*T x S =="):
        check_shapes([(4, 9), (8, 9)], lengths)
    with pytest.raises(PlanningError, match=r"shapes has shape \(1, 2\), expected \(2, 2\)"):
        check_shapes([(4, 9)], lengths)
    with pytest.raises(PlanningError, match=r"sample 0 has shape \(0, 9\)"):
        check_shapes([(0, 9), (8, 8)], np.array([0, 64]))
    assert check_shapes(None, lengths) is None
    cfg, table = make(2)
    with pytest.raises(PlanningError, match="T x S"):
        EpochPlanner([36, 64], table, cfg, 2, shapes=[(4, 9), (8, 9)])


def test_manager_plans_with_the_datasets_shapes():
    from dcp.api import set_manager
    from dcp.runtime.data import SyntheticVideoDataset

    cfg, table = make(1, sp=(1,))
    data = SyntheticVideoDataset([(12, 9), (4, 36), (4, 36), (12, 9)], in_channels=2)
    model = torch.nn.Linear(2, 2)
    mgr = set_manager(model, data, cfg, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), table=table)
    assert mgr.shapes == [(12, 9), (4, 36), (4, 36), (12, 9)]
    mbs = [mb for plan in mgr.epoch_plans(0) for g in plan.groups for mb in g.micro_batches]
    assert sorted(i for mb in mbs for i in mb.sample_ids) == [0, 1, 2, 3]
    assert all(len({data.shapes[i] for i in mb.sample_ids}) == 1 for mb in mbs)


def test_simulator_plans_2d_with_shapes_and_times_micro_batches_at_their_shape():
    from dcp.planner import plan_epoch
    from dcp.sim.cluster import simulate

    cfg, table = make(2, method="dcp-inter", sp=(1, 2))  # b = 8 in seq_group 1
    shapes = [(20, 16), (4, 100)] * 20  # seq_group 1 (256, 512]: 320 and 400 tokens, padded together 20 x 100
    lengths = [t * s for t, s in shapes]
    res, steps = simulate(lengths, table, cfg, 2, hardware=None, shapes=shapes, return_steps=True)
    assert res.num_samples == len(shapes)
    plans = plan_epoch(lengths, table, cfg, 2, shapes=shapes)
    mbs = [mb for p in plans for g in p.groups for mb in g.micro_batches]
    assert all(len({shapes[i] for i in mb.sample_ids}) == 1 for mb in mbs)  # the simulator's plans hold one shape
    # re-timed from a truth table (the same one), each step costs what the planner predicted for it
    retimed = simulate(lengths, table, cfg, 2, hardware=None, shapes=shapes, truth_table=table, return_steps=True)[1]
    assert [s.compute_time_s for s in retimed] == pytest.approx([p.step_time_s for p in plans])
    assert [s.compute_time_s for s in steps] == pytest.approx([p.step_time_s for p in plans])
    # without shapes the planner pairs 320- and 400-token samples, which a 2D collate would pad to 2000 tokens
    flat = plan_epoch(lengths, table, cfg, 2)
    assert any(len({shapes[i] for i in mb.sample_ids}) > 1 for p in flat for g in p.groups for mb in g.micro_batches)
