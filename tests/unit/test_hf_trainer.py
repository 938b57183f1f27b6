"""DCPTrainer (dcp.hf_trainer) on one process: a Trainer script's DCP twin trains a tiny Llama with its losses
logged through Trainer, takes the plain Trainer's optimizer steps, saves and resumes DCP's position with every
token trained once, refuses the Trainer settings DCP replaces in one line each; the twins differ by <= 3 lines."""

from __future__ import annotations

import difflib
import math
import sys
from pathlib import Path

import pytest

import dcp
from dcp.config import ConfigError, PlanningConfig, ProfilingConfig

transformers = pytest.importorskip("transformers")
pytest.importorskip("datasets")
pytest.importorskip("accelerate")  # transformers.Trainer needs it on torch
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples"))
import hf_trainer  # noqa: E402
import hf_trainer_plain  # noqa: E402

from dcp.hf_trainer import DCP_STATE_FILE, DCPTrainer  # noqa: E402

SAMPLES, MAX_LEN = 16, 256
CONFIG = dcp.DCPConfig(profiling=ProfilingConfig(seq_group_edges=(128, 256), max_micro_batch_size=4),
                       planning=PlanningConfig(sp_sizes=(1, 2)))


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    """One working folder for the module: the profile table is cached in its ./.dcp_cache after the first run."""
    return tmp_path_factory.mktemp("dcp_trainer")


def losses(history):
    return [h["loss"] for h in history if "loss" in h]


def test_the_dcp_twin_trains_and_takes_the_plain_trainers_steps(cache_dir, monkeypatch):
    monkeypatch.chdir(cache_dir)
    dcp_history = hf_trainer.train(0, 1, str(cache_dir / "dcp"), SAMPLES, MAX_LEN, config=CONFIG)
    plain_history = hf_trainer_plain.train(0, 1, str(cache_dir / "plain"), SAMPLES, MAX_LEN)
    dcp_losses, plain_losses = losses(dcp_history), losses(plain_history)
    assert all(math.isfinite(x) for x in dcp_losses) and dcp_losses[-1] < dcp_losses[0]
    assert all("dcp_groups" in h and "learning_rate" in h for h in dcp_history)  # one Trainer log per step
    # the rule: DCP's steps hold the global batch's tokens (samples x the mean length), the epoch's mean within
    # 5% of it, so its step count is the plain Trainer's within 10% (+1 for a short last step)
    assert abs(len(dcp_losses) - len(plain_losses)) <= 1 + 0.1 * len(plain_losses)
    # DCP starts from the same schedule: the first step at the full learning rate, decaying linearly to 0
    assert dcp_history[0]["learning_rate"] == pytest.approx(1e-3) and dcp_history[-1]["learning_rate"] > 0


def test_trainers_global_batch_becomes_samples_per_step_unless_the_config_states_a_batch(tmp_path):
    from transformers import TrainingArguments

    from dcp.integrations.hf_zoo import tiny_causal_lm

    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=3, gradient_accumulation_steps=2,
                             report_to=[], use_cpu=True)
    model = tiny_causal_lm("llama", layers=1)
    assert DCPTrainer(model=model, args=args, dcp_config=CONFIG)._config_for().planning.samples_per_step == 6
    for stated in (dict(samples_per_step=5), dict(tokens_per_step=900)):
        config = CONFIG.replace(planning=PlanningConfig(sp_sizes=(1, 2), **stated))
        planning = DCPTrainer(model=model, args=args, dcp_config=config)._config_for().planning
        assert (planning.samples_per_step, planning.tokens_per_step) == (stated.get("samples_per_step", 0),
                                                                          stated.get("tokens_per_step", 0))


def test_a_checkpoint_holds_the_position_and_the_resumed_run_trains_every_token_once(cache_dir, monkeypatch):
    from transformers import TrainingArguments

    from dcp.integrations.hf_zoo import tiny_causal_lm

    monkeypatch.chdir(cache_dir)
    ds = hf_trainer.byte_dataset(SAMPLES, MAX_LEN)
    total = sum(len(ids) for ids in ds["input_ids"])

    def trainer(out, **kw):
        args = TrainingArguments(output_dir=out, per_device_train_batch_size=2, gradient_accumulation_steps=2,
                                 learning_rate=1e-3, logging_steps=1, save_strategy="steps", save_steps=2,
                                 num_train_epochs=1, report_to=[], use_cpu=True, disable_tqdm=True, **kw)
        return DCPTrainer(model=tiny_causal_lm("llama"), args=args, train_dataset=ds,
                          data_collator=hf_trainer.pad, dcp_config=CONFIG)

    out = str(cache_dir / "ckpt")
    first = trainer(out, max_steps=2)
    first.train()
    folder = Path(out) / "checkpoint-2"
    assert (folder / DCP_STATE_FILE).is_file() and (folder / "optimizer.pt").is_file()
    done = [s.tokens for s in first.dcp_manager.step_stats]
    second = trainer(out)
    second.train(resume_from_checkpoint=True)
    rest = [s.tokens for s in second.dcp_manager.step_stats]
    assert len(done) == 2 and rest and sum(done) + sum(rest) == total  # every sample of the epoch once
    assert second.state.global_step == 2 + len(rest)
    (folder / DCP_STATE_FILE).unlink()  # now a plain Trainer checkpoint
    with pytest.raises(ConfigError, match=rf"resume_from_checkpoint \('.*checkpoint-2'\) holds no {DCP_STATE_FILE}"):
        trainer(out).train(resume_from_checkpoint=str(folder))


