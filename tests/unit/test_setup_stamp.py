"""scripts/setup.sh on a ready venv skips `pip install -e` unless pyproject.toml changed (or FORCE_SETUP=1).

The venv is faked: .venv/bin/python answers the import checks, .venv/bin/pip records its calls."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


@pytest.fixture
def checkout(tmp_path):
    (tmp_path / "scripts").mkdir()
    for name in ("setup.sh", "setup_stamp.sh"):
        shutil.copy(REPO / "scripts" / name, tmp_path / "scripts" / name)
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n')
    bin_dir = tmp_path / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python").write_text("#!/usr/bin/env bash\nexit 0\n")
    (bin_dir / "pip").write_text(f'#!/usr/bin/env bash\necho "$*" >> "{tmp_path}/pip.log"\n')
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    return tmp_path


def _setup(root: Path, **env: str) -> list[str]:
    subprocess.run(["bash", "scripts/setup.sh"], cwd=root, check=True, env={**os.environ, **env},
                   capture_output=True, text=True)
    log = root / "pip.log"
    calls = log.read_text().splitlines() if log.exists() else []
    log.unlink(missing_ok=True)
    return calls


def test_second_setup_skips_the_install(checkout):
    assert _setup(checkout) == ["install -q -e .[dev]"]
    assert _setup(checkout) == []


def test_changed_pyproject_reinstalls(checkout):
    _setup(checkout)
    (checkout / "pyproject.toml").write_text('[project]\nname = "x"\nversion = "2"\n')
    assert _setup(checkout) == ["install -q -e .[dev]"]
    assert _setup(checkout) == []


def test_force_setup_reinstalls(checkout):
    _setup(checkout)
    assert _setup(checkout, FORCE_SETUP="1") == ["install -q -e .[dev]"]


def test_stamp_is_the_hash_of_pyproject(checkout):
    import hashlib

    out = subprocess.run(["bash", "scripts/setup_stamp.sh"], cwd=checkout, check=True, capture_output=True, text=True)
    assert out.stdout.strip() == hashlib.sha256((checkout / "pyproject.toml").read_bytes()).hexdigest()


def test_setup_builds_deepspeeds_cpu_op_so_no_test_builds_it_under_its_time_limit(checkout):
    # the fake python records what it is asked to run (its stdin for `python -`)
    py = checkout / ".venv" / "bin" / "python"
    py.write_text(f'#!/usr/bin/env bash\nif [ "$1" = "-" ]; then cat >> "{checkout}/py.log"; '
                  f'echo "DS_ACCELERATOR=$DS_ACCELERATOR" >> "{checkout}/py.log"; fi\nexit 0\n')
    _setup(checkout)
    log = (checkout / "py.log").read_text()
    assert 'create_op_builder("ShareMemCommBuilder")' in log and "builder.load(" in log
    assert "DS_ACCELERATOR=cpu" in log
