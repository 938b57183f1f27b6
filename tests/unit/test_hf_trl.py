"""TRL's SFTTrainer with DCP's loop (``DCPTrainerMixin``) on one process: on a tokenized dataset it trains the
steps of DCP's own loop on the same plans (equal losses), a completion mask that SFTTrainer turns into labels decides which
tokens DCP trains, and the SFTConfig settings DCP replaces are refused in one line each."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import dcp
from dcp.config import ConfigError, PlanningConfig, ProfilingConfig

pytest.importorskip("transformers")
pytest.importorskip("datasets")
pytest.importorskip("accelerate")
trl = pytest.importorskip("trl")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import hf_trainer  # noqa: E402

from dcp.hf_trainer import DCPTrainerMixin  # noqa: E402

SAMPLES, MAX_LEN = 12, 256
CONFIG = dcp.DCPConfig(profiling=ProfilingConfig(seq_group_edges=(128, 256), max_micro_batch_size=4),
                       planning=PlanningConfig(sp_sizes=(1, 2)))


class DCPSFTTrainer(DCPTrainerMixin, trl.SFTTrainer):
    pass


def byte_tokenizer():
    """A tokenizer with the pad and EOS tokens SFTTrainer asks for (the data is tokenized already: nothing is
    downloaded)."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    vocab = models.WordLevel({"<pad>": 0, "<eos>": 1}, unk_token="<pad>")
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(vocab), pad_token="<pad>", eos_token="<eos>")


def sft_config(out, **kw):
    # SFTConfig turns gradient checkpointing and bf16 on by default; DCP chooses recompute, and fp32 is the
    # precision DCP's own loop runs at on CPU
    settings = dict(output_dir=str(out), per_device_train_batch_size=2, gradient_accumulation_steps=2,
                    learning_rate=1e-3, num_train_epochs=1, logging_steps=1, save_strategy="no", report_to=[],
                    use_cpu=True, disable_tqdm=True, gradient_checkpointing=False, bf16=False, max_length=MAX_LEN)
    return trl.SFTConfig(**{**settings, **kw})


def test_sft_trainer_with_dcp_trains_the_steps_of_dcps_own_loop(tmp_path, monkeypatch):
    import torch
    from transformers import get_linear_schedule_with_warmup

    from dcp.integrations.hf import TokenDataset
    from dcp.integrations.hf_zoo import tiny_causal_lm

    monkeypatch.chdir(tmp_path)
    ds = hf_trainer.byte_dataset(SAMPLES, MAX_LEN)
    sft = DCPSFTTrainer(model=tiny_causal_lm("llama"), args=sft_config(tmp_path / "sft"), train_dataset=ds,
                        processing_class=byte_tokenizer(), dcp_config=CONFIG)
    sft.train()
    got = sft.dcp_manager.step_stats
    # DCP's own loop on the raw tokenized rows, with the config and profile table the SFT run used (the same
    # plans), Trainer's AdamW (weight decay 0) and linear schedule
    model = tiny_causal_lm("llama")
    model.config.pad_token_id = sft.model.config.pad_token_id  # what SFTTrainer set from the tokenizer
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    mgr = dcp.set_manager(model, TokenDataset(ds), sft.dcp_manager.config, optimizer=optimizer,
                          table=sft.dcp_manager.table, lr_scheduler=get_linear_schedule_with_warmup(optimizer, 0, len(got)))
    for batch in mgr.get_data_iter():
        mgr.train_micro_batch(batch)
    want = mgr.step_stats
    assert len(got) >= 2 and [s.summary for s in got] == [s.summary for s in want]
    assert [s.loss for s in got] == pytest.approx([s.loss for s in want], rel=1e-6, abs=0)
    assert [h["loss"] for h in sft.state.log_history if "loss" in h] == [s.loss for s in got]  # logged by Trainer


def test_sft_completion_mask_decides_the_tokens_dcp_trains(tmp_path, monkeypatch):
    from dcp.integrations.hf_zoo import tiny_causal_lm

    monkeypatch.chdir(tmp_path)
    ds = hf_trainer.byte_dataset(SAMPLES, MAX_LEN)
    # the first half of each sample is its prompt: SFTTrainer labels it -100 (completion_only_loss)
    ds = ds.map(lambda row: {"completion_mask": [int(i >= len(row["input_ids"]) // 2)
                                                 for i in range(len(row["input_ids"]))]})
    trainer = DCPSFTTrainer(model=tiny_causal_lm("llama"), args=sft_config(tmp_path, completion_only_loss=True,
                                                                           max_steps=1),
                            train_dataset=ds, processing_class=byte_tokenizer(), dcp_config=CONFIG)
    trainer.train()
    # a target is the next token's label: a sample of n tokens has n - n // 2 completion labels, all targets
    # (the first of them is the prompt's last position's target)
    want = [len(ids) - len(ids) // 2 for ids in ds["input_ids"]]
    assert list(trainer.dcp_manager.target_counts) == want
    assert len(trainer.dcp_manager.step_stats) == 1


@pytest.mark.parametrize("setting, match", [
    (dict(packing=True), r"SFTConfig.packing \(True\) conflicts with DCP, .*: set packing=False"),
    (dict(loss_type="dft"), r"SFTConfig.loss_type \('dft'\) .*: set loss_type=\"nll\""),
    (dict(activation_offloading=True), r"SFTConfig.activation_offloading \(True\) .*recomputed layers"),
    (dict(gradient_checkpointing=True), r"gradient checkpointing \(True\) .*set gradient_checkpointing=False"),
    (dict(use_cpu=False, fp16=True), r"TrainingArguments.fp16 \(True\) .*: set fp16=False"),
])
def test_sft_settings_dcp_replaces_are_refused_in_one_line(tmp_path, setting, match):
    from dcp.integrations.hf_zoo import tiny_causal_lm

    ds = hf_trainer.byte_dataset(2, 64)
    try:
        args = sft_config(tmp_path, **setting)
    except ValueError as err:  # fp16 needs a GPU: checked by TrainingArguments on a machine without one
        pytest.skip(f"SFTConfig refused it first: {err}")
    with pytest.raises(ConfigError, match=match) as err:
        DCPSFTTrainer(model=tiny_causal_lm("llama", layers=1), args=args, train_dataset=ds,
                      processing_class=byte_tokenizer(), dcp_config=CONFIG)
    assert "\n" not in str(err.value)


def test_trainers_bf16_sets_dcps_precision_unless_the_config_does(tmp_path):
    from dcp.config import RuntimeConfig
    from dcp.integrations.hf_zoo import tiny_causal_lm

    ds, model = hf_trainer.byte_dataset(2, 64), tiny_causal_lm("llama", layers=1)

    def precision(bf16, config):
        trainer = DCPSFTTrainer(model=model, args=sft_config(tmp_path, bf16=bf16), train_dataset=ds,
                                processing_class=byte_tokenizer(), dcp_config=config)
        return trainer._config_for().runtime.precision

    assert (precision(True, CONFIG), precision(False, CONFIG)) == ("bf16", "fp32")
    assert precision(True, CONFIG.replace(runtime=RuntimeConfig(precision="fp32"))) == "fp32"


def test_the_installed_trl_is_at_least_the_declared_floor():
    import re
    from importlib.metadata import version

    toml = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    (floor,) = set(re.findall(r'"trl>=([0-9.]+)"', toml))

    def parse(v):
        return tuple(int(x) for x in re.findall(r"\d+", v)[:3])

    assert parse(version("trl")) >= parse(floor)
