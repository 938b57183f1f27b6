"""dcp.distributed: backend devices, precision, batch moves, device-side accumulation, and the import layering.

No GPU here: a non-CPU device is faked with 'meta' tensors where the logic only needs "not the CPU".
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from dcp.api import set_manager
from dcp.config import ConfigError, DCPConfig, RuntimeConfig, config_from_dict
from dcp.data import collate_tokens
from dcp.distributed import (
    autocast,
    backend_device,
    compute_dtype,
    device_for_backend,
    module_device,
    move_batch,
    resolve_precision,
)
from dcp.distributed.comm import check_backend_device
from dcp.distributed.device import Span, Stopwatch
from dcp.models import T1DConfig, Transformer1D
from dcp.runtime.data import SyntheticTokenDataset
from dcp.runtime.engines import DDPEngine, EngineError, check_accelerator, deepspeed_config
from dcp.runtime.manager import DCPManager
from dcp.runtime.step import StepTally

DCP = Path(__file__).resolve().parents[2] / "dcp"


@pytest.mark.parametrize(("backend", "kind"), [
    ("gloo", "cpu"), ("GLOO", "cpu"), ("mpi", "cpu"), ("cpu:gloo,cuda:nccl", "cpu"), ("nccl", "cuda"),
    ("cuda:nccl", "cuda"), ("undefined", "cpu"),
])
def test_device_for_backend(backend, kind):
    assert device_for_backend(backend, cuda_index=0).type == kind


def test_backend_device_without_process_group_is_cpu():
    assert backend_device() == torch.device("cpu")


def test_nccl_needs_cuda_parameters():
    check_backend_device("gloo", torch.device("cpu"), "model parameters")
    check_backend_device("nccl", torch.device("cuda", 0), "model parameters")
    with pytest.raises(ValueError, match=r"model parameters \(cpu\) cannot take part in a nccl collective.*cuda"):
        check_backend_device("nccl", torch.device("cpu"), "model parameters")


def test_resolve_precision():
    assert resolve_precision("auto", "cpu") == "fp32"
    assert resolve_precision("auto", torch.device("cuda", 0)) == "bf16"
    assert resolve_precision("bf16", "cpu") == "bf16"
    assert resolve_precision("fp32", "cuda") == "fp32"
    assert compute_dtype("bf16") is torch.bfloat16 and compute_dtype("fp32") is torch.float32
    with pytest.raises(ValueError, match=r"runtime.precision \('fp16'\) is not one of \['auto', 'bf16', 'fp32'\]"):
        resolve_precision("fp16", "cpu")
    with pytest.raises(ValueError, match=r"precision \('auto'\) must be resolved"):
        compute_dtype("auto")


def test_precision_config_is_validated_strictly():
    assert RuntimeConfig().precision == "auto"
    assert config_from_dict({"runtime": {"precision": "bf16"}}).runtime.precision == "bf16"
    with pytest.raises(ConfigError, match=r"runtime.precision \('half'\) is not one of \['auto', 'bf16', 'fp32'\]"):
        RuntimeConfig(precision="half")
    with pytest.raises(ConfigError, match=r"runtime.precision \(16\) must be of type str"):
        config_from_dict({"runtime": {"precision": 16}})


def test_autocast_bf16_on_cpu_keeps_fp32_parameters():
    lin = torch.nn.Linear(4, 4)
    x = torch.randn(2, 4)
    with autocast("bf16", "cpu"):
        y = lin(x)
    assert y.dtype is torch.bfloat16 and lin.weight.dtype is torch.float32
    with autocast("fp32", "cpu"):
        assert lin(x).dtype is torch.float32


def test_move_batch_cpu_is_identity_and_other_devices_move_every_tensor():
    batch = collate_tokens([torch.arange(5), torch.arange(3)], [7, 9])
    assert move_batch(batch, torch.device("cpu")) is batch
    moved = move_batch(batch, torch.device("meta"))  # stands in for a GPU: anything that is not the host
    assert moved.inputs.device.type == "meta" and moved.targets.device.type == "meta"
    assert (moved.seq_lens, moved.sample_ids) == (batch.seq_lens, batch.sample_ids)
    assert move_batch(moved, torch.device("meta")) is moved  # already there: nothing copied
    assert move_batch({"not": "a batch"}, torch.device("meta")) == {"not": "a batch"}


def test_module_device():
    assert module_device(torch.nn.Linear(2, 2)) == torch.device("cpu")
    assert module_device(torch.nn.Linear(2, 2, device="meta")).type == "meta"
    assert module_device(torch.nn.Identity()) == torch.device("cpu")


def test_stopwatch_on_cpu_is_the_host_clock():
    watch = Stopwatch("cpu")
    assert not watch.cuda
    span = watch.stop(watch.start())
    assert isinstance(span, Span) and 0.0 <= span.seconds() < 1.0
    assert Stopwatch(torch.device("cuda", 0)).cuda  # events on CUDA (not exercised without a GPU)


def _meta_manager(precision: str = "auto") -> DCPManager:
    model = Transformer1D(T1DConfig.tiny()).to("meta")
    data = SyntheticTokenDataset([5, 6, 7, 8], vocab_size=model.config.vocab_size)
    engine = DDPEngine(model, torch.optim.SGD(model.parameters(), lr=0.1), precision=precision)
    cfg = DCPConfig(model=model.config.shape(), runtime=RuntimeConfig(precision=precision))
    return DCPManager(model, data, cfg, engine)


def test_manager_accumulates_on_the_run_device():
    # Before: CPU accumulators, so a loss on any other device failed ("Expected all tensors to be on the
    # same device") in _after_forward. Now they live on the engine's device in fp64 / int64.
    mgr = _meta_manager()
    assert mgr.device.type == "meta" and mgr.precision == "fp32"  # 'auto' off CUDA
    loss = torch.zeros((), dtype=torch.bfloat16, device="meta")
    out = mgr.after_forward((loss, torch.zeros((), dtype=torch.int64, device="meta")))  # an EngineHooks call
    assert out is loss
    tally = mgr._idle_tally  # no step is open: the forward is counted in the idle tally
    assert tally.loss.device.type == "meta" and tally.loss.dtype is torch.float64
    assert tally.count.device.type == "meta" and tally.count.dtype is torch.int64
    mgr.after_forward((loss, 3))  # a Python count goes to the device too
    assert tally.count.device.type == "meta" and tally.has_count
    step = StepTally.zeros("meta")  # the tally an open step carries behaves the same
    step.add(loss, 3)
    assert step.loss.device.type == "meta" and step.count.dtype is torch.int64


def test_ready_engine_must_match_the_configured_precision():
    model = Transformer1D(T1DConfig.tiny())
    data = SyntheticTokenDataset([5, 6], vocab_size=model.config.vocab_size)
    engine = DDPEngine(model, torch.optim.SGD(model.parameters(), lr=0.1), precision="fp32")
    cfg = DCPConfig(model=model.config.shape(), runtime=RuntimeConfig(precision="bf16"))
    with pytest.raises(ConfigError, match=r"runtime.precision \('bf16', i.e. 'bf16' on cpu\) differs from the engine's"):
        set_manager(model, data, cfg, engine=engine)


def test_deepspeed_config_precision():
    assert deepspeed_config(2, precision="bf16")["bf16"] == {"enabled": True}
    assert deepspeed_config(2)["bf16"] == {"enabled": False}
    kept = deepspeed_config(2, precision="bf16", user_config={"bf16": {"enabled": True, "immediate_grad_update": True}})
    assert kept["bf16"] == {"enabled": True, "immediate_grad_update": True}
    with pytest.raises(EngineError, match=r"deepspeed config bf16.enabled \(True\) contradicts runtime.precision"):
        deepspeed_config(2, precision="fp32", user_config={"bf16": {"enabled": True}})
    with pytest.raises(EngineError, match=r"deepspeed config fp16.enabled \(True\) contradicts"):
        deepspeed_config(2, precision="bf16", user_config={"fp16": {"enabled": True}})
    with pytest.raises(EngineError, match=r"precision \('auto'\) must be 'bf16' or 'fp32' here"):
        deepspeed_config(2, precision="auto")


def test_deepspeed_accelerator_must_be_the_model_device():
    check_accelerator("cpu", torch.device("cpu"))
    check_accelerator("cuda", torch.device("cuda", 1))
    with pytest.raises(EngineError, match=r"DeepSpeed's accelerator \('cuda'\) differs from the model's device \(cpu\).*"
                                          r"DS_ACCELERATOR=cpu"):
        check_accelerator("cuda", torch.device("cpu"))


def test_cache_key_includes_precision_each_precision_has_its_own_table_and_a_swap_is_stale(tmp_path):
    import dataclasses

    from dcp.planner.table import ProfileRow, ProfileTable, TableMeta
    from dcp.profiler import cache
    from dcp.profiler.dual_layer import cache_key_for

    model = Transformer1D(T1DConfig.tiny())
    fp32 = DCPConfig(model=model.config.shape(), runtime=RuntimeConfig(precision="fp32"))
    bf16 = fp32.replace(runtime=RuntimeConfig(precision="bf16"))
    key32, key16 = cache_key_for(model, fp32, 1), cache_key_for(model, bf16, 1)
    assert (key32.precision, key16.precision) == ("fp32", "bf16")
    assert cache_key_for(model, fp32.replace(runtime=RuntimeConfig()), 1).precision == "fp32"  # auto on CPU
    row = ProfileRow(seq_group=0, seq_len=key32.seq_group_edges[0], micro_batch_size=1, sp_size=1, t_f_s=1e-3,
                     t_b_s=2e-3, m_act_bytes=1e3, m_inp_bytes=1e2, t_const_s=1e-3, m_const_bytes=1e6, num_layers=2)
    meta = TableMeta(model=key32.model, hardware=key32.hardware, dtype=key32.dtype, world_size=key32.world_size,
                     seq_group_edges=tuple(key32.seq_group_edges), version=key32.version)
    path32 = cache.store(ProfileTable([row], meta), tmp_path, key32)
    assert cache.lookup(tmp_path, key32).hit
    # one file per full key: a bf16 run misses (and profiles beside the fp32 table) ...
    assert cache.cache_path(tmp_path, key16) != path32
    assert cache.lookup(tmp_path, key16).status == "miss"
    # ... and an fp32 table put at the bf16 key's path is refused as stale, naming the precision
    path32.replace(cache.cache_path(tmp_path, key16))
    with pytest.raises(cache.StaleCacheError, match=r"precision: cached 'fp32' vs now 'bf16'"):
        cache.load_or_refuse(tmp_path, key16)
    assert dataclasses.replace(key32, precision="bf16").digest() == key16.digest()


def _imports(path: Path, modules: set[str]) -> set[str]:
    """dcp modules imported anywhere in ``path`` (function-level too), ``if TYPE_CHECKING`` blocks excluded."""
    found: set[str] = set()

    class Visitor(ast.NodeVisitor):
        def visit_If(self, node: ast.If) -> None:
            test = node.test
            if getattr(test, "id", None) == "TYPE_CHECKING" or getattr(test, "attr", None) == "TYPE_CHECKING":
                for child in node.orelse:
                    self.visit(child)
                return
            self.generic_visit(node)

        def visit_Import(self, node: ast.Import) -> None:
            found.update(a.name for a in node.names)

        def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
            if node.level == 0 and node.module:
                for a in node.names:
                    sub = f"{node.module}.{a.name}"
                    found.add(sub if sub in modules else node.module)

    Visitor().visit(ast.parse(path.read_text()))
    return {m for m in found if m in modules}


def _module_graph() -> dict[str, set[str]]:
    files = {}
    for path in DCP.rglob("*.py"):
        parts = path.relative_to(DCP.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        files[name] = path
    names = set(files)
    # The root package is a lazy facade every dcp import passes through: edges into it carry no layering.
    return {n: _imports(p, names) - {n, "dcp"} for n, p in files.items() if n != "dcp"}


def test_no_import_cycles_and_the_profiler_never_imports_the_manager_or_engines():
    graph = _module_graph()
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                cycle = path[path.index(nxt):] + [nxt] if nxt in path else [node, nxt]
                pytest.fail(f"import cycle: {' -> '.join(cycle)}")
            if nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    low = {m for n, deps in graph.items() if n.startswith("dcp.distributed") for m in deps}
    assert low <= {"dcp.distributed", "dcp.distributed.comm", "dcp.distributed.device"}
    for name, deps in graph.items():
        if name.startswith("dcp.profiler"):
            assert not deps & {"dcp.runtime.manager", "dcp.runtime.engines"}, name


def test_engines_still_export_the_flat_helpers():
    from dcp.distributed import comm
    from dcp.runtime import engines

    assert engines.all_reduce_grads_flat is comm.all_reduce_grads_flat
    assert engines.copy_flat_into_grads is comm.copy_flat_into_grads


def test_profile_table_records_its_precision(tmp_path):
    from dcp.config import AdvancedConfig, PlanningConfig, ProfilingConfig
    from dcp.profiler.dual_layer import profile_table

    model = Transformer1D(T1DConfig.tiny())
    cfg = DCPConfig(model=model.config.shape(), runtime=RuntimeConfig(precision="bf16"),
                    profiling=ProfilingConfig(seq_group_edges=(32,), max_micro_batch_size=1, cache_dir=str(tmp_path)),
                    advanced=AdvancedConfig(measure_iters=1, warmup_iters=0),
                    planning=PlanningConfig(sp_sizes=(1,), mem_capacity_gib=1.0))
    table = profile_table(model, cfg, progress=False)
    # the metadata's dtype is the parameters' (as in the cache key); the compute precision is its own field
    assert table.meta.dtype == "float32" and table.meta.extra["precision"] == "bf16"
    assert all(p.dtype is torch.float32 for p in model.parameters())  # measured under autocast, not cast
    assert not torch.is_autocast_enabled("cpu")  # the context is left again


def test_a_bf16_table_is_cached_under_its_key_and_hit_again(tmp_path):
    """bf16 over fp32 parameters (ddp's autocast): the profiled table is cached and found again. On an H100 the
    cache refused it (metadata dtype 'bfloat16' vs the key's 'float32'), so every CUDA run stopped."""
    from dcp.config import AdvancedConfig, PlanningConfig, ProfilingConfig
    from dcp.profiler.dual_layer import load_or_profile

    model = Transformer1D(T1DConfig.tiny())
    cfg = DCPConfig(model=model.config.shape(), runtime=RuntimeConfig(precision="bf16"),
                    profiling=ProfilingConfig(seq_group_edges=(32,), max_micro_batch_size=1, cache_dir=str(tmp_path)),
                    advanced=AdvancedConfig(measure_iters=1, warmup_iters=0),
                    planning=PlanningConfig(sp_sizes=(1,), mem_capacity_gib=1.0))
    first, status = load_or_profile(model, cfg, progress=False)
    assert status == "profiled" and first.meta.extra["precision"] == "bf16"
    again, status = load_or_profile(model, cfg, progress=False)
    assert status == "hit" and again.rows == first.rows


def test_to_device_async_moves_only_what_is_elsewhere():
    from dcp.distributed.device import to_device_async

    t = torch.arange(4)
    assert to_device_async(t, torch.device("cpu")) is t  # already there: no copy
    moved = to_device_async(t, torch.device("meta"))  # a non-CPU stand-in (pinning only applies to CUDA)
    assert moved.device.type == "meta" and moved.shape == t.shape


def test_autocast_keeps_no_weight_cast_cache_by_default():
    """The cache kept every recomputed layer's bf16 weights alive to the end of the forward (1.3-1.5 GiB over
    Eq. 6 on an H100); a bf16 copy must live only as long as autograd keeps it."""
    from dcp.distributed import autocast

    ctx = autocast("bf16", "cpu")
    assert isinstance(ctx, torch.autocast) and ctx._cache_enabled is False
    assert autocast("bf16", "cpu", cache=True)._cache_enabled is True
