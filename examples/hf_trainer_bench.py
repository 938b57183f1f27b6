"""Wall time of DCPTrainer against DCP's own loop on the same plans, interleaved A B A B in the same processes.

    python examples/hf_trainer_bench.py --reps 5       # 2 gloo processes, tiny Llama, cached profile

Each repetition trains one epoch of examples/hf_trainer.py's job (48 samples of up to 512 tokens, global batch
2 x 2 x W samples) twice from the same initial weights: through ``DCPTrainer.train()`` (with its set-up: the
manager, the cached table, the scheduler sized by planning the epoch) and through examples/hf_train.py's loop
(``set_manager`` with the trainer's resolved config and table, then ``get_data_iter`` / ``optimize_dynamics`` /
the engine). The figure per run is its wall time / its optimizer steps (rank 0, after a barrier on both ends);
the medians over the repetitions are printed with their ratio. The first (profiling) run is not counted.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from transformers import TrainingArguments

import dcp
from dcp.hf_trainer import DCPTrainer
from dcp.integrations.hf import TokenDataset
from dcp.integrations.hf_zoo import tiny_causal_lm

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hf_train import byte_dataset, pad  # noqa: E402


def _trainer(out: str, dataset, config: dcp.DCPConfig) -> DCPTrainer:
    torch.manual_seed(0)
    args = TrainingArguments(output_dir=out, per_device_train_batch_size=2, gradient_accumulation_steps=2,
                             learning_rate=1e-3, num_train_epochs=1, logging_steps=1, save_strategy="no",
                             report_to=[], use_cpu=True, seed=0, disable_tqdm=True)
    return DCPTrainer(model=tiny_causal_lm("llama"), args=args, train_dataset=dataset, data_collator=pad,
                      dcp_config=config)


def _timed(run) -> tuple[float, int]:
    """(wall seconds on rank 0 between barriers, optimizer steps) of ``run()``, which returns its steps."""
    dist.barrier()
    start = time.perf_counter()
    steps = run()
    dist.barrier()
    return time.perf_counter() - start, steps


def _own_loop(model, dataset, config: dcp.DCPConfig, table) -> int:
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    mgr = dcp.set_manager(model, TokenDataset(dataset), config, optimizer=optimizer, table=table)
    for batch in mgr.get_data_iter():
        mgr.optimize_dynamics(batch, mgr.engine)
        with mgr.profile(batch, mgr.engine):
            loss = mgr.engine(batch)
            mgr.engine.backward(loss)
            mgr.engine.step()
    return mgr.global_step


def bench(rank: int, world_size: int, out: str, reps: int, samples: int) -> dict:
    config = dcp.DCPConfig()
    dataset = byte_dataset(samples, 512)
    warm = _trainer(f"{out}/warm", dataset, config)
    warm.train()  # profiles (or loads the cached table) once; not counted
    resolved, table = warm.dcp_manager.config, warm.dcp_manager.table
    rows = []
    for rep in range(reps):
        trainer = _trainer(f"{out}/trainer", dataset, config)
        t_s, t_steps = _timed(lambda trainer=trainer: trainer.train().global_step)
        torch.manual_seed(0)
        model = tiny_causal_lm("llama")
        l_s, l_steps = _timed(lambda model=model: _own_loop(model, dataset, resolved, table))
        rows.append({"rep": rep, "trainer_s": t_s, "trainer_steps": t_steps, "loop_s": l_s, "loop_steps": l_steps})
    return {"rows": rows, "summary": warm.dcp_manager.step_stats[-1].summary}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--samples", type=int, default=48)
    parser.add_argument("--out", default="trainer_bench_out")
    args = parser.parse_args()
    from dcp.distributed.launch import run_distributed

    result = run_distributed(bench, args.world_size, args.out, args.reps, args.samples, timeout_s=1800)[0]
    for r in result["rows"]:
        print(f"rep {r['rep']}: DCPTrainer {r['trainer_s']:.2f} s / {r['trainer_steps']} steps, "
              f"DCP loop {r['loop_s']:.2f} s / {r['loop_steps']} steps")
    trainer = statistics.median(r["trainer_s"] / r["trainer_steps"] for r in result["rows"])
    loop = statistics.median(r["loop_s"] / r["loop_steps"] for r in result["rows"])
    pairs = statistics.median((r["trainer_s"] / r["trainer_steps"]) / (r["loop_s"] / r["loop_steps"])
                              for r in result["rows"])
    print(f"plans: {result['summary']} (the last step); median of the pairs' ratios {pairs:.3f}")
    print(f"median step time: DCPTrainer {trainer * 1e3:.0f} ms, DCP loop {loop * 1e3:.0f} ms, "
          f"ratio {trainer / loop:.3f} (W = {args.world_size}, {args.reps} interleaved pairs)")


if __name__ == "__main__":
    main()
