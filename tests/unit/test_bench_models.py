"""``dcp bench models``: bad flags fail in one line before any process starts (the run itself: tests/dist)."""

from __future__ import annotations

import pytest

from dcp.cli import main


@pytest.mark.parametrize("argv,message", [
    (["--seq-lens", "a,b"], "--seq-lens ('a,b') must be integers separated by commas"),
    (["--sp-sizes", "0"], "--sp-sizes ('0') must list positive integers"),
])
def test_bad_lists_are_one_line(argv, message, capsys):
    assert main(["bench", "models", *argv]) == 2
    err = capsys.readouterr().err
    assert f"dcp bench models: error: {message}" in err and err.count("\n") == 1


def test_unknown_model_is_refused_by_the_parser(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["bench", "models", "--model", "t3d"])
    assert exc.value.code == 2 and "invalid choice: 't3d'" in capsys.readouterr().err
