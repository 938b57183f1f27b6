"""Loss weights that make one DCP step's gradient the gradient of the step's mean loss.

Every rank computes ``loss_sum`` over its own part of its micro-batches (with Ulysses, its chunk of each
sequence). The engine then sums (or averages) gradients over all W ranks once per step. Multiplying each
rank's loss_sum by ``sync_divisor / N_step`` therefore yields

    sum_over_ranks d(loss_sum_r)/dtheta * sync_divisor / N_step / sync_divisor = d(total_loss / N_step)/dtheta

where N_step is the number of labelled tokens (or samples) in the WHOLE step, over every SP group. N_step is
counted from the plan, which is identical on every rank, so no collective is needed before the first
backward; the manager cross-checks it against the all-gathered counts the model reports. Never 1/ga_steps
(ranks accumulate different numbers of micro-batches) and never 1/world_size (ranks hold different amounts
of data).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from dcp.planner.plan import MicroBatch, StepPlan

MODES = ("tokens", "samples")


class WeightingError(ValueError):
    """Loss counts disagree with the plan, or a weighting mode is unknown."""


def step_normaliser(plan: StepPlan, target_counts: Sequence[int], mode: str) -> int:
    """N_step: labelled tokens (mode 'tokens') or samples (mode 'samples') of the whole step.

    ``target_counts`` as a numpy array (the manager keeps one) costs one gather, not a Python step per sample
    (a step holds ~100,000 samples at 4096 ranks)."""
    if mode == "tokens":
        return int(np.asarray(target_counts, dtype=np.int64)[plan.sample_id_array].sum())
    if mode == "samples":
        return plan.samples
    raise WeightingError(f"runtime.loss_weighting ({mode!r}) is not one of {list(MODES)}: pick one of those")


def micro_batch_weight(
    mb: MicroBatch, n_step: int, target_counts: Sequence[int], mode: str, sync_divisor: int
) -> float:
    """Factor applied to this rank's loss_sum of micro-batch ``mb``.

    tokens: ``sync_divisor / N_step`` (each labelled token weighs the same in the step).
    samples: each sample weighs 1 / N_step; inside the micro-batch the token-mean is used, i.e. the factor
    is ``sync_divisor * b / (N_step * tokens_mb)``. This is exact when the micro-batch's samples have equal
    label counts (one seq_group with equal lengths, or b = 1) and a token-weighted mean inside it otherwise.
    """
    if n_step <= 0:
        return 0.0
    if mode == "tokens":
        return sync_divisor / n_step
    if mode == "samples":
        labelled = sum(target_counts[i] for i in mb.sample_ids)
        return 0.0 if labelled == 0 else sync_divisor * mb.size / (n_step * labelled)
    raise WeightingError(f"runtime.loss_weighting ({mode!r}) is not one of {list(MODES)}: pick one of those")


def check_step_count(step: int, expected: int, reported: int) -> None:
    """Raise when the all-gathered model counts of a step differ from the plan's labelled-token count."""
    if expected != reported:
        raise WeightingError(
            f"step {step}: the model reported {reported} labelled tokens over all ranks but the plan counts "
            f"{expected} (from dataset.target_counts()): make target_counts() return the tokens the loss "
            "counts for each sample (e.g. length - 1 for next-token prediction), or the loss weights are wrong"
        )
