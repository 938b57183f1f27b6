"""scripts/state_memory.py: bad arguments are refused in one line before any process starts."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

_SPEC = importlib.util.spec_from_file_location("state_memory", Path(__file__).parents[2] / "scripts" / "state_memory.py")
state_memory = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(state_memory)


@pytest.mark.parametrize(("argv", "message"), [
    (["--engines", "ddp,zero3"], "--engines ('ddp,zero3') names ['zero3']: pick from ddp, fsdp2, fsdp2-zero3"),
    (["--engines", ","], "names none"),
    (["--layers", "0"], "--layers (0) must be >= 1"),
    (["--seq-len", "-4"], "--seq-len (-4) must be >= 1"),
    (["--hidden", "100"], "--hidden (100) must be a multiple of the 8 heads"),
])
def test_bad_arguments_are_refused_before_any_process_starts(argv, message, capsys, monkeypatch):
    monkeypatch.setattr("dcp.distributed.launch.run_distributed", lambda *a, **k: pytest.fail("a process started"))
    with pytest.raises(SystemExit):
        state_memory.main(argv)
    assert message in capsys.readouterr().err
