"""What the first run of examples/hf_train.py spends profiling: wall and CPU seconds of ``init_profiler`` per rank.

    python examples/hf_profile_cost.py --reps 3        # 2 gloo processes, a fresh cache folder per repetition

Each repetition builds the example's model and dataset, lets ``set_manager`` fit its defaults (``config``
sets only a temporary cache folder) and times ``mgr.init_profiler()`` on every rank: elapsed time and the
process's CPU time (``time.process_time``, all threads). On a shared machine the CPU time is the stabler
figure; elapsed time also counts the slices other processes take.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path


def profile_once(rank: int, world_size: int, arch: str, samples: int, cache_dir: str) -> dict:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import torch
    from hf_train import byte_dataset, tiny_causal_lm

    import dcp.integrations.hf

    model = tiny_causal_lm(arch)
    config = dcp.DCPConfig(profiling=dcp.config.ProfilingConfig(cache_dir=cache_dir))
    mgr = dcp.set_manager(model, dcp.integrations.hf.TokenDataset(byte_dataset(samples, 512)), config,
                          optimizer=torch.optim.AdamW(model.parameters(), lr=1e-3))
    cpu, wall = time.process_time(), time.perf_counter()
    mgr.init_profiler()
    return {"wall_s": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu, "rows": len(mgr.table),
            "edges": mgr.config.profiling.seq_group_edges, "sp_sizes": mgr.config.planning.sp_sizes,
            "max_micro_batch_size": mgr.config.profiling.max_micro_batch_size}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="llama", help="tiny model architecture (default: %(default)s)")
    parser.add_argument("--samples", type=int, default=48, help="dataset samples (default: %(default)s)")
    parser.add_argument("--reps", type=int, default=3, help="fresh profiles to time (default: %(default)s)")
    parser.add_argument("--world-size", type=int, default=2, help="gloo processes (default: %(default)s)")
    args = parser.parse_args()
    from dcp.distributed.launch import run_distributed

    for rep in range(args.reps):
        with tempfile.TemporaryDirectory() as cache_dir:
            out = run_distributed(profile_once, args.world_size, args.arch, args.samples, cache_dir, timeout_s=600)
        r0 = out[0]
        cpu = " / ".join(f"{r['cpu_s']:.2f}" for r in out)
        print(f"rep {rep}: wall {r0['wall_s']:.2f} s, CPU {cpu} s (per rank), {r0['rows']} rows, edges {r0['edges']}, "
              f"sp {r0['sp_sizes']}, b <= {r0['max_micro_batch_size']}, load {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
