"""Variable batch size: micro-batches filled up to a token budget, dealt to ranks step by step.

Input is a global sample order (a seeded shuffle, or a length curriculum from ``dcp.loaders.curriculum``)
known identically on every rank. Consecutive samples are cut into micro-batches of at most
``max_tokens_per_batch`` tokens (``rows * longest`` when padding counts, the plain sum when packing), so
short samples make large batches and long samples small ones. Each optimizer step takes the next
``world_size * ga_steps`` micro-batches and deals them round-robin: micro-batch ``j`` of the step goes to
rank ``j % world_size`` as its micro-step ``j // world_size``.

Because every rank plans the whole order, every rank knows the realised global batch size of every step
without communicating, which is what ``dcp.loaders.lr_scaling`` needs to scale the learning rate.

With ``same_shape_micro_batches`` (pipeline parallelism needs one activation shape per step) all
micro-batches of a step share ``(rows, padded_len)``: the step holds fewer samples and short micro-batches
are padded with empty rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dcp.loaders._common import Batch, check_lengths, epoch_permutation, fail_arg, fail_config, packed_batch


@dataclass(kw_only=True, slots=True, frozen=True)
class VariableBatchConfig:
    """Token-budget micro-batching with a variable number of samples per step."""

    max_tokens_per_batch: int = 32768
    """Token budget of one micro-batch (counted with padding when count_padding is true)."""
    count_padding: bool = True
    """Count rows * padded_len against the budget (padded tensors); false packs samples (sum of lengths)."""
    ga_steps: int = 1
    """Micro-batches each rank runs per optimizer step."""
    same_shape_micro_batches: bool = False
    """All micro-batches of a step get the same (rows, padded_len), padding rows as needed (pipeline use)."""
    pad_to_multiple_of: int = 1
    """Round every padded length up to a multiple of this (e.g. the SP size, or 8 for tensor cores)."""

    def __post_init__(self) -> None:
        for name in ("max_tokens_per_batch", "ga_steps", "pad_to_multiple_of"):
            if getattr(self, name) < 1:
                fail_config(f"varbatch.{name}", getattr(self, name), "must be >= 1", f"set {name} to a positive integer")
        if self.same_shape_micro_batches and not self.count_padding:
            fail_config("varbatch.same_shape_micro_batches", True, "needs varbatch.count_padding = true",
                        "same-shape micro-batches are padded tensors: enable count_padding or disable same_shape")
        if self.max_tokens_per_batch % self.pad_to_multiple_of:
            fail_config("varbatch.max_tokens_per_batch", self.max_tokens_per_batch,
                        f"is not a multiple of varbatch.pad_to_multiple_of ({self.pad_to_multiple_of})",
                        "choose a budget that is a multiple of the padding granule")


@dataclass(frozen=True, slots=True)
class VarStep:
    """One optimizer step: ``micro_batches[rank]`` are that rank's micro-batches in micro-step order."""

    step: int
    """Step index in the plan."""
    micro_batches: tuple[tuple[Batch, ...], ...]
    """Per rank, the micro-batches it accumulates this step (the last step may give some ranks fewer)."""

    @property
    def batch_size(self) -> int:
        """Realised global batch size: real samples over all ranks and micro-steps."""
        return sum(b.size for mbs in self.micro_batches for b in mbs)

    @property
    def tokens(self) -> int:
        return sum(b.tokens for mbs in self.micro_batches for b in mbs)

    @property
    def padded_tokens(self) -> int:
        return sum(b.padded_tokens for mbs in self.micro_batches for b in mbs)

    def for_rank(self, rank: int) -> tuple[Batch, ...]:
        return self.micro_batches[rank]


def shuffled_order(num_samples: int, seed: int, epoch: int) -> list[int]:
    """A per-epoch shuffle of sample ids, identical on every rank."""
    return epoch_permutation(num_samples, seed, epoch).tolist()


