"""Which profiled row bounds a simulated micro-batch's memory (dcp.sim.cluster._mem_row)."""

from types import SimpleNamespace

from dcp.planner.plan import MicroBatch
from dcp.sim.cluster import _mem_row

EDGES = (1024, 2048)


def _rows(group: int = 0, sp_size: int = 1, bound: int = 1024):
    return {(group, sp_size): [SimpleNamespace(micro_batch_size=b, seq_len=bound) for b in (1, 2, 4, 8, 16, 32, 64)]}


def test_token_pack_of_short_documents_is_bounded_by_its_tokens_not_its_count():
    # 39 documents, 8,116 tokens, run as one row of documents: the 8 x 1024 row holds it (not 64 x 1024)
    lens = (208,) * 38 + (212,)
    mb = MicroBatch(tuple(range(39)), lens, 0)
    assert sum(lens) == 8116
    assert _mem_row(mb, 1, _rows(), EDGES).micro_batch_size == 8


def test_samples_of_one_length_keep_the_count_rule():
    mb = MicroBatch((0, 1, 2), (300, 300, 300), 0)  # 2D: one shape per micro-batch
    assert _mem_row(mb, 1, _rows(), EDGES).micro_batch_size == 4


def test_packed_baseline_micro_batch_is_one_sequence_of_its_tokens():
    mb = MicroBatch((0, 1), (900, 1000), -1)  # 1,900 tokens: seq_group 1 (<= 2048) at b = 1
    row = _mem_row(mb, 1, {**_rows(), **_rows(group=1, bound=2048)}, EDGES)
    assert (row.micro_batch_size, row.seq_len) == (1, 2048)


def test_no_row_holds_it():
    mb = MicroBatch(tuple(range(3)), (1000, 1000, 900), 0)
    assert _mem_row(mb, 2, _rows(), EDGES) is None
