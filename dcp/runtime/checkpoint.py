"""The manager's checkpoint state: where the run is in the data, as which samples of the epoch are trained
(dcp.runtime.position), and a digest of the dataset that refuses a resume on other data.

A resume under another profile table, planner version or world size is honoured: the samples the epoch has
not trained yet are planned again and each is trained once. Model, optimizer and scheduler states are saved by
the caller (or the DeepSpeed engine).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from dcp.config import DCPConfig
from dcp.runtime.position import EpochPosition, PositionError, plan_inputs, segment_key


def data_digest(dataset: Any, lengths: list[int], target_counts: list[int], shapes: Any) -> str:
    """24 hex digits over what makes the dataset this dataset: lengths, target counts, 2D shapes and, where the
    dataset offers one, its ``content_digest()`` (e.g. a hash of each sample's first and last tokens: ranks
    whose samples hold other tokens under the same lengths then differ too)."""
    content = str(dataset.content_digest()) if hasattr(dataset, "content_digest") else ""
    text = f"{lengths!r}|{target_counts!r}|{[tuple(s) for s in shapes] if shapes is not None else None!r}|{content}"
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def legacy_fingerprint(config: DCPConfig, lengths: list[int], world_size: int, shapes: Any) -> str:
    """The fingerprint older dcp checkpoints carry (config, lengths, shapes, world size): such a checkpoint is
    resumed only when it matches, since its step index means something only in the same plan."""
    text = config.to_json() + repr(lengths) + f"w{world_size}"
    if shapes is not None:
        text += repr([tuple(s) for s in shapes])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def resume(position: EpochPosition, data: str, table: Any, config: DCPConfig, world_size: int,
           plans: Callable[[np.ndarray], Iterator[Any]], log: Any = None) -> Iterator[Any]:
    """This rank's plans of the epoch's steps not yet done (EpochPosition.resume at this run's segment key: the
    same plan with its finished steps skipped, or the untrained samples planned again); ``log`` says which."""
    from dcp import __version__

    inputs = plan_inputs(table, config, world_size, __version__)
    out, skipped, replanned = position.resume(lambda base: segment_key(data, base, inputs), plans)
    if log is not None and (replanned or skipped):
        done, n = int(position.done.sum()), position.num_samples
        log.info(f"resuming epoch {position.epoch}: {done} of {n} samples are trained; " + (
            f"the plan's inputs (table, world size, config or dcp version) changed: the other {n - done} are "
            "planned again" if replanned else f"the same plan continues after its {skipped} finished steps"))
    return out


def state_dict(position: EpochPosition, global_step: int, data: str) -> dict[str, Any]:
    return {"epoch": position.epoch, "step_in_epoch": position.steps, "global_step": global_step,
            "samples_done": int(position.done.sum()), "data": data, "position": position.to_state()}


def load_state_dict(state: Any, *, data: str, num_samples: int, legacy_fp: str) -> tuple[EpochPosition, int]:
    """(position, global_step) saved in ``state``; PositionError (one line) when it cannot be honoured."""
    if not isinstance(state, dict):
        raise PositionError(f"checkpoint state ({type(state).__name__}) is not a dict: pass DCPManager.state_dict()")
    global_step = state.get("global_step")
    if type(global_step) is not int or global_step < 0:
        raise PositionError(f"checkpoint global_step ({global_step!r}) is not an integer >= 0: the checkpoint is "
                            "damaged; resume from another one")
    if "position" not in state:  # an older dcp's step index: only in the very same plan
        if state.get("fingerprint") != legacy_fp:
            raise PositionError(
                f"checkpoint fingerprint ({state.get('fingerprint')!r}) differs from this run's ({legacy_fp!r}): a "
                "checkpoint of an older dcp holds a step index, honoured only with the same config, dataset lengths "
                "and world size; resume with those, or save a new checkpoint with this dcp")
        position = EpochPosition.start(int(state["epoch"]), num_samples)
        position.steps, position.legacy = int(state["step_in_epoch"]), True
        return position, global_step
    if state.get("data") != data:
        raise PositionError(
            f"checkpoint was saved on another dataset (data digest {state.get('data')!r}, this run's {data!r}: "
            "lengths, target counts, shapes or content differ): its samples-done record cannot be honoured; resume "
            "with the dataset it was trained on, or start a new run without loading the manager's state")
    return EpochPosition.from_state(state["position"], num_samples), global_step