def _round_up(n: int, k: int) -> int:
    return -(-n // k) * k


def plan_variable_batches(
    order: Sequence[int], lengths: Sequence[int], config: VariableBatchConfig, world_size: int
) -> list[VarStep]:
    """Cut ``order`` (sample ids) into token-budget micro-batches and steps for ``world_size`` ranks.

    Every sample of ``order`` appears in exactly one micro-batch; a sample longer than the budget is an
    error rather than a silent drop.
    """
    lengths = check_lengths(lengths)
    if world_size < 1:
        fail_arg("world_size", world_size, "must be >= 1", "pass the number of data-parallel ranks")
    k, budget = config.pad_to_multiple_of, config.max_tokens_per_batch
    for i in order:
        if not 0 <= i < len(lengths):
            fail_arg("order", i, f"is not a sample id in [0, {len(lengths)})", "pass ids that index lengths")
        if _round_up(lengths[i], k) > budget:
            fail_arg(f"lengths[{i}]", lengths[i], f"exceeds varbatch.max_tokens_per_batch ({budget}) once padded",
                     "raise the budget or truncate long samples")
    per_step = world_size * config.ga_steps
    if config.same_shape_micro_batches:
        chunks = _same_shape_steps(order, lengths, config, per_step)
    else:
        mbs = _greedy_micro_batches(order, lengths, config)
        chunks = [mbs[s : s + per_step] for s in range(0, len(mbs), per_step)]
    steps = []
    for s, chunk in enumerate(chunks):
        # Round-robin dealing: consecutive micro-batches (similar lengths in a curriculum) land on different
        # ranks, so every rank's share of a step is about ga_steps * budget tokens.
        per_rank = tuple(tuple(chunk[j] for j in range(r, len(chunk), world_size)) for r in range(world_size))
        steps.append(VarStep(step=s, micro_batches=per_rank))
    return steps


def _greedy_micro_batches(order: Sequence[int], lengths: list[int], config: VariableBatchConfig) -> list[Batch]:
    k, budget = config.pad_to_multiple_of, config.max_tokens_per_batch
    out: list[Batch] = []
    cur: list[tuple[int, int]] = []
    longest = total = 0
    for i in order:
        n = lengths[i]
        if config.count_padding:
            fits = (len(cur) + 1) * _round_up(max(longest, n), k) <= budget
        else:
            fits = total + n <= budget
        if cur and not fits:
            out.append(_emit(cur, longest, config))
            cur, longest, total = [], 0, 0
        cur.append((i, n))
        longest, total = max(longest, n), total + n
    if cur:
        out.append(_emit(cur, longest, config))
    return out


def _emit(pairs: list[tuple[int, int]], longest: int, config: VariableBatchConfig) -> Batch:
    if not config.count_padding:
        return packed_batch(pairs)
    ids = tuple(i for i, _ in pairs)
    lens = tuple(n for _, n in pairs)
    return Batch(ids, lens, _round_up(longest, config.pad_to_multiple_of), len(ids))


def _same_shape_steps(
    order: Sequence[int], lengths: list[int], config: VariableBatchConfig, per_step: int
) -> list[list[Batch]]:
    """Steps whose ``per_step`` micro-batches all have shape (rows, padded_len) with rows*padded_len <= budget."""
    k, budget = config.pad_to_multiple_of, config.max_tokens_per_batch
    steps: list[list[Batch]] = []
    pos = 0
    while pos < len(order):
        start, longest = pos, 0
        while pos < len(order):
            t = _round_up(max(longest, lengths[order[pos]]), k)
            # the step can hold per_step micro-batches of budget // t rows each
            if pos > start and pos - start + 1 > per_step * (budget // t):
                break
            longest = max(longest, lengths[order[pos]])
            pos += 1
        ids = list(order[start:pos])
        t = _round_up(longest, k)
        rows = -(-len(ids) // per_step)
        base, extra = divmod(len(ids), per_step)
        mbs, at = [], 0
        for j in range(per_step):
            take = base + (1 if j < extra else 0)
            part = ids[at : at + take]
            at += take
            mbs.append(Batch(tuple(part), tuple(lengths[i] for i in part), t, rows))
        steps.append(mbs)
    return steps
