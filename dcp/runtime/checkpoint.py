"""The manager's checkpoint state: where the run is in the data, as which samples of the epoch are trained
(dcp.runtime.position), and a digest of the dataset that refuses a resume on other data.

A resume under another profile table, planner version or world size is honoured: the samples the epoch has
not trained yet are planned again and each is trained once.

``save_checkpoint`` / ``load_checkpoint`` keep a whole run (model, optimizer, LR scheduler and this position) in
one folder through torch's distributed checkpoint (``torch.distributed.checkpoint``): with the fsdp2 engine each
rank writes only its own parameter and optimizer shards, and a load reshards them onto any world size (the
files hold each shard's offsets in the full tensor, so W=2 resumes on 1 or 3 ranks, or under ddp). The
DeepSpeed engine saves through its own ``save_checkpoint``.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from dcp.config import DCPConfig
from dcp.runtime.position import EpochPosition, PositionError, plan_inputs, segment_key
from dcp.validate import fail

STATE_FILE = "dcp_state.pt"
"""The file of a checkpoint folder that holds the data position and the LR scheduler (written by rank 0); the
sharded model and optimizer lie beside it in torch's distributed-checkpoint files (``*.distcp``, ``.metadata``)."""


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


def _engine_state(mgr: Any, folder: str) -> Any:
    engine = mgr.engine
    if hasattr(engine, "ds"):
        fail("checkpoint folder", folder, "is for the ddp and fsdp2 engines: the deepspeed engine's state is sharded "
             "by DeepSpeed itself", "save with mgr.engine.ds.save_checkpoint(folder) and mgr.state_dict()",
             error=PositionError)
    return engine


def save_checkpoint(mgr: Any, folder: str | os.PathLike[str]) -> None:
    """Save the run in ``folder`` (created): model and optimizer through ``torch.distributed.checkpoint``
    (collective: every rank calls it; fsdp2 ranks write their own shards), the data position and the LR
    scheduler in ``STATE_FILE``. Call it between steps (after ``get_data_iter(max_steps=...)`` returns)."""
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dist_cp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    folder = os.fspath(folder)
    engine = _engine_state(mgr, folder)
    # the sharded (DTensor) state of fsdp2 as it is, with no gather: each rank's writer saves its local shards
    # and the metadata records where each one sits in the full tensor; ddp's replicated tensors are written once
    model_state, optim_state = get_state_dict(engine.module, engine.optimizer)
    dist_cp.save({"model": model_state, "optimizer": optim_state}, checkpoint_id=folder)
    if not dist.is_initialized() or dist.get_rank() == 0:
        sched = engine.lr_scheduler
        torch.save({"dcp": mgr.state_dict(), "scheduler": sched.state_dict() if sched is not None else None,
                    "world_size": mgr.world_size, "engine": engine.name}, os.path.join(folder, STATE_FILE))
    if dist.is_initialized():
        dist.barrier()  # the folder is complete on return, on every rank


def load_checkpoint(mgr: Any, folder: str | os.PathLike[str]) -> dict[str, Any]:
    """Load a ``save_checkpoint`` folder into this run, at any world size (collective: every rank calls it,
    after ``set_manager`` and before ``get_data_iter``). Returns what ``STATE_FILE`` held: the position
    (``"dcp"``), the world size and engine it was saved with. The epoch's untrained samples are planned again
    when the world size changed (``DCPManager.load_state_dict``), each trained once."""
    import torch
    import torch.distributed.checkpoint as dist_cp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    folder = os.fspath(folder)
    engine = _engine_state(mgr, folder)
    path = os.path.join(folder, STATE_FILE)
    if not os.path.isfile(path) or not os.path.isfile(os.path.join(folder, ".metadata")):
        fail("checkpoint folder", folder, f"holds no {STATE_FILE} and .metadata (not a save_checkpoint folder)",
             "pass a folder written by dcp.runtime.checkpoint.save_checkpoint", error=PositionError)
    saved = torch.load(path, weights_only=True)  # plain data only: no code runs from a checkpoint file
    mgr.load_state_dict(saved["dcp"])  # first: a position this run cannot honour fails before any tensor moves
    # this run's own (possibly sharded) state is the template: the load fills each rank's shards from whichever
    # saved shards overlap them, so the saving world size does not matter
    model_state, optim_state = get_state_dict(engine.module, engine.optimizer)
    state = {"model": model_state, "optimizer": optim_state}
    dist_cp.load(state, checkpoint_id=folder)
    set_state_dict(engine.module, engine.optimizer, model_state_dict=state["model"],
                   optim_state_dict=state["optimizer"])
    if engine.lr_scheduler is not None and saved["scheduler"] is not None:
        engine.lr_scheduler.load_state_dict(saved["scheduler"])
    return saved
