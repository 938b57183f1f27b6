"""The imbalance-study sweep: families in ``datasets/sweep.toml`` expanded into named member specs."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import numpy as np

from dcp.data_dists.spec import DistributionError, DistributionSpec, _check_keys, _read_toml, default_spec_dir

SWEEP_PREFIX = "sweep-"


def _as_list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list) else [value]


def sweep_specs(spec_dir: Path | None = None) -> list[DistributionSpec]:
    """Every member of every sweep family, in file order; names are sweep-<family>-<index>."""
    path = (spec_dir or default_spec_dir()) / "sweep.toml"
    raw = _read_toml(path)
    _check_keys(str(path), raw, {"family"})
    out: list[DistributionSpec] = []
    for fi, fam in enumerate(raw.get("family", [])):
        where = f"{path} [[family]] #{fi}"
        _check_keys(where, fam, {"name", "grid", "sampler", "log_position_mean", "log_position_std",
                                 "zipf_exponent", "zipf_order", "count", "dirichlet_alpha", "seed"})
        name, grid, sampler = fam.get("name"), fam.get("grid"), fam.get("sampler")
        if not name or not grid or not sampler:
            raise DistributionError(f"{where}: name/grid/sampler ({name!r}, {grid!r}, {sampler!r}) are required: "
                                    "give all three")
        base = {"grid": grid, "sampler": sampler}
        if sampler == "lognormal":
            combos = [{"log_position_mean": m, "log_position_std": s}
                      for m, s in itertools.product(_as_list(fam["log_position_mean"]),
                                                    _as_list(fam["log_position_std"]))]
        elif sampler == "zipf":
            combos = [{"zipf_exponent": float(a), "zipf_order": o}
                      for a, o in itertools.product(_as_list(fam["zipf_exponent"]), _as_list(fam["zipf_order"]))]
        elif sampler == "tiers":
            count, alpha, seed = int(fam.get("count", 0)), float(fam.get("dirichlet_alpha", 1.0)), int(fam.get("seed", 0))
            if count < 1 or alpha <= 0:
                raise DistributionError(f"{where}: count/dirichlet_alpha ({count}, {alpha}) must be >= 1 and > 0: "
                                        "e.g. count = 50, dirichlet_alpha = 0.7")
            rng = np.random.Generator(np.random.PCG64(seed))
            # 4 tiers per grid (grids.toml); shares rounded so the spec prints cleanly and still sums to 1
            combos = []
            for _ in range(count):
                sh = np.round(rng.dirichlet([alpha] * 4), 4)
                sh[-1] = round(1.0 - float(sh[:-1].sum()), 4)
                if sh[-1] < 0:
                    sh[-1] = 0.0
                    sh = sh / sh.sum()
                combos.append({"compute_shares": tuple(float(x) for x in sh)})
        else:
            raise DistributionError(f"{where}: sampler ({sampler!r}) is not tiers, zipf or lognormal: pick one")
        for kw in combos:
            idx = len(out)
            out.append(DistributionSpec(name=f"{SWEEP_PREFIX}{name}-{idx:03d}", description=f"sweep {name}",
                                        **base, **kw))
    return out
