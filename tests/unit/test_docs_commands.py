"""The docs name only commands and flags that exist, and their links and repository paths resolve.

Every ``dcp ...`` (or ``python -m dcp.cli ...``) command in README.md, docs/*.md and the folders' README.md
files is parsed with the real ``dcp`` parser: its subcommand words must exist and each ``--flag`` must be an
option of that subcommand. A relative Markdown link, and a backticked path under one of the repository's
folders, must name a file or folder that exists.
"""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

from dcp.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted(ROOT.glob("*/README.md")),
        *sorted((ROOT / "dcp").glob("**/README.md"))]
COMMAND = re.compile(r"(?:^|[\s`(])(?:\.venv/bin/)?(?:dcp|python -m dcp\.cli)\s+([a-z][^`\n#]*)")
FOLDERS = "docs|dcp|tests|scripts|experiments|examples|profiler|datasets|paper_figures"


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices
    return {}


def _command_errors(where: str, text: str, parser: argparse.ArgumentParser) -> list[str]:
    bad = []
    for m in COMMAND.finditer(text):
        try:
            words = shlex.split(m.group(1), comments=True)
        except ValueError:  # an unbalanced quote in prose
            words = m.group(1).split()
        p, path = parser, []
        while words and words[0] in _subcommands(p):
            path.append(words[0])
            p = _subcommands(p)[words.pop(0)]
        if not path or (_subcommands(p) and words[:1] == ["..."]):  # prose, or "dcp bench ..." for any bench
            continue
        if _subcommands(p):
            bad.append(f"{where}: dcp {' '.join(path)} {words[:1]}: no such subcommand")
            continue
        options = {s for a in p._actions for s in a.option_strings}
        bad += [f"{where}: dcp {' '.join(path)} has no {w.split('=')[0]}" for w in words
                if w.startswith("--") and w != "--" and w.split("=")[0].rstrip(".,;:)") not in options]
    return bad


def test_documented_commands_and_flags_exist():
    parser, bad, seen = build_parser(), [], 0
    for doc in DOCS:
        for n, line in enumerate(doc.read_text().splitlines(), 1):
            seen += bool(COMMAND.search(line))
            bad += _command_errors(f"{doc.relative_to(ROOT)}:{n}", line, parser)
    assert seen > 100 and not bad, bad


def test_command_check_catches_a_stale_flag_and_subcommand():
    parser = build_parser()
    assert _command_errors("x", "`dcp plan --synthetic 10 --world-sizes 4`", parser) == [
        "x: dcp plan has no --world-sizes"]
    assert _command_errors("x", "`dcp bench plan --steps 2`", parser) == ["x: dcp bench ['plan']: no such subcommand"]
    assert _command_errors("x", "every `dcp bench ...` benchmark", parser) == []


def test_links_and_repository_paths_in_the_docs_resolve():
    bad = []
    for doc in [*DOCS, ROOT / "CHANGELOG.md"]:  # the changelog's links too (its old commands are history)
        text = doc.read_text()
        for m in re.finditer(r"\]\(([^)\s]+)\)", text):
            target = m.group(1).split("#")[0]
            if target and not target.startswith(("http", "mailto")) and not (doc.parent / target).exists():
                bad.append(f"{doc.relative_to(ROOT)}: link {m.group(1)}")
        if doc.name == "CHANGELOG.md":
            continue
        for m in re.finditer(rf"`((?:{FOLDERS})/[A-Za-z0-9_./-]+)`", text):
            path = m.group(1).rstrip(".")
            if not (ROOT / path).exists() and not (doc.parent / path).exists():
                bad.append(f"{doc.relative_to(ROOT)}: path {path}")
    assert not bad, bad
