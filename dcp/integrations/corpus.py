"""A real, length-diverse text corpus that every machine has: the Python standard library's own source.

:class:`ByteCorpus` splits every ``.py`` file of the running interpreter's standard library (sorted
paths, ``test`` packages excluded) at its top-level ``def`` / ``class`` / decorator lines; each piece is
one sample of byte-level tokens (vocabulary 256), truncated to ``max_len_tokens``. Pieces range from a
few dozen bytes (a one-line helper) to many kilobytes (a large class), which is the length diversity
DCP is for. ``num_samples`` picks a deterministic subset (seeded shuffle). The dataset follows the DCP
dataset protocol (``lengths()``, ``collate() -> Batch``, ``target_counts()``) and works with a plain
``torch.utils.data.DataLoader`` (``collate_fn=dataset.collate``).
"""

from __future__ import annotations

import os
import random
import re
import sysconfig
from collections.abc import Sequence
from pathlib import Path

import torch

from dcp.data import Batch, collate_tokens

_SKIP = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"}
_SPLIT = re.compile(rb"\n(?=(?:def |class |async def |@))")


class CorpusError(ValueError):
    """A corpus setting or the standard-library folder is unusable; the message names the fix."""


def stdlib_root() -> Path:
    """Folder of the running interpreter's standard library (``sysconfig``'s ``stdlib`` path)."""
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_pieces(root: Path | None = None, *, min_len_tokens: int = 16, max_len_tokens: int = 1024) -> list[bytes]:
    """Every top-level piece of every standard-library ``.py`` file, in a fixed order (sorted paths)."""
    root = stdlib_root() if root is None else Path(root)
    files = []
    for folder, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if d not in _SKIP]  # no installed packages, no test suites
        files.extend(Path(folder) / n for n in names if n.endswith(".py"))
    files.sort()
    if not files:
        raise CorpusError(f"root ({str(root)!r}) holds no .py files: pass the standard library folder")
    pieces: list[bytes] = []
    for path in files:
        for piece in _SPLIT.split(path.read_bytes()):
            piece = piece.strip(b"\n")
            if len(piece) >= min_len_tokens:
                pieces.append(piece[:max_len_tokens])
    return pieces


class ByteCorpus:
    """Byte-level samples of the standard library's source (see the module docstring)."""

    vocab_size = 256

    def __init__(self, *, num_samples: int | None = None, max_len_tokens: int = 1024, min_len_tokens: int = 16,
                 seed: int = 0, root: str | Path | None = None) -> None:
        if min_len_tokens < 2:
            raise CorpusError(f"min_len_tokens ({min_len_tokens}) must be >= 2: a sample needs a next token")
        if max_len_tokens < min_len_tokens:
            raise CorpusError(
                f"max_len_tokens ({max_len_tokens}) < min_len_tokens ({min_len_tokens}): set max >= min"
            )
        pieces = stdlib_pieces(None if root is None else Path(root), min_len_tokens=min_len_tokens,
                               max_len_tokens=max_len_tokens)
        if num_samples is not None:
            if not 1 <= num_samples <= len(pieces):
                raise CorpusError(
                    f"num_samples ({num_samples}) must be in [1, {len(pieces)}] (pieces in the corpus): "
                    "ask for fewer samples or leave it None for all"
                )
            order = list(range(len(pieces)))
            random.Random(seed).shuffle(order)
            pieces = [pieces[i] for i in order[:num_samples]]
        self._tokens = [torch.frombuffer(bytearray(p), dtype=torch.uint8).long() for p in pieces]

    def __len__(self) -> int:
        return len(self._tokens)

    def __getitem__(self, index: int) -> tuple[int, torch.Tensor]:
        return index, self._tokens[index]

    def lengths(self) -> list[int]:
        return [int(t.numel()) for t in self._tokens]

    def target_counts(self) -> list[int]:
        return [int(t.numel()) - 1 for t in self._tokens]

    def collate(self, samples: Sequence[tuple[int, torch.Tensor]]) -> Batch:
        """Right-padded ``Batch``: ``inputs`` [b, s_max], ``targets`` the next bytes (-100 on padding)."""
        return collate_tokens([t for _, t in samples], [i for i, _ in samples])
