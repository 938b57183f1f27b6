"""The API reference: `scripts/api_docs.sh` builds HTML from the docstrings, and every config field has a
docstring that the reference shows (the config page is where a user looks a key up)."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dcp import config as cfg

pdoc = pytest.importorskip("pdoc")
ROOT = Path(__file__).resolve().parents[2]
SECTIONS = [cfg.ModelShapeConfig, cfg.ProfilingConfig, cfg.PlanningConfig, cfg.RuntimeConfig, cfg.DCPConfig]


def test_every_config_field_has_a_docstring():
    module = pdoc.doc.Module(cfg)
    missing = []
    for section in SECTIONS:
        members = module.get(section.__name__).members
        missing += [f"{section.__name__}.{f.name}" for f in dataclasses.fields(section)
                    if f.name not in members or not members[f.name].docstring.strip()]
    assert not missing, f"config fields without a docstring: {missing}: add a string literal under each field"


@pytest.mark.timeout(180)
def test_the_script_builds_the_reference_with_every_config_field(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable}
    run = subprocess.run(["bash", str(ROOT / "scripts" / "api_docs.sh"), str(tmp_path), "dcp.config", "dcp.api"],
                         env=env, capture_output=True, text=True, timeout=170)
    assert run.returncode == 0, run.stderr
    page = (tmp_path / "dcp" / "config.html").read_text()
    assert (tmp_path / "dcp" / "api.html").is_file() and (tmp_path / "index.html").is_file()
    absent = [f"{s.__name__}.{f.name}" for s in SECTIONS for f in dataclasses.fields(s)
              if f'id="{s.__name__}.{f.name}"' not in page]
    assert not absent, f"not in the generated config page: {absent}"


def test_the_script_fails_on_a_module_that_does_not_exist(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable}
    run = subprocess.run(["bash", str(ROOT / "scripts" / "api_docs.sh"), str(tmp_path), "dcp.no_such_module"],
                         env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode != 0 and "no_such_module" in run.stderr
