"""``dcp.set_manager``: builds the runtime's DCPManager and wires in what sits above the runtime.

The runtime (``dcp.runtime``) imports neither the profiler nor the integrations; this module, the top of
the package order, injects them: the profile source (``dcp.profiler.source.CachedProfiler``) and, for a
Hugging Face causal LM, the forward, adapter, shape and recompute wrapping of ``dcp.integrations.hf``.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from dcp.config import ConfigError, DCPConfig, ModelShapeConfig, PlanningConfig
from dcp.distributed.device import module_device, resolve_precision
from dcp.integrations import hf
from dcp.integrations.hf_defaults import fit_profiling
from dcp.planner.table import with_engine_state
from dcp.profiler.source import CachedProfiler
from dcp.runtime.compiled import compile_layers
from dcp.runtime.engines import Engine, build_engine
from dcp.runtime.log import get_logger
from dcp.runtime.manager import DCPManager, PlanSource
from dcp.runtime.step import ManagerError

__all__ = ["set_manager"]


def _check_arguments(model: Any, config: Any, table: Any) -> None:
    """set_manager's argument types, each refused with the fix (instead of an AttributeError later), and a
    launched job whose process group was never made (each process would train the whole dataset alone)."""
    launched = os.environ.get("WORLD_SIZE", "1")
    if launched.isdigit() and int(launched) > 1 and not (dist.is_available() and dist.is_initialized()):
        raise ManagerError(
            f"WORLD_SIZE is {launched} (a launcher such as torchrun started {launched} processes) but "
            "torch.distributed is not initialised, so each process would train the whole dataset alone: call "
            "torch.distributed.init_process_group() before set_manager")
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model ({type(model).__name__}) must be a torch.nn.Module: pass the model to train")
    if config is not None and not isinstance(config, DCPConfig):
        hint = ("build it with dcp.config.config_from_dict(...)" if isinstance(config, dict)
                else "load a TOML file with dcp.config.load_config(path)")
        raise TypeError(f"config ({type(config).__name__}) must be a dcp.DCPConfig: {hint}")
    if table is not None and not hasattr(table, "seq_group_edges"):
        hint = ("load it with dcp.planner.table.ProfileTable.load(path)" if isinstance(table, str | bytes)
                or hasattr(table, "__fspath__") else "pass a ProfileTable, or None to profile in this run")
        raise TypeError(f"table ({type(table).__name__}) must be a ProfileTable: {hint}")


def _resolve_config(model: torch.nn.Module, config: DCPConfig | None, integration: Any) -> DCPConfig:
    """The run's config: ``config`` with its ``model`` section derived from the model when left at the
    default (or a whole default config when None); a written one that disagrees with the model's shape, or
    a head count that is not the model's, is refused."""
    derived, source = (integration.shape(), "its Hugging Face config") if integration is not None else (None, "")
    if derived is None and hf.is_hf_model(model):
        derived, source = hf.model_shape(model), "its Hugging Face config"
    if derived is None:
        shape = getattr(getattr(model, "config", None), "shape", None)
        derived, source = (shape(), "model.config.shape()") if callable(shape) else (None, "")
    if config is None:
        if derived is None:
            raise ConfigError(
                "config (None) cannot be derived from this model (it has no config.shape()): pass "
                "dcp.DCPConfig(model=ModelShapeConfig(num_layers=..., hidden_size=..., num_heads=...))"
            )
        # default SP sizes that divide the model's heads (Ulysses shards heads)
        sizes = tuple(p for p in PlanningConfig().sp_sizes if derived.num_heads % p == 0)
        config = DCPConfig(model=derived, planning=PlanningConfig(sp_sizes=sizes))
    elif derived is not None and config.model == ModelShapeConfig():
        config = dataclasses.replace(config, model=derived)  # [model] left at its default: the model's own
    elif derived is not None:  # a written [model]: the planner would price another model than the one trained
        config.model.check_against(derived, source)
    model_config = getattr(model, "config", None)
    heads = getattr(model_config, "num_heads", None) or getattr(model_config, "num_attention_heads", None)
    if isinstance(heads, int) and heads != config.model.num_heads:
        raise ConfigError(
            f"model.num_heads ({config.model.num_heads}) differs from the model's head count ({heads}): "
            "build the config from the model (model.config.shape()) so SP sizes are checked against its heads"
        )
    return config


