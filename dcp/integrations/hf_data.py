"""What Hugging Face users already have, as a DCP dataset in one line: :class:`TokenDataset`.

``TokenDataset(ds)`` wraps a ``datasets.Dataset`` (or any sequence) whose rows hold ``input_ids`` and
optionally ``labels`` (a plain list of token ids per row works too). It gives the manager what it plans
with: ``lengths()`` (tokens per sample), ``target_counts()`` (the tokens the loss counts), the sample id
from ``__getitem__`` and ``collate``. The convention is transformers' own: ``labels`` are aligned with
``input_ids`` and the model predicts ``labels[t + 1]`` from the tokens up to ``t`` (HF shifts them inside its
loss); ``-100`` marks a position the loss ignores (prompt tokens, padding). Without ``labels`` every next
token is a target. A sample of ``n`` tokens therefore has ``n - 1`` targets, fewer where its labels hold
``-100``, and ``target_counts()`` counts exactly those, so the loss weights of a step are the real targets.
A row with no target (one token, or labels all ``-100`` after the first position) trains nothing and would make
a step of such rows a 0 / 0 = nan loss: ``TokenDataset`` refuses the data up front, naming those rows and the
``ds.filter`` that drops them (refused rather than skipped, so that sample ids stay the dataset's row numbers).

**Lengths are needed up front.** DCP plans a whole epoch (which samples share a step, which SP size each
gets) from every sample's length before the first step, and then fetches samples by index. A streaming
(iterable) dataset must therefore be indexable (``Dataset.from_generator``, ``save_to_disk`` /
``load_from_disk``) and its lengths known: :func:`cached_lengths` computes them in one pass and caches
them in a file keyed by the dataset's fingerprint (``datasets``' ``_fingerprint``, or ``key=``), written
atomically, so the next run (and every rank) reads the file instead of the data. ``TokenDataset(ds,
cache_dir=...)`` uses it.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch

from dcp.data import IGNORE_INDEX, Batch


class HFDataError(ValueError):
    """A dataset row or a lengths cache breaks the wrapper's rules; the message names the fix."""


def dataset_fingerprint(data: Any) -> str | None:
    """``datasets``' fingerprint of ``data`` (changes with every transform), or None for other objects."""
    value = getattr(data, "_fingerprint", None)
    return str(value) if value else None


def _row_tokens(row: Any, input_key: str, label_key: str, index: int) -> tuple[Any, Any]:
    """(input ids, labels or None) of one row: a mapping with ``input_key``, or the ids themselves."""
    if isinstance(row, dict) or hasattr(row, "keys"):
        if input_key not in row:
            raise HFDataError(
                f"row {index} has no {input_key!r} (keys {sorted(row.keys())}): tokenize the dataset first, or "
                f"pass TokenDataset(ds, input_key=<the column of token ids>)"
            )
        ids, labels = row[input_key], row.get(label_key)
    else:
        ids, labels = row, None
    if labels is not None and len(labels) != len(ids):
        raise HFDataError(
            f"row {index}: {label_key!r} has {len(labels)} entries but {input_key!r} has {len(ids)}: labels are "
            "aligned with input_ids (transformers' convention; -100 where the loss ignores a position)"
        )
    return ids, labels


def _count(ids: Any, labels: Any, index: int) -> tuple[int, int]:
    n = len(ids)
    if n < 1:
        raise HFDataError(f"row {index} has no tokens: drop empty rows (ds.filter(lambda r: len(r['input_ids']) > 0))")
    if labels is None:
        return n, n - 1
    tail = labels[1:]
    if isinstance(tail, torch.Tensor):
        return n, int((tail != IGNORE_INDEX).sum())
    return n, sum(1 for v in tail if int(v) != IGNORE_INDEX)


def _rows(data: Any, input_key: str, label_key: str) -> Iterable[Any]:
    """Rows of ``data``; a ``datasets.Dataset`` is read in batches of only the two columns (fast)."""
    names = getattr(data, "column_names", None)
    if isinstance(names, list) and hasattr(data, "iter"):
        cols = [c for c in (input_key, label_key) if c in names]
        if input_key not in cols:
            raise HFDataError(f"dataset has no column {input_key!r} (columns {names}): tokenize it first, or pass "
                              "input_key=<the column of token ids>")
        for part in data.select_columns(cols).with_format(None).iter(batch_size=1024):
            yield from ({c: part[c][i] for c in cols} for i in range(len(part[input_key])))
        return
    yield from data


def count_tokens(data: Any, *, input_key: str = "input_ids", label_key: str = "labels") -> tuple[list[int], list[int]]:
    """One pass over ``data``: (tokens per sample, targets per sample), see the module docstring."""
    lengths: list[int] = []
    targets: list[int] = []
    for i, row in enumerate(_rows(data, input_key, label_key)):
        n, t = _count(*_row_tokens(row, input_key, label_key, i), i)
        lengths.append(n)
        targets.append(t)
    return lengths, targets


