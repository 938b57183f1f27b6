"""Load-balanced dynamic batching: a per-rank sample pool cut into best-fit batches under a token budget.

Every data-parallel rank reads its own shard of a per-epoch shuffle (``ids[rank::world_size]`` of a
permutation seeded by ``(dataloader_seed, epoch)``), keeps a pool of ``load_balanced_pool_size`` samples
and repeatedly takes from it the batch that best fills ``load_balanced_max_tokens_for_batch``:

* padded batches (default) count ``batch_size * longest_sample`` tokens; ``prefer_closest`` adds the
  sample that adds the least padding, ``prefer_first`` the oldest one that fits;
* packed batches (``sequence_packing = true``) count the sum of lengths and add pool samples in order
  while they fit.

Because every rank fills every batch up to the same budget, ranks process about the same number of
tokens per step even though their batch sizes differ: that is the load balancing. Training is
step-based: the loader yields ``load_balanced_batches_per_optimizer_step`` batches per optimizer step
until ``max_num_steps``; with ``infinite_loop`` the shard restarts with the next epoch's shuffle.
The iterator's position is a small value (epoch, cursor, pool, steps): ``state_dict`` /
``load_state_dict`` resume exactly, and ``skip_steps`` replays deterministically from any start.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dcp.loaders._common import (
    Batch,
    check_lengths,
    check_rank,
    epoch_permutation,
    fail_arg,
    fail_config,
    packed_batch,
    padded_batch,
)
from dcp.validate import type_fix

BATCHING_STRATEGIES = ("prefer_closest", "prefer_first")
OVERSIZED_POLICIES = ("error", "alone")
# Where each field lives in the TOML layout users of load-balanced batching know ([train] and
# [train.train_policy]); error messages use these paths.
_TRAIN_KEYS = ("max_num_steps", "sequence_packing")
_ALIASES = {"load_balanced_accumulate_steps": "load_balanced_batches_per_optimizer_step"}


def _path(name: str) -> str:
    return f"train.{name}" if name in _TRAIN_KEYS else f"train.train_policy.{name}"


@dataclass(kw_only=True, slots=True, frozen=True)
class LoadBalancedConfig:
    """Settings of load-balanced dynamic batching, named as in its ``[train]`` / ``[train.train_policy]`` TOML."""

    load_balanced_pool_size: int = 32
    """Samples each rank keeps in its pool; a batch holds at most this many. Larger pools fit better."""
    load_balanced_max_tokens_for_batch: int = 32768
    """Token budget of one batch: batch_size * longest (padded) or sum of lengths (packed)."""
    load_balanced_batching_strategy: str = "prefer_closest"
    """prefer_closest (least added padding) or prefer_first (oldest sample that fits); ignored when packing."""
    load_balanced_batches_per_optimizer_step: int = 1
    """Batches yielded per optimizer step (gradient accumulation); alias load_balanced_accumulate_steps."""
    sequence_packing: bool = False
    """Pack samples into one row without padding (the model must support packed sequences)."""
    max_num_steps: int = 0
    """Optimizer steps to yield; required (>= 1) with infinite_loop, 0 means 'until the data ends' otherwise."""
    infinite_loop: bool = True
    """Restart the shard with the next epoch's shuffle when it is exhausted."""
    dataloader_seed: int = 0
    """Seed of the per-epoch shuffle; the same on every rank."""
    oversized_samples: str = "error"
    """What to do with a sample longer than the budget: error, or alone (a batch of that sample only)."""

    def __post_init__(self) -> None:
        for name in ("load_balanced_pool_size", "load_balanced_max_tokens_for_batch",
                     "load_balanced_batches_per_optimizer_step"):
            if getattr(self, name) < 1:
                fail_config(_path(name), getattr(self, name), "must be >= 1", f"set {name} to a positive integer")
        if self.load_balanced_batching_strategy not in BATCHING_STRATEGIES:
            fail_config(_path("load_balanced_batching_strategy"), self.load_balanced_batching_strategy,
                        f"is not one of {list(BATCHING_STRATEGIES)}", "pick one of those names")
        if self.max_num_steps < 0:
            fail_config(_path("max_num_steps"), self.max_num_steps, "must be >= 0", "set the number of optimizer steps")
        if self.infinite_loop and self.max_num_steps == 0:
            fail_config(_path("max_num_steps"), self.max_num_steps,
                        "must be >= 1 when train.train_policy.infinite_loop is true (training is step-based)",
                        "set max_num_steps, or set infinite_loop = false to stop when the data ends")
        if self.dataloader_seed < 0:
            fail_config(_path("dataloader_seed"), self.dataloader_seed, "must be >= 0", "use a non-negative seed")
        if self.oversized_samples not in OVERSIZED_POLICIES:
            fail_config(_path("oversized_samples"), self.oversized_samples,
                        f"is not one of {list(OVERSIZED_POLICIES)}", "pick one of those names")

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> LoadBalancedConfig:
        """Build from the documented TOML layout ``{"train": {..., "train_policy": {...}}}`` or a flat dict.

        Strict: unknown keys fail and list the valid ones; ``enable_dp_load_balancing`` must be true.
        """
        flat: dict[str, Any] = {}
        if "train" in raw:
            extra = sorted(set(raw) - {"train"})
            if extra:
                fail_config(extra[0], raw[extra[0]], "is not a known section", "only [train] is read here")
            train = dict(raw["train"])
            policy = train.pop("train_policy", {})
            flat.update(train)
            flat.update(policy)
        else:
            flat.update(raw)
        if not flat.pop("enable_dp_load_balancing", True):
            fail_config("train.train_policy.enable_dp_load_balancing", False, "is false",
                        "set it to true to use load-balanced batching, or use a plain DataLoader")
        for alias, name in _ALIASES.items():
            if alias in flat:
                if name in flat and flat[name] != flat[alias]:
                    fail_config(_path(alias), flat[alias], f"contradicts {name} ({flat[name]!r})", "set only one")
                flat[name] = flat.pop(alias)
        valid = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(flat) - set(valid))
        if unknown:
            fail_config(_path(unknown[0]), flat[unknown[0]], "is not a known key",
                        f"valid keys are {valid + ['enable_dp_load_balancing'] + list(_ALIASES)}")
        for f in dataclasses.fields(cls):
            if f.name in flat:
                want = {"int": int, "bool": bool, "str": str}[str(f.type)]
                value = flat[f.name]
                if not isinstance(value, want) or (want is int and isinstance(value, bool)):
                    fail_config(_path(f.name), value, f"must be of type {want.__name__}",
                                type_fix(value, want.__name__, f.name))
        return cls(**flat)