def _dataset_lengths(dataset: Any) -> list[int]:
    """The dataset's sample lengths for fitting the profile to them; [] when it has none to give (the
    manager's dataset check then names the problem)."""
    try:
        return [int(n) for n in dataset.lengths()]
    except Exception:  # noqa: BLE001 - any failure here is reported by the manager's dataset check
        return []


def _resolve_engine(engine: str | Engine | None, model: torch.nn.Module, config: DCPConfig, optimizer: Any,
                    lr_scheduler: Any, world: int, deepspeed_config: dict[str, Any] | None) -> Engine:
    """A ready engine checked against runtime.precision, or one built by name (default runtime.engine)."""
    if isinstance(engine, Engine):
        eng = engine
        device = getattr(eng, "device", None) or module_device(model)
        want = resolve_precision(config.runtime.precision, device)
        if getattr(eng, "precision", want) != want:
            raise ConfigError(
                f"runtime.precision ({config.runtime.precision!r}, i.e. {want!r} on {device}) differs from the "
                f"engine's ({eng.precision!r}): build the engine with precision=config.runtime.precision"
            )
    else:
        eng = build_engine(engine or config.runtime.engine, model, optimizer, lr_scheduler, world_size=world,
                           deepspeed_config=deepspeed_config, precision=config.runtime.precision)
    return eng


def _check_table(table: Any, model: Any, adapter: Any, config: DCPConfig) -> None:
    """The table's layer count against the model's and, where both are known, its model config hash."""
    from dcp.planner.table import check_table_for_model

    model_hash = None
    try:
        from dcp.profiler.adapters import get_adapter

        model_hash = (adapter if adapter is not None else get_adapter(model)).config_hash()
    except Exception:  # noqa: BLE001 - a model the profiler has no adapter for: the layer count is checked alone
        pass
    check_table_for_model(table, num_layers=config.model.num_layers, model_hash=model_hash,
                          model_name=f"the model ({config.model.name})")


