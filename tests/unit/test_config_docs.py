"""The config's documentation agrees with its code: every default a field's docstring states ("(default 3)",
"Off by default", "0: ..." for an automatic value) is the field's default, and every ``section.field`` the docs
(docs/*.md, README.md) name exists, with the default they state for it.

Pure ``ast`` and text: the docstrings are read from the source (attribute docstrings are not kept at run time).
"""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import pytest

from dcp.config import _SECTIONS

ROOT = Path(__file__).resolve().parents[2]
SOURCES = (ROOT / "dcp" / "config.py", ROOT / "dcp" / "config_advanced.py")
DOCS = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]

# What a docstring says the default is: "(default 3)", "(seconds, default 0 = unknown)", "defaults to X",
# "X (the default)", "Off by default", and "0: ..." / "0 means ..." for a field whose 0 stands for an automatic value.
STATED = (
    re.compile(r"\((?:[^()]*?, )?default:? (?P<v>`[^`]+`|\[[^\]]*\]|[^\s,;)=]+)"),
    re.compile(r"\bdefaults? to (?P<v>`[^`]+`|[^\s,;)]+)"),
    re.compile(r"(?P<v>\S+) \(the default\)"),
    re.compile(r"\b(?P<v>[Oo]ff|[Oo]n) by default\b"),
    re.compile(r"(?:^|[.;:(] )(?P<v>0)(?::| means\b| sizes\b| derives\b| picks\b| with\b)"),
)


def field_docs() -> list[tuple[str, str, object, str]]:
    """(section, field, default, docstring) of every field of every config section, from the source."""
    section_of = {cls.__name__: name for name, cls in _SECTIONS.items()}
    out = []
    for path in SOURCES:
        for cls in (n for n in ast.parse(path.read_text()).body if isinstance(n, ast.ClassDef)):
            if cls.name not in section_of:
                continue
            body = cls.body
            for node, after in zip(body, body[1:], strict=False):
                if isinstance(node, ast.AnnAssign) and isinstance(after, ast.Expr) and \
                        isinstance(after.value, ast.Constant) and isinstance(after.value.value, str):
                    default = ast.literal_eval(node.value) if node.value is not None else None
                    out.append((section_of[cls.name], node.target.id, default, " ".join(after.value.value.split())))
    return out


def _matches(token: str, default: object) -> bool:
    """Whether the stated ``token`` is ``default`` (units after a number and quotes around a string aside)."""
    token = token.strip("`'\":")
    if isinstance(default, bool):
        return token.lower() in (("true", "on") if default else ("false", "off"))
    if isinstance(default, int | float):
        try:
            return float(token.split()[0].rstrip("s")) == float(default)
        except ValueError:
            return False
    if isinstance(default, tuple):
        try:
            return tuple(ast.literal_eval(token)) == default
        except (ValueError, SyntaxError):
            return False
    return token.split()[0].strip("`'\"") == default


def stated_defaults(text: str) -> list[str]:
    return [m.group("v") for rx in STATED for m in rx.finditer(text)]


def test_the_sources_hold_every_field_with_a_docstring():
    found = {(s, f) for s, f, _, _ in field_docs()}
    every = {(name, f.name) for name, cls in _SECTIONS.items() for f in dataclasses.fields(cls)}
    assert found == every, sorted(every ^ found)


def test_every_default_a_field_docstring_states_is_the_fields_default():
    checked, wrong = 0, []
    for section, name, default, doc in field_docs():
        for token in stated_defaults(doc):
            checked += 1
            if not _matches(token, default):
                wrong.append(f"{section}.{name}: the docstring states {token!r}, the default is {default!r}")
    assert not wrong, "\n".join(wrong)
    assert checked >= 12  # the statements the sections hold today (a regex that stops matching fails here)


def test_a_default_that_disagrees_is_caught():
    assert stated_defaults("Timed repetitions (default 5).") == ["5"]
    assert not _matches("5", 3) and _matches("3", 3) and _matches("60 s", 60.0) and _matches("false", False)
    assert stated_defaults("Keep copies. Off by default: a model ...") == ["Off"] and not _matches("Off", True)
    assert stated_defaults("Window. 0 sizes it from the table.") == ["0"] and not _matches("0", 32)
    assert _matches("`[0.9, 1.1]`", (0.9, 1.1)) and not _matches("[0.5, 2.0]", (0.9, 1.1))
    assert stated_defaults("0 turns the watch off") == []  # what 0 does, not that it is the default


MENTION = re.compile(r"(?<![\w/.])`(?P<sec>model|profiling|planning|runtime|advanced)\.(?P<key>[a-z_]+)"
                     r"(?: = (?P<eq>[^`]+))?`(?P<rest>[^\n]{0,60})")
TABLE_MENTION = re.compile(r"`\[(?P<sec>model|profiling|planning|runtime|advanced)\] (?P<key>[a-z_]+) = [^`]+`"
                           r"(?P<rest>[^\n]{0,60})")


def doc_mentions() -> list[tuple[str, int, str, str, str | None, str]]:
    """(file, line, section, key, value after '=', the text after the mention) of every config field the docs name."""
    out = []
    for path in DOCS:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            for rx in (MENTION, TABLE_MENTION):
                for m in rx.finditer(line):
                    out.append((path.name, number, m["sec"], m["key"], m.groupdict().get("eq"), m["rest"]))
    return out


def test_every_config_field_the_docs_name_exists_with_the_default_they_state():
    defaults = {(s, f): d for s, f, d, _ in field_docs()}
    unknown, wrong = [], []
    for name, number, section, key, eq, rest in doc_mentions():
        if (section, key) not in defaults:
            # `model.layers` is a model's attribute, `profiling.py` a file: a key of another section is a field
            # the docs still place where it was (or never was)
            if section != "model" and key != "py" or any(k == key for _, k in defaults):
                unknown.append(f"{name}:{number}: {section}.{key}")
            continue
        after = re.match(r"\s*\((?:[^()]*?, )?default:? (?P<v>`[^`]+`|\[[^\]]*\]|[^\s,;)=]+)|, default (?P<w>[^\s,;)]+)",
                         rest)
        if after:
            token = after["v"] or after["w"]
            if not _matches(token, defaults[section, key]):
                wrong.append(f"{name}:{number}: {section}.{key} stated default {token}, the code's "
                             f"{defaults[section, key]!r}")
        elif eq is not None and re.match(r"\s*\(default\)", rest) and not _matches(eq, defaults[section, key]):
            wrong.append(f"{name}:{number}: {section}.{key} = {eq} called the default, the code's "
                         f"{defaults[section, key]!r}")
    assert not unknown, "docs name config fields that do not exist:\n" + "\n".join(unknown)
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize(("line", "problem"), [
    ("`planning.lookahead_samples` (default 0)", "unknown"),
    ("`runtime.log_every`, default 7", "wrong"),
    ("`advanced.measure_iters` (default 3)", None),
])
def test_the_docs_check_sees_a_moved_field_and_a_wrong_default(tmp_path, monkeypatch, line, problem):
    page = tmp_path / "page.md"
    page.write_text(line + "\n")
    monkeypatch.setattr(__import__(__name__), "DOCS", [page])
    if problem is None:
        test_every_config_field_the_docs_name_exists_with_the_default_they_state()
    else:
        with pytest.raises(AssertionError, match="do not exist" if problem == "unknown" else "stated default 7"):
            test_every_config_field_the_docs_name_exists_with_the_default_they_state()