StepBatches = tuple[Batch, ...]


class LoadBalancedBatcher:
    """Iterator over optimizer steps of one rank; each item is a tuple of batches (gradient accumulation).

    ``lengths[i]`` is the token count of dataset sample ``i``. Every rank builds its batcher from the same
    lengths and config; only ``rank`` differs. Nothing is communicated: the shard, the pool and therefore
    every batch of every rank are functions of (lengths, config, rank, world_size).
    """

    def __init__(self, lengths: Sequence[int], config: LoadBalancedConfig, *, rank: int, world_size: int) -> None:
        self.lengths = check_lengths(lengths)
        check_rank(rank, world_size)
        if len(self.lengths) < world_size:
            fail_arg("len(lengths)", len(self.lengths), f"is below world_size ({world_size})",
                     "every rank needs at least one sample: use fewer ranks or more data")
        if config.infinite_loop and config.load_balanced_pool_size > len(self.lengths) // world_size:
            # the pool would refill across several epochs at once and hold the same sample twice
            fail_arg("train.train_policy.load_balanced_pool_size", config.load_balanced_pool_size,
                     f"exceeds the smallest rank shard ({len(self.lengths) // world_size} samples) with infinite_loop",
                     "lower the pool size, use fewer ranks, or set infinite_loop = false")
        self.config = config
        self.rank = rank
        self.world_size = world_size
        self._shard_epoch = -1
        self._shard: list[int] = []
        self.set_epoch(0)

    # ----- position -------------------------------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """Restart at the beginning of ``epoch`` with an empty pool and a step counter of 0."""
        if epoch < 0:
            fail_arg("epoch", epoch, "must be >= 0", "epochs count from 0")
        self.epoch = epoch
        self.cursor = 0
        self.pool: list[int] = []
        self.steps = 0
        self._done = False

    def shard_for_epoch(self, epoch: int) -> list[int]:
        """This rank's sample ids for ``epoch``: an interleaved slice of the epoch's global shuffle."""
        if epoch != self._shard_epoch:
            perm = epoch_permutation(len(self.lengths), self.config.dataloader_seed, epoch)
            self._shard = perm[self.rank :: self.world_size].tolist()
            self._shard_epoch = epoch
        return self._shard

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue exactly here (small: the pool holds at most pool_size ids)."""
        return {
            "epoch": self.epoch, "cursor": self.cursor, "pool": list(self.pool), "steps": self.steps,
            "done": self._done, "rank": self.rank, "world_size": self.world_size,
            "num_samples": len(self.lengths), "config": dataclasses.asdict(self.config),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state``; refuses a state saved with another rank, world size, dataset or config."""
        for key, mine in (("rank", self.rank), ("world_size", self.world_size),
                          ("num_samples", len(self.lengths)), ("config", dataclasses.asdict(self.config))):
            if state.get(key) != mine:
                fail_arg(f"state_dict['{key}']", state.get(key), f"differs from this loader's {key} ({mine!r})",
                         "resume with the same ranks, dataset and load-balancing config as the saved run")
        self.epoch, self.cursor, self.steps = int(state["epoch"]), int(state["cursor"]), int(state["steps"])
        self.pool = [int(i) for i in state["pool"]]
        self._done = bool(state["done"])

    def skip_steps(self, num_steps: int) -> None:
        """Advance by ``num_steps`` optimizer steps (replaying batch formation; cheap, no data is read)."""
        for _ in range(num_steps):
            if next(self, None) is None:
                break

    # ----- iteration ------------------------------------------------------------------------------
    def __iter__(self) -> Iterator[StepBatches]:
        return self

    def __next__(self) -> StepBatches:
        cfg = self.config
        if self._done or (cfg.max_num_steps and self.steps >= cfg.max_num_steps):
            raise StopIteration
        batches: list[Batch] = []
        for _ in range(cfg.load_balanced_batches_per_optimizer_step):
            self._refill()
            if not self.pool:
                break
            batches.append(self._take_batch())
        if not batches:
            self._done = True
            raise StopIteration
        # A last, partial step (fewer batches than configured) is yielded, never dropped: every sample of a
        # finite run is trained once.
        self.steps += 1
        return tuple(batches)

    def sample_id_batches(self) -> Iterator[list[int]]:
        """Flat lists of sample ids, one per batch: pass as ``batch_sampler`` to a torch DataLoader."""
        for step in self:
            for batch in step:
                yield list(batch.sample_ids)

    def _refill(self) -> None:
        shard = self.shard_for_epoch(self.epoch)
        while len(self.pool) < self.config.load_balanced_pool_size:
            if self.cursor < len(shard):
                self.pool.append(shard[self.cursor])
                self.cursor += 1
            elif self.config.infinite_loop:
                self.epoch, self.cursor = self.epoch + 1, 0
                shard = self.shard_for_epoch(self.epoch)
            else:
                return

    def _take_batch(self) -> Batch:
        cfg, lengths = self.config, self.lengths
        budget = cfg.load_balanced_max_tokens_for_batch
        first = self.pool[0]
        if lengths[first] > budget:
            if cfg.oversized_samples == "error":
                fail_arg(f"lengths[{first}]", lengths[first],
                         f"exceeds train.train_policy.load_balanced_max_tokens_for_batch ({budget})",
                         "raise the budget, truncate the sample, or set oversized_samples = 'alone'")
            self.pool.pop(0)
            pair = [(first, lengths[first])]
            return packed_batch(pair, self.epoch) if cfg.sequence_packing else padded_batch(pair, self.epoch)
        if cfg.sequence_packing:
            chosen, total = [], 0
            for pos, i in enumerate(self.pool):
                if total + lengths[i] <= budget:
                    chosen.append(pos)
                    total += lengths[i]
        else:
            chosen = self._best_fit(budget)
        taken = set(chosen)
        pairs = [(self.pool[p], lengths[self.pool[p]]) for p in chosen]
        self.pool = [i for p, i in enumerate(self.pool) if p not in taken]
        return packed_batch(pairs, self.epoch) if cfg.sequence_packing else padded_batch(pairs, self.epoch)

    def _best_fit(self, budget: int) -> list[int]:
        """Pool positions of a padded batch: starts with the oldest sample (so none starves), then adds the
        fitting sample with the least added padding (prefer_closest) or the oldest fitting one (prefer_first)."""
        lens = [self.lengths[i] for i in self.pool]
        chosen, used = [0], [True] + [False] * (len(lens) - 1)
        longest = lens[0]
        closest = self.config.load_balanced_batching_strategy == "prefer_closest"
        while True:
            best, best_cost = -1, None
            size = len(chosen)
            for pos, n in enumerate(lens):
                if used[pos]:
                    continue
                new_longest = max(longest, n)
                if (size + 1) * new_longest > budget:
                    continue
                if not closest:
                    best = pos
                    break
                cost = (new_longest - n) + size * (new_longest - longest)  # padding this sample adds
                if best_cost is None or cost < best_cost:
                    best, best_cost = pos, cost
            if best < 0:
                return chosen
            chosen.append(best)
            used[best] = True
            longest = max(longest, lens[best])


def lockstep_steps(
    lengths: Sequence[int], config: LoadBalancedConfig, world_size: int
) -> Iterator[tuple[StepBatches, ...]]:
    """Every rank's step, side by side: item ``k`` holds step ``k`` of ranks 0..W-1.

    Any rank can compute this without communication (batching is a pure function of the inputs), which
    is how a global view of a step (e.g. for the DCP planner or the benchmark) is obtained. Without
    infinite_loop the view ends with the first rank that runs out; the other ranks' own batchers would
    still yield their remaining steps.
    """
    batchers = [LoadBalancedBatcher(lengths, config, rank=r, world_size=world_size) for r in range(world_size)]
    while True:
        step = [next(b, None) for b in batchers]
        if any(s is None for s in step):
            return
        yield tuple(step)  # type: ignore[misc]