def set_manager(model: torch.nn.Module, dataset: Any, config: DCPConfig | None = None, *, optimizer: Any = None,
                lr_scheduler: Any = None, engine: str | Engine | None = None, table: Any = None,
                plans: PlanSource | None = None, forward_fn: Callable[..., Any] | None = None,
                deepspeed_config: dict[str, Any] | None = None, adapter: Any = None) -> DCPManager:
    """Build the DCP manager for ``model`` on ``dataset`` (call on every rank after init_process_group).

    ``set_manager(model, dataset)`` works with defaults for the reference models and for any Hugging Face
    causal LM routed through transformers' AttentionInterface (:func:`dcp.integrations.hf.for_manager`:
    Ulysses attention, forward, profiler adapter, model shape, and SP sizes fitted to the model). For every
    model, the profile's seq_group edges and micro-batch cap, where the config leaves them at the library
    defaults, are fitted to ``dataset.lengths()`` (:func:`dcp.integrations.hf_defaults.fit_profiling`).

    config: the DCPConfig; its ``model`` section, when left at the default, is derived from the model
    (``model.config.shape()`` for the reference models, the HF config for HF models). optimizer: default
    ``torch.optim.AdamW(model.parameters())`` (torch's defaults). engine: 'ddp' / 'deepspeed' (default
    config.runtime.engine) or a ready Engine. table: a ProfileTable (None: ``init_profiler`` loads the cached
    one or profiles in this run). plans: optional ``epoch -> iterable of StepPlan`` replacing the planner
    (tests, replays). forward_fn: ``(model, batch, ctx) -> (loss_sum, count)`` (default ``model(batch, ctx)``,
    or the HF integration's). adapter: the profiler's ModelAdapter (default: derived from the model; the HF
    integration's for HF models); the profile cache key is built from it.
    """
    _check_arguments(model, config, table)
    if config is not None and config.runtime.compile != "off" and hf.is_hf_model(model):
        # checked before the HF integration touches the model. Its decoder layers take the document layout and
        # the call pattern as Python arguments, on which torch.compile guards: on a tiny Llama they recompiled
        # for every new layout until torch.compile's recompile limit
        raise ConfigError(
            f"runtime.compile ({config.runtime.compile!r}) is for models whose blocks take tensors only (the "
            "reference models): a Hugging Face model's decoder layers would recompile for every document layout; "
            'set runtime.compile = "off"')
    world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    integration = None
    lengths = _dataset_lengths(dataset) if hf.is_hf_model(model) or (table is None and plans is None) else []
    if hf.is_hf_model(model):
        # the HF integration supplies the forward and the profiler adapter (unless given) and fits the config's
        # defaults to the model and the data (raises, naming what to pass, for a model it cannot drive)
        parts = hf.for_manager(model, lengths, config, forward_fn=forward_fn, adapter=adapter, world_size=world)
        config, forward_fn, adapter, integration = parts.config, parts.forward_fn, parts.adapter, parts.integration
        config = _resolve_config(model, config, integration)
    else:
        # profile edges and micro-batch cap left at the library defaults (512 .. 4096 tokens) fitted to the
        # data's lengths, as for HF models: a first run profiles only lengths its samples have. Only where this
        # run profiles: a given table or plans fix the edges they were made with (lengths is [] then)
        config = _resolve_config(model, config, integration)
        fitted = fit_profiling(config.profiling, lengths)
        # a table cached for the unfitted config (``dcp profile`` has no data to fit to) is used as it is
        # (need_profile: a collective lookup, rank 0's answer on every rank)
        if fitted != config.profiling and CachedProfiler().need_profile(model if adapter is None else adapter, config, world):
            config = config.replace(profiling=fitted)
    name = engine.name if isinstance(engine, Engine) else engine or config.runtime.engine
    if table is not None:  # a table of another model (depth, width) would price every step wrongly
        _check_table(table, model, adapter, config)
        table = with_engine_state(table, config.model, name, world)  # M_C with the state this engine holds
    # before the engine wraps the model and before profiling: the table then prices the compiled layers
    compile_layers(model, config.runtime.compile)
    if optimizer is None and not isinstance(engine, Engine):
        optimizer = torch.optim.AdamW(model.parameters())
        rank = dist.get_rank() if world > 1 else 0
        if rank == 0:  # one line per job, as the manager's other one-time messages (every rank builds the same)
            get_logger(rank).info(
                "set_manager: no optimizer given, using torch.optim.AdamW(model.parameters()) with torch's defaults")
    if not isinstance(engine, Engine) and name.startswith("fsdp2") and table is None and plans is None:
        # fully_shard turns the layers' parameters into shards gathered over every rank in each forward, and the
        # dual-layer profiler times single layers on their own: the profile (cached, or measured in this run)
        # is taken while the model is whole, then the engine shards it
        mgr = DCPManager(model, dataset, config, None, forward_fn=forward_fn, adapter=adapter,
                         profiler=CachedProfiler())
        mgr.init_profiler()
        mgr.bind_engine(_resolve_engine(name, model, config, optimizer, lr_scheduler, world, deepspeed_config))
    else:
        eng = _resolve_engine(engine, model, config, optimizer, lr_scheduler, world, deepspeed_config)
        mgr = DCPManager(model, dataset, config, eng, table=table, plans=plans, forward_fn=forward_fn,
                         adapter=adapter, profiler=CachedProfiler())
    if integration is not None:
        integration.attach(mgr)
    return mgr