def cached_lengths(data: Any, *, cache_dir: str | os.PathLike[str] = ".dcp_cache", key: str | None = None,
                   input_key: str = "input_ids", label_key: str = "labels") -> tuple[list[int], list[int]]:
    """(lengths, target counts) of ``data``, computed once and cached in ``cache_dir``.

    The file ``lengths-<key>.json`` is keyed by ``key`` or the dataset's fingerprint and written atomically
    (a temporary file renamed over it), so concurrent ranks and interrupted runs never read half a file.
    """
    key = key or dataset_fingerprint(data)
    if not key:
        raise HFDataError(
            f"data ({type(data).__name__}) has no datasets fingerprint to key its lengths cache: pass "
            "cached_lengths(data, key=<a string that changes whenever the data does>)"
        )
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in f"{key}-{input_key}-{label_key}")
    path = Path(cache_dir) / f"lengths-{safe}.json"
    if path.exists():
        try:
            stored = json.loads(path.read_text())
            lengths, targets = [int(n) for n in stored["lengths"]], [int(n) for n in stored["target_counts"]]
        except (ValueError, KeyError, TypeError) as exc:
            raise HFDataError(f"lengths cache {path} is unreadable ({exc}): delete it to recompute") from None
        if len(lengths) != len(targets) or (hasattr(data, "__len__") and len(lengths) != len(data)):
            raise HFDataError(f"lengths cache {path} holds {len(lengths)} samples but the data has {len(data)}: "
                              "the key does not follow the data; delete the file or pass another key=")
        return lengths, targets
    lengths, targets = count_tokens(data, input_key=input_key, label_key=label_key)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    with os.fdopen(fd, "w") as out:
        json.dump({"key": key, "lengths": lengths, "target_counts": targets}, out)
    os.replace(tmp, path)
    return lengths, targets


def _check_targets(targets: Sequence[int], label_key: str) -> None:
    """Refuse rows without a next-token target, naming them (the first ten) and the filter that drops them."""
    empty = [i for i, t in enumerate(targets) if t < 1]
    if empty:
        shown = ", ".join(map(str, empty[:10])) + (f", ... ({len(empty)} rows)" if len(empty) > 10 else "")
        raise HFDataError(
            f"{'rows' if len(empty) > 1 else 'row'} {shown} {'have' if len(empty) > 1 else 'has'} no next-token target (one token, or {label_key!r} all -100 after the first "
            "position): a step of such rows has a 0/0 = nan loss; drop them first, e.g. ds.filter(lambda r: "
            f"len(r['input_ids']) > 1 and any(v != -100 for v in r[{label_key!r}][1:])) (without labels: "
            "len(r['input_ids']) > 1)"
        )


class TokenDataset:
    """A DCP dataset over rows of ``input_ids`` (optional ``labels``); see the module docstring.

    ``lengths`` / ``target_counts`` may be given (computed elsewhere); ``cache_dir`` caches them by the
    dataset's fingerprint (:func:`cached_lengths`); otherwise one pass over the data computes them.
    """

    def __init__(self, data: Any, *, input_key: str = "input_ids", label_key: str = "labels",
                 lengths: Sequence[int] | None = None, target_counts: Sequence[int] | None = None,
                 cache_dir: str | os.PathLike[str] | None = None) -> None:
        if not hasattr(data, "__getitem__") or not hasattr(data, "__len__"):
            raise HFDataError(
                f"data ({type(data).__name__}) is not indexable: DCP plans an epoch from every sample's length and "
                "fetches samples by index; materialize a streaming dataset (datasets.Dataset.from_generator)"
            )
        self.data, self.input_key, self.label_key = data, input_key, label_key
        if lengths is None:
            counted = (count_tokens(data, input_key=input_key, label_key=label_key) if cache_dir is None else
                       cached_lengths(data, cache_dir=cache_dir, input_key=input_key, label_key=label_key))
            lengths, target_counts = counted[0], target_counts if target_counts is not None else counted[1]
        self._lengths = [int(n) for n in lengths]
        self._targets = [n - 1 for n in self._lengths] if target_counts is None else [int(t) for t in target_counts]
        if len(self._lengths) != len(data) or len(self._targets) != len(data):
            raise HFDataError(
                f"lengths ({len(self._lengths)}) and target_counts ({len(self._targets)}) must give one entry per "
                f"row of the data ({len(data)}): compute them from this dataset"
            )
        _check_targets(self._targets, label_key)

    def __len__(self) -> int:
        return len(self._lengths)

    def __getitem__(self, index: int) -> tuple[int, torch.Tensor, torch.Tensor | None]:
        ids, labels = _row_tokens(self.data[index], self.input_key, self.label_key, index)
        return index, torch.as_tensor(ids, dtype=torch.long), None if labels is None else torch.as_tensor(
            labels, dtype=torch.long)

    def lengths(self) -> list[int]:
        return list(self._lengths)

    def target_counts(self) -> list[int]:
        return list(self._targets)

    def collate(self, samples: Sequence[tuple[int, torch.Tensor, torch.Tensor | None]]) -> Batch:
        """Right-padded ``Batch``: targets are the next position's label (-100 ignored and on padding)."""
        lens = [int(ids.numel()) for _, ids, _ in samples]
        inputs = torch.zeros(len(samples), max(lens), dtype=torch.long)
        targets = torch.full_like(inputs, IGNORE_INDEX)
        for j, (_, ids, labels) in enumerate(samples):
            inputs[j, : lens[j]] = ids
            targets[j, : lens[j] - 1] = (ids if labels is None else labels)[1:]
        return Batch(inputs=inputs, targets=targets, seq_lens=tuple(lens), sample_ids=tuple(i for i, _, _ in samples))
