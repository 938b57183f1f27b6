"""``DCPTrainer``: a ``transformers.Trainer`` whose training loop is DCP's.

A Trainer script becomes a DCP one by its class name and one argument::

    trainer = DCPTrainer(model=model, args=args, train_dataset=ds, data_collator=pad, dcp_config=dcp.DCPConfig())

A subclass of Trainer (TRL's ``SFTTrainer``) gets the same loop from ``DCPTrainerMixin``::

    class DCPSFTTrainer(DCPTrainerMixin, SFTTrainer):
        pass

It sits above ``dcp.api`` in the package order (docs/architecture.md): it builds its manager with ``set_manager``.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any

import torch
import torch.distributed as dist
from transformers import Trainer, TrainerState
from transformers.trainer_callback import ExportableState
from transformers.trainer_utils import rotate_checkpoints

from dcp.api import set_manager
from dcp.config import ConfigError, DCPConfig, RuntimeConfig
from dcp.integrations.hf_data import TokenDataset
from dcp.runtime import checkpoint as ckpt
from dcp.runtime.position import EpochPosition
from dcp.validate import fail

__all__ = ["DCPTrainer", "DCPTrainerMixin", "DCP_STATE_FILE", "steps_left"]

DCP_STATE_FILE = "dcp_state.pt"
"""The manager's position in the data (``DCPManager.state_dict()``), saved beside Trainer's checkpoint files."""


def steps_left(mgr: Any) -> int:
    """Optimizer steps ``mgr.get_data_iter()`` runs before its current epoch ends: the rest of a resumed epoch's
    saved plan, or, when the checkpoint's plan inputs differ from this run's (world size, profile table, config),
    its untrained samples planned again (dcp.runtime.checkpoint.resume decides which, on a copy of the position:
    the run's own resume still logs it). Plans the epoch on every rank alike; no collective."""
    if mgr.table is None:
        mgr.init_profiler()  # collective, as get_data_iter's would be
    state = mgr.state_dict()
    position = EpochPosition.from_state(state["position"], len(mgr.lengths))
    plans = ckpt.resume(position, state["data"], mgr.table, mgr.config, mgr.world_size,
                        lambda ids: mgr.epoch_plans(mgr.epoch, ids, keep=True))  # the loop takes them
    return sum(1 for _ in plans)


def _refuse(args: Any, model: Any) -> None:
    """Trainer settings that DCP's loop replaces, each refused in one line naming the setting and the fix."""
    if args.torch_compile:
        fail("TrainingArguments.torch_compile", True, "is not supported by DCPTrainer (a Hugging Face model's "
             "layers would recompile for every document layout DCP packs)", "set torch_compile=False")
    if getattr(args, "group_by_length", False):  # transformers < 5
        fail("TrainingArguments.group_by_length", True, "conflicts with DCP, which orders the train data itself "
             "(it groups samples by length per step)", "set group_by_length=False")
    strategy = getattr(args, "train_sampling_strategy", "random")  # transformers >= 5
    if strategy != "random":
        fail("TrainingArguments.train_sampling_strategy", strategy, "conflicts with DCP, which orders the train "
             "data itself (a seeded shuffle per epoch, samples grouped by length per step)",
             'leave it at "random" (the seed is planning.seed)')
    if args.dataloader_drop_last:
        fail("TrainingArguments.dataloader_drop_last", True, "conflicts with DCP, which trains every sample of "
             "an epoch exactly once and never drops a batch", "set dataloader_drop_last=False")
    on_model = getattr(model, "is_activation_checkpointing", None)  # transformers >= 5; before, the older name
    on_model = on_model if on_model is not None else getattr(model, "is_gradient_checkpointing", False)
    if args.gradient_checkpointing or on_model:
        fail("gradient checkpointing", True, "conflicts with DCP, which chooses the recomputed layers per "
             "micro-batch", "set gradient_checkpointing=False and do not call model.gradient_checkpointing_enable()")
    if args.deepspeed:
        fail("TrainingArguments.deepspeed", args.deepspeed, "is not supported by DCPTrainer (DCP runs the engine)",
             'drop it and set DCPConfig(runtime=RuntimeConfig(engine="deepspeed")) for ZeRO-1')
    if args.fp16:
        fail("TrainingArguments.fp16", True, "is not supported by DCPTrainer (DCP computes in bf16 or fp32)",
             "set fp16=False, and bf16=True for bf16 (or DCPConfig(runtime=RuntimeConfig(precision=...)))")
    # TRL's SFTConfig (getattr: a TrainingArguments has none of these)
    if getattr(args, "packing", False):
        fail("SFTConfig.packing", True, "conflicts with DCP, which packs each micro-batch's samples itself (as "
             "documents: attention stays inside each, and a sample is never cut)", "set packing=False")
    if getattr(args, "loss_type", "nll") != "nll":
        fail("SFTConfig.loss_type", args.loss_type, "is not supported by DCPTrainer (DCP's loss is the token-"
             "weighted negative log-likelihood)", 'set loss_type="nll"')
    if getattr(args, "activation_offloading", False):
        fail("SFTConfig.activation_offloading", True, "conflicts with DCP, which chooses the recomputed layers per "
             "micro-batch to fit the memory", "set activation_offloading=False")


class DCPTrainerMixin:
    """DCP's training loop for ``transformers.Trainer`` or a subclass of it (listed before it in the bases): each
    step's lengths choose its SP sizes, micro-batches, gradient-accumulation steps and recompute.

    Why a subclass that replaces ``train()``'s loop rather than a callback or a ``training_step`` override:
    Trainer's inner loop fixes what DCP must decide per step. Its dataloader yields ``per_device_train_batch_size``
    padded samples per rank, its accumulation counts ``gradient_accumulation_steps`` micro-batches on every rank
    alike, and DDP syncs gradients on each rank's last one; DCP's ranks run different numbers of micro-batches
    (a rank may run none in a step) in SP groups that change per step, with one token-weighted gradient sync per
    step (its engine). A callback cannot change any of that, and a ``training_step`` override would still run
    under Trainer's counting. So ``train()`` drives DCP's own loop (``get_data_iter`` / ``optimize_dynamics`` /
    the engine) and keeps Trainer for the rest: ``TrainingArguments``, the optimizer and LR scheduler it creates
    (the scheduler steps once per optimizer step, inside the engine's update), ``self.log`` and the callbacks'
    ``on_train_begin`` / ``on_step_end`` / ``on_epoch_end`` / ``on_train_end``, ``save_steps`` checkpoints (which
    also hold DCP's position in the data) and evaluation (``evaluate()``, untouched: plain batches).

    Trainer's global batch (``per_device_train_batch_size x gradient_accumulation_steps x world size`` samples)
    becomes planning.samples_per_step unless the DCP config sets samples_per_step or tokens_per_step: DCP's steps
    then hold that many samples of the mean length in tokens, so an epoch takes about as many optimizer steps as
    Trainer's, while each step's sample count follows its lengths. Trainer's ``bf16`` sets runtime.precision
    ("bf16", else "fp32") unless the DCP config sets it.

    A subclass's own data preparation runs as before (TRL's ``SFTTrainer`` builds ``labels`` from its completion
    or assistant masks and truncates to ``max_length``); DCP then trains the prepared ``train_dataset``'s
    ``input_ids`` with its ``labels`` (-100 is not trained). Its ``compute_loss`` and ``training_step`` are not
    called: DCP's forward computes the loss.
    """

    def __init__(self, *args: Any, dcp_config: DCPConfig | None = None, **kwargs: Any) -> None:
        if dcp_config is not None and not isinstance(dcp_config, DCPConfig):
            fail("dcp_config", type(dcp_config).__name__, "must be a dcp.DCPConfig",
                 "pass dcp.DCPConfig(...) or dcp.load_config(path)", error=TypeError)
        given = kwargs.get("args", args[1] if len(args) > 1 else None)
        if given is not None:  # before the parent's own set-up (SFTTrainer's data preparation, its offloading)
            _refuse(given, kwargs.get("model", args[0] if args else None))
        super().__init__(*args, **kwargs)
        _refuse(self.args, self.model)  # the arguments the parent settled (SFTConfig's defaults)
        self.dcp_config = dcp_config or DCPConfig()
        self.dcp_manager: Any = None
        """The DCPManager of the last ``train()`` (None before)."""
        self._lr_used: dict[int, float] = {}
        """global step -> the LR it ran with (its StepStats is logged one step late, after the scheduler moved)."""

    def _world_size(self) -> int:
        return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1

    def _config_for(self) -> DCPConfig:
        """dcp_config with Trainer's global batch (in samples) and logging interval where the config leaves
        them at DCP's defaults."""
        cfg = self.dcp_config
        if not (cfg.planning.tokens_per_step or cfg.planning.samples_per_step):
            samples = self.args.per_device_train_batch_size * self.args.gradient_accumulation_steps * self._world_size()
            cfg = dataclasses.replace(cfg, planning=dataclasses.replace(cfg.planning, samples_per_step=samples))
        if cfg.runtime.precision == RuntimeConfig().precision:
            precision = "bf16" if self.args.bf16 else "fp32"  # as Trainer would compute
            cfg = dataclasses.replace(cfg, runtime=dataclasses.replace(cfg.runtime, precision=precision))
        if cfg.runtime.log_every == RuntimeConfig().log_every and self.args.logging_steps >= 1:
            # a StepStats (the loss over all ranks) every logged step: what self.log reports
            cfg = dataclasses.replace(cfg, runtime=dataclasses.replace(cfg.runtime,
                                                                       log_every=int(self.args.logging_steps)))
        return cfg

    def train(self, resume_from_checkpoint: str | bool | None = None, trial: Any = None,
              ignore_keys_for_eval: list[str] | None = None, **kwargs: Any) -> Any:
        """Train with DCP's loop; ``resume_from_checkpoint`` (a checkpoint folder, or True for the last one in
        output_dir) restores the model, optimizer, scheduler and DCP's position in the data."""
        if self.train_dataset is None:
            fail("train_dataset", None, "is required by DCPTrainer.train", "pass train_dataset=... to DCPTrainer")
        args = self.args
        folder = self._checkpoint_folder(resume_from_checkpoint) if resume_from_checkpoint else None
        data = self.train_dataset if isinstance(self.train_dataset, TokenDataset) else TokenDataset(self.train_dataset)
        config = self._config_for()
        self.create_optimizer()  # Trainer's own (its weight decay groups, args.learning_rate, optim)
        mgr = set_manager(self.model, data, config, optimizer=self.optimizer)
        self.dcp_manager = mgr
        if folder is not None:  # DCP's position first: the steps left depend on it (and on this run's world size)
            saved = torch.load(os.path.join(folder, DCP_STATE_FILE), weights_only=False)
            mgr.load_state_dict(saved["dcp"] if _sharded(folder) else saved)
        # the scheduler's length: the steps DCP will take (plans are the same on every rank); after a resume on
        # another world size (or table, or config) the epoch's untrained samples are planned again, in other steps
        epochs = math.ceil(args.num_train_epochs)
        per_epoch = [steps_left(mgr)] if mgr.epoch < epochs else []
        per_epoch += [sum(1 for _ in mgr.epoch_plans(e)) for e in range(mgr.epoch + 1, epochs)]
        max_steps = args.max_steps if args.max_steps > 0 else mgr.global_step + sum(per_epoch)
        self.create_scheduler(num_training_steps=max_steps, optimizer=self.optimizer)
        mgr.engine.lr_scheduler = self.lr_scheduler  # stepped by the engine after each optimizer update
        exportable = [cb for cb in self.callback_handler.callbacks + [self.control] if isinstance(cb, ExportableState)]
        self.state = TrainerState(stateful_callbacks=exportable, is_local_process_zero=self.is_local_process_zero(),
                                  is_world_process_zero=self.is_world_process_zero())
        self.state.max_steps, self.state.num_train_epochs = max_steps, epochs
        self.state.logging_steps, self.state.save_steps = args.logging_steps, args.save_steps
        if folder is not None:
            self._resume(mgr, folder)
        self.control = self.callback_handler.on_train_begin(args, self.state, self.control)
        logged, self._lr_used = 0, {self.state.global_step + 1: self.lr_scheduler.get_last_lr()[0]}
        while mgr.epoch < epochs and self.state.global_step < max_steps:
            self.control = self.callback_handler.on_epoch_begin(args, self.state, self.control)
            epoch = mgr.epoch
            while mgr.epoch == epoch and self.state.global_step < max_steps:
                # run up to the next save (or the end): get_data_iter stops every rank at the same step boundary
                chunk = max_steps - self.state.global_step
                if args.save_strategy == "steps" and args.save_steps:
                    chunk = min(chunk, int(args.save_steps) - self.state.global_step % int(args.save_steps))
                for batch in mgr.get_data_iter(max_steps=chunk):
                    mgr.optimize_dynamics(batch, mgr.engine)
                    with mgr.profile(batch, mgr.engine):
                        loss = mgr.engine(batch)
                        mgr.engine.backward(loss)
                        mgr.engine.step()
                    logged = self._steps_done(mgr, logged)
                logged = self._steps_done(mgr, logged)  # a rank idle in the chunk's last steps counts them here
                if args.save_strategy == "steps" and args.save_steps and self.state.global_step % int(args.save_steps) == 0:
                    self._save_with_position(mgr)
            self.control = self.callback_handler.on_epoch_end(args, self.state, self.control)
        self.control = self.callback_handler.on_train_end(args, self.state, self.control)
        losses = [s.loss for s in mgr.step_stats if not math.isnan(s.loss)]
        from transformers.trainer_utils import TrainOutput

        return TrainOutput(self.state.global_step, sum(losses) / max(1, len(losses)), {"dcp_steps": sum(per_epoch)})

    def _steps_done(self, mgr: Any, logged: int) -> int:
        """Trainer's step callbacks for every optimizer step DCP finished since the last call (a rank idle in a
        step sees it end inside get_data_iter), and self.log for every new StepStats (one step late: the loss
        over all ranks is exchanged as the next step opens). Returns the StepStats logged so far."""
        while self.state.global_step < mgr.global_step:
            self.state.global_step += 1
            self._lr_used[self.state.global_step + 1] = self.lr_scheduler.get_last_lr()[0]  # the next step's LR
            self.state.epoch = mgr.epoch + mgr.step_in_epoch / max(1, self.state.max_steps)
            self.control = self.callback_handler.on_step_end(self.args, self.state, self.control)
        for stats in mgr.step_stats[logged:]:
            self.log({"loss": stats.loss, "learning_rate": self._lr_used.pop(stats.global_step, float("nan")),
                      "step_tokens": stats.tokens, "dcp_groups": stats.summary})
        return len(mgr.step_stats)

    def _save_with_position(self, mgr: Any) -> None:
        """Trainer's checkpoint (model, optimizer, scheduler, trainer state) plus DCP's position in the data; under
        fsdp2 the model and optimizer are the ranks' shards through torch's distributed checkpoint
        (``dcp.runtime.checkpoint``: each rank writes its own, a resume reshards onto any world size)."""
        folder = os.path.join(self.args.output_dir, f"checkpoint-{self.state.global_step}")
        if mgr.engine.name.startswith("fsdp2"):
            ckpt.save_checkpoint(mgr, folder)  # model, optimizer, scheduler and position
            self._save_rng_state(folder)
            if self.args.should_save:  # the rest of what Trainer's _save_checkpoint writes, and its rotation
                for cb in self.callback_handler.callbacks + [self.control]:
                    if isinstance(cb, ExportableState):
                        name, state = type(cb).__name__, cb.state()
                        saved = self.state.stateful_callbacks.get(name)
                        self.state.stateful_callbacks[name] = [*saved, state] if isinstance(saved, list) else state
                self.state.save_to_json(os.path.join(folder, "trainer_state.json"))
                rotate_checkpoints(output_dir=self.args.output_dir, save_total_limit=self.args.save_total_limit,
                                   best_model_checkpoint=self.state.best_model_checkpoint, use_mtime=True)
            return
        self._save_checkpoint(self.model, trial=None)
        if self.is_world_process_zero():
            torch.save(mgr.state_dict(), os.path.join(folder, DCP_STATE_FILE))

    def _checkpoint_folder(self, checkpoint: str | bool) -> str:
        """The checkpoint folder to resume from, refused (before any training work) when it holds no DCP position."""
        from transformers.trainer_utils import get_last_checkpoint

        folder = get_last_checkpoint(self.args.output_dir) if checkpoint is True else str(checkpoint)
        if folder is None or not os.path.isdir(folder):
            fail("resume_from_checkpoint", checkpoint, "names no checkpoint folder",
                 f"pass a checkpoint-N folder of {self.args.output_dir}", error=ConfigError)
        position = os.path.join(folder, DCP_STATE_FILE)
        if not os.path.isfile(position):
            fail("resume_from_checkpoint", folder, f"holds no {DCP_STATE_FILE} (a plain Trainer checkpoint: it does "
                 "not say which samples were trained)", "resume from a DCPTrainer checkpoint, or load the weights "
                 "with model.from_pretrained(folder) and start a new epoch", error=ConfigError)
        return folder

    def _resume(self, mgr: Any, folder: str) -> None:
        """Model, optimizer and scheduler from Trainer's files, or from a sharded checkpoint (DCP's position is
        loaded already)."""
        sharded = mgr.engine.name.startswith("fsdp2")
        if _sharded(folder) != sharded:
            # Trainer's files hold whole tensors, which a fully_shard'ed model cannot load in place; a sharded
            # folder is loaded through torch's distributed checkpoint, which this trainer does for fsdp2 only
            fail("resume_from_checkpoint", folder, f"was saved {'with' if _sharded(folder) else 'without'} "
                 f"sharding, and this run's runtime.engine is {mgr.engine.name!r}",
                 "resume it under the engine it was saved with (fsdp2 for a folder with .metadata)", error=ConfigError)
        if sharded:
            ckpt.load_checkpoint(mgr, folder)
        else:
            self._load_from_checkpoint(folder)
            self._load_optimizer_and_scheduler(folder)
        saved = TrainerState.load_from_json(os.path.join(folder, "trainer_state.json"))
        self.state.global_step, self.state.log_history = mgr.global_step, saved.log_history


def _sharded(folder: str) -> bool:
    """A checkpoint written through torch's distributed checkpoint (fsdp2), not Trainer's own files."""
    return os.path.isfile(os.path.join(folder, ".metadata"))


class DCPTrainer(DCPTrainerMixin, Trainer):
    """``transformers.Trainer`` with DCP's training loop (``DCPTrainerMixin``)."""