@pytest.mark.parametrize("setting, match", [
    (dict(torch_compile=True), r"TrainingArguments.torch_compile \(True\) .*: set torch_compile=False"),
    (dict(train_sampling_strategy="group_by_length"),
     r"TrainingArguments.train_sampling_strategy \('group_by_length'\) .*orders the train data"),
    (dict(dataloader_drop_last=True), r"TrainingArguments.dataloader_drop_last \(True\) .*never drops"),
    (dict(gradient_checkpointing=True), r"gradient checkpointing \(True\) .*recomputed layers"),
    ("model", r"gradient checkpointing \(True\) .*gradient_checkpointing_enable"),
])
def test_settings_dcp_replaces_are_refused_in_one_line(tmp_path, setting, match):
    from transformers import TrainingArguments

    from dcp.integrations.hf_zoo import tiny_causal_lm

    model = tiny_causal_lm("llama", layers=1)
    if setting == "model":
        model.gradient_checkpointing_enable()
        setting = {}
    args = TrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True, **setting)
    with pytest.raises(ConfigError, match=match) as err:
        DCPTrainer(model=model, args=args, dcp_config=CONFIG)
    assert "\n" not in str(err.value)
    with pytest.raises(TypeError, match=r"dcp_config \('dict'\) must be a dcp.DCPConfig"):
        DCPTrainer(model=model, args=TrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True),
                   dcp_config={})


def _code(name: str) -> list[str]:
    text = (ROOT / "examples" / name).read_text()
    return text[text.index('"""', 3) + 3:].splitlines()  # without the module docstring


def test_the_trainer_example_changes_at_most_three_lines():
    diff = [line for line in difflib.unified_diff(_code("hf_trainer_plain.py"), _code("hf_trainer.py"), lineterm="", n=0)
            if line[:1] in "+-" and line[:3] not in ("+++", "---")]
    added = [line[1:] for line in diff if line.startswith("+")]
    assert len(added) <= 3 and len(diff) - len(added) <= len(added)  # changed or added lines, nothing else removed
    assert all("# DCP" in line for line in added)
    assert any("DCPTrainer(" in line and "dcp_config=config" in line for line in added)


def test_the_trainers_steps_equal_dcps_own_loop_on_the_same_plans(cache_dir, monkeypatch):
    import torch
    from transformers import TrainingArguments, get_linear_schedule_with_warmup

    from dcp.integrations.hf import TokenDataset
    from dcp.integrations.hf_zoo import tiny_causal_lm

    monkeypatch.chdir(cache_dir)
    ds = hf_trainer.byte_dataset(SAMPLES, MAX_LEN)
    args = TrainingArguments(output_dir=str(cache_dir / "own"), per_device_train_batch_size=2, learning_rate=1e-3,
                             gradient_accumulation_steps=2, num_train_epochs=1, logging_steps=1, save_strategy="no",
                             report_to=[], use_cpu=True, disable_tqdm=True)
    trainer = DCPTrainer(model=tiny_causal_lm("llama"), args=args, train_dataset=ds, data_collator=hf_trainer.pad,
                         dcp_config=CONFIG)
    trainer.train()
    got = [s.loss for s in trainer.dcp_manager.step_stats]
    # DCP's own loop with the config and profile table DCPTrainer used, Trainer's AdamW (weight decay 0) and linear schedule
    model = tiny_causal_lm("llama")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    scheduler = get_linear_schedule_with_warmup(optimizer, 0, len(got))
    mgr = dcp.set_manager(model, TokenDataset(ds), trainer.dcp_manager.config, optimizer=optimizer,
                          lr_scheduler=scheduler, table=trainer.dcp_manager.table)  # the same plans
    for batch in mgr.get_data_iter():
        mgr.optimize_dynamics(batch, mgr.engine)
        loss = mgr.engine(batch)
        mgr.engine.backward(loss)
        mgr.engine.step()
    want = [s.loss for s in mgr.step_stats]
    assert len(got) >= 2 and got == pytest.approx(want, rel=1e-6, abs=0)
    assert [s.summary for s in trainer.dcp_manager.step_stats] == [s.summary for s in mgr.step_stats]
    # Trainer turned use_cache off on its model; the profile cache key ignores it (one table for both)
    assert trainer.model.config.use_cache is False and model.config.use_cache is True
    # evaluation is Trainer's own (padded batches of per_device_eval_batch_size = 8): the trained model's mean
    # batch loss equals an unmodified copy's on the same batches
    reference = tiny_causal_lm("llama")
    reference.load_state_dict(trainer.model.state_dict())
    with torch.no_grad():
        want_eval = sum(reference(**hf_trainer.pad([ds[i] for i in range(j, j + 8)])).loss.item()
                        for j in range(0, SAMPLES, 8)) / (SAMPLES // 8)
    assert trainer.evaluate(eval_dataset=ds)["eval_loss"] == pytest.approx(want_eval, rel=1e-4)
