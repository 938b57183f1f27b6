"""The planner's tuned constants live in ``dcp.planner.tuning``, each with a docstring saying what it trades."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

from dcp.planner import tuning

DOCS = Path(__file__).resolve().parents[2] / "docs" / "planner.md"


def _constants() -> list[tuple[str, str | None]]:
    """(name, its docstring or None) of every module-level constant of tuning.py, in order."""
    body = ast.parse(inspect.getsource(tuning)).body
    out = []
    for i, node in enumerate(body):
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name) and node.targets[0].id.isupper():
            nxt = body[i + 1] if i + 1 < len(body) else None
            doc = (nxt.value.value if isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
                   and isinstance(nxt.value.value, str) else None)
            out.append((node.targets[0].id, doc))
    return out


def test_every_tuned_constant_says_what_it_earns():
    missing = [name for name, doc in _constants() if not doc or len(doc.split()) < 8]
    assert not missing, f"tuning.py constants without a docstring saying what they trade: {missing}"


def test_the_docs_and_the_module_state_the_count():
    n = len(_constants())
    assert f"({n} here;" in tuning.__doc__, f"tuning.py's docstring must state its count, {n}"
    m = re.search(r"`tuning\.py` \| (\d+) of the planner's", DOCS.read_text())
    assert m and int(m.group(1)) == n, f"docs/planner.md must state tuning.py's count, {n}"
