"""At a global batch no micro-batch holds more samples than a rank's share of a step (as token packs): a step
can only take whole micro-batches, and ones as large as the step leave it far outside its bounds."""

from __future__ import annotations

import dcp
from dcp.config import ModelShapeConfig, PlanningConfig, ProfilingConfig
from dcp.planner import EpochPlanner
from dcp.planner.table import ProfileTable

# measured on one CPU process for a tiny Llama (dcp.integrations.hf_zoo): b = 4 is the fastest per token at 256
ROWS = """# format_version: 1
# dtype: "float32"
# hardware: "cpu"
# model: "llama-hf"
# world_size: 1
# seq_group_edges: [128, 256]
seq_group,seq_len,micro_batch_size,sp_size,t_f_s,t_b_s,m_act_bytes,m_inp_bytes,t_const_s,m_const_bytes,num_layers,feasible
0,128,1,1,0.0031783,0.0001036,560128.0,32768.0,0.0018835,3470336.0,4,True
0,128,2,1,0.0037439,0.0004749,1120256.0,65536.0,0.0021544,4047872.0,4,True
0,128,4,1,0.0068290,0.0020932,2240512.0,131072.0,0.0036389,5202944.0,4,True
1,256,1,1,0.0041742,0.0015317,1120256.0,65536.0,0.0027017,4047872.0,4,True
1,256,2,1,0.0064749,0.0008151,2240512.0,131072.0,0.0027991,5202944.0,4,True
1,256,4,1,0.0107873,0.0027781,4481024.0,262144.0,0.0036260,7513088.0,4,True
"""
LENGTHS = [92, 256, 256, 256, 256, 220, 256, 256, 256, 256, 256, 178, 117, 217, 234, 256]


def test_one_rank_four_samples_a_step_keeps_four_steps_of_small_micro_batches():
    table = ProfileTable.from_csv(ROWS, text=True)
    config = dcp.DCPConfig(model=ModelShapeConfig(num_layers=4, hidden_size=64, num_heads=4, ffn_hidden_size=128,
                                                      vocab_size=256),
                           profiling=ProfilingConfig(seq_group_edges=(128, 256), max_micro_batch_size=4),
                           planning=PlanningConfig(sp_sizes=(1,), samples_per_step=4))
    plans = list(EpochPlanner(LENGTHS, table, config, 1, 0))
    share = sum(LENGTHS) / len(LENGTHS) * 4  # the rank's share of a step: 4 samples of the mean length
    assert len(plans) == 4  # 16 samples, 4 a step (before: a step of 209 tokens and a fifth step)
    assert sorted(i for p in plans for i in p.sample_id_array) == list(range(16))
    for p in plans:
        for g in p.groups:
            assert all(mb.size == 1 or mb.tokens <= share for mb in g.micro_batches)
        assert p.tokens >= 0.75 * share
