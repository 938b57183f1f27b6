"""CPU A/B of advanced.cache_weight_casts: the manager at W = 1 (no process group), bf16 autocast on CPU, a
Transformer-1D of hidden ``--hidden`` and ``--layers`` layers, micro-batches of one ``--tokens``-token sample,
8 per step; the two settings in interleaved rounds (one 4-step epoch each: dcp.bench.gpu_knobs.paired_rounds),
medians.

    .venv/bin/python scripts/cast_ab.py --hidden 1024 --layers 2 --tokens 16 --rounds 10
"""

from __future__ import annotations

import argparse
import logging
import statistics

import torch

from dcp.api import set_manager
from dcp.bench.gpu_knobs import paired_rounds
from dcp.bench.runtime import fixed_step_plan
from dcp.config import AdvancedConfig, DCPConfig, RuntimeConfig
from dcp.models import T1DConfig, Transformer1D
from dcp.runtime.data import SyntheticTokenDataset

STEPS, GA = 4, 8


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()
    torch.set_num_threads(2)
    logging.getLogger("dcp").setLevel(logging.WARNING)
    model = Transformer1D(T1DConfig.tiny(hidden_size=args.hidden, num_heads=8, num_layers=args.layers,
                                         vocab_size=1024))
    data = SyntheticTokenDataset([args.tokens] * (2 * STEPS * GA), vocab_size=1024)

    def plans(e: int) -> list:
        return [fixed_step_plan(e, s, (1,), GA, args.tokens, 1, 1) for s in range(STEPS)]

    opt = torch.optim.SGD(model.parameters(), lr=1e-6)
    managers = {mode: set_manager(model, data, DCPConfig(model=model.config.shape(), runtime=RuntimeConfig(
        precision="bf16", log_every=STEPS), advanced=AdvancedConfig(cache_weight_casts=keep)), optimizer=opt, plans=plans)
        for mode, keep in (("on", True), ("off", False))}

    times = paired_rounds(managers, args.rounds, STEPS)
    on, off = statistics.median(times["on"]), statistics.median(times["off"])
    wins = sum(a < b for a, b in zip(times["on"], times["off"], strict=True))
    print(f"step ms: cached {1e3 * on:.1f}  uncached {1e3 * off:.1f}  saving {100 * (off - on) / off:.1f} %  "
          f"cached faster in {wins}/{args.rounds} rounds")


if __name__ == "__main__":
    main()
