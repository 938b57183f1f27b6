"""The manager's checkpoint state: where the run is in the data, and a fingerprint that refuses a resume
under another config, dataset or world size (the remaining data order would differ).

Model, optimizer and scheduler states are saved by the caller (or the DeepSpeed engine).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from dcp.config import DCPConfig
from dcp.runtime.step import ManagerError


@dataclass(frozen=True, slots=True)
class Position:
    """Where the run is: the epoch, the steps of it already done, and the optimizer steps so far."""

    epoch: int
    step_in_epoch: int
    global_step: int


def fingerprint(config: DCPConfig, lengths: list[int], world_size: int, shapes: Any) -> str:
    """16 hex digits over the config, the dataset lengths (and 2D shapes) and the world size."""
    text = config.to_json() + repr(lengths) + f"w{world_size}"
    if shapes is not None:
        text += repr([tuple(s) for s in shapes])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def state_dict(position: Position, fp: str) -> dict[str, Any]:
    return {"epoch": position.epoch, "step_in_epoch": position.step_in_epoch,
            "global_step": position.global_step, "fingerprint": fp}


def load_state_dict(state: dict[str, Any], fp: str) -> Position:
    """The position saved in ``state``; raises ManagerError when its fingerprint is not this run's."""
    if state.get("fingerprint") != fp:
        raise ManagerError(
            f"checkpoint fingerprint ({state.get('fingerprint')!r}) differs from this run's "
            f"({fp!r}): resume with the same config, dataset lengths and world size, "
            "or the remaining data order would differ"
        )
    return Position(epoch=int(state["epoch"]), step_in_epoch=int(state["step_in_epoch"]),
                    global_step=int(state["global_step"]))
