"""Where a run is in its data, as *which samples the epoch has trained*: every sample exactly once across any
resume, also when the plan cannot be replayed.

A step index only means something in the plan it indexes; a resume with another profile table (re-profiled on
new nodes, a read-only cache measured again), another planner version or another world size plans the epoch
differently, and skipping N steps of *that* plan trains some samples twice and others never. So the position
holds the epoch, the set of samples its finished steps trained (``done``, a bitmap) and the plan *segment* it is
in: the samples done when the segment's plan was made (``base``), a digest of everything that plan depends on
(``key``: lengths, the samples left, table rows, config, world size, dcp version) and the steps of it finished.

On resume (:meth:`EpochPosition.resume`):

- same key: the same plan is made again and its finished steps are skipped (the same order and, with the same
  model state, the same parameters as an uninterrupted run); the skipped steps must have trained exactly
  ``done - base``, or the checkpoint is refused;
- another key: a new segment starts at ``done``: the samples not yet trained are planned again (their own
  deterministic shuffle) and each is trained once.

A checkpoint of another dataset (its lengths, target counts or shapes differ) cannot be honoured and is refused,
and so is a position outside the epoch (more finished steps than its plan has; a damaged bitmap). Pure numpy:
the manager calls it, every rank computes the same.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

FORMAT = 2
"""Version of the position in ``DCPManager.state_dict()['position']``."""


class PositionError(ValueError):
    """A checkpoint's data position cannot be honoured by this run; the message says why and what to do."""


def _bits(mask: np.ndarray) -> bytes:
    return np.packbits(mask.astype(np.uint8)).tobytes()


def _mask(raw: Any, n: int, what: str) -> np.ndarray:
    if not isinstance(raw, bytes | bytearray) or len(raw) != (n + 7) // 8:
        size = len(raw) if isinstance(raw, bytes | bytearray) else type(raw).__name__
        raise PositionError(f"checkpoint position {what} ({size} bytes) is not a bitmap of the dataset's {n} "
                            "samples: the checkpoint is damaged or from another dataset; resume from another one")
    bits = np.unpackbits(np.frombuffer(bytes(raw), dtype=np.uint8), count=None)
    if bits[n:].any():
        raise PositionError(f"checkpoint position {what} marks samples beyond the dataset's {n}: the checkpoint is "
                            "damaged or from another dataset; resume from another one")
    return bits[:n].astype(bool)


def segment_key(data_digest: str, base: np.ndarray, inputs: Iterable[str]) -> str:
    """Digest of what the plan of a segment depends on: the data, the samples already done, and ``inputs`` (the
    table's rows, the config, the world size, the dcp version, as text)."""
    h = hashlib.sha256(data_digest.encode())
    h.update(_bits(base))
    for text in inputs:
        h.update(len(text).to_bytes(8, "little"))
        h.update(text.encode())
    return h.hexdigest()[:24]


def mark_new(mask: np.ndarray, ids: np.ndarray) -> list[int] | str | None:
    """Set ``mask[ids]`` when every id is new (not set yet, and once in ``ids``) and return None; otherwise leave
    ``mask`` as it was and return what repeats: up to 8 of the ids already set, ascending, or 'a sample twice in
    the step'. O(n) counts, not a sort of the ids (~160k per step at 4096 ranks)."""
    again = ids[mask[ids]]
    if len(again):
        return sorted(set(again.tolist()))[:8]
    before = np.count_nonzero(mask)
    mask[ids] = True
    if np.count_nonzero(mask) - before == len(ids):
        return None
    mask[ids] = False  # none was set before: undo
    return "a sample twice in the step"

@dataclass(slots=True)
class EpochPosition:
    """The data position of one epoch (see the module docstring); mutated as steps finish."""

    epoch: int
    done: np.ndarray
    """Samples the epoch's finished steps trained (bool per sample)."""
    base: np.ndarray
    """Samples done when the current segment's plan was made (a subset of ``done``)."""
    key: str = ""
    """segment_key of the current segment ('' before its plan is made)."""
    steps: int = 0
    """Finished steps of the current segment's plan."""
    legacy: bool = False
    """Restored from a step-index checkpoint of an older dcp (same config, lengths and world size, so the same
    plan): ``done`` is learnt from the skipped steps instead of checked against them."""
    skipped: list[int] = field(default_factory=list)
    """Samples of steps the non-finite guard skipped this epoch (runtime.nonfinite = 'skip'): done, never applied."""

    @classmethod
    def start(cls, epoch: int, num_samples: int) -> EpochPosition:
        return cls(epoch, np.zeros(num_samples, dtype=bool), np.zeros(num_samples, dtype=bool))

    @property
    def num_samples(self) -> int:
        return len(self.done)

    def remaining(self) -> np.ndarray:
        """Sample ids the current segment plans (those not in ``base``), ascending."""
        return np.flatnonzero(~self.base)

    def record(self, sample_ids: np.ndarray, step: int) -> None:
        """A step of the current segment finished, having trained ``sample_ids``; a sample trained twice in
        one epoch is a bug and raises."""
        again = mark_new(self.done, np.asarray(sample_ids, dtype=np.int64))
        if again is None:
            self.steps += 1
            return
        raise PositionError(f"epoch {self.epoch} step {step} trained samples {again} a second time in this epoch: "
                            "this is a bug in the plan source; report it with the plan")

    def record_checked(self, sample_ids: np.ndarray) -> None:
        """A step of the current segment finished, having trained ``sample_ids``, which were checked to be new in
        the epoch when its plan was prepared (``dcp.runtime.stepview.StepViews``): only marked here."""
        self.done[sample_ids] = True
        self.steps += 1

    def to_state(self) -> dict[str, Any]:
        return {"format": FORMAT, "epoch": self.epoch, "num_samples": self.num_samples, "done": _bits(self.done),
                "base": _bits(self.base), "key": self.key, "steps": self.steps, "skipped": list(self.skipped)}

    @classmethod
    def from_state(cls, state: Any, num_samples: int) -> EpochPosition:
        """The position of a checkpoint, every field checked (PositionError naming it otherwise)."""
        if not isinstance(state, dict) or state.get("format") != FORMAT:
            got = state.get("format") if isinstance(state, dict) else type(state).__name__
            raise PositionError(f"checkpoint position format ({got!r}) is not {FORMAT}: save it with this dcp's "
                                "DCPManager.state_dict()")
        n = state.get("num_samples")
        if n != num_samples:
            raise PositionError(f"checkpoint position covers {n!r} samples, this dataset has {num_samples}: resume "
                                "with the dataset the checkpoint was trained on, or start a new run without "
                                "loading the manager's state")
        epoch, steps, key = state.get("epoch"), state.get("steps"), state.get("key")
        for name, value, ok, rule in (("epoch", epoch, type(epoch) is int and epoch >= 0, "an int >= 0"),
                                      ("steps", steps, type(steps) is int and steps >= 0, "an int >= 0"),
                                      ("key", key, isinstance(key, str), "a str (the plan segment's key)")):
            if not ok:
                raise PositionError(f"checkpoint position field {name!r} is {value!r}, not {rule}: the checkpoint "
                                    "is damaged; resume from another one")
        done, base = _mask(state.get("done"), n, "done"), _mask(state.get("base"), n, "base")
        if (base & ~done).any():
            raise PositionError("checkpoint position: samples of its plan's base are not done: the checkpoint is "
                                "damaged; resume from another one")
        skipped = state.get("skipped", [])
        if not (isinstance(skipped, list) and all(type(i) is int and 0 <= i < n and done[i] for i in skipped)):
            raise PositionError(f"checkpoint position field 'skipped' is {str(skipped)[:80]}, not a list of done "
                                "sample ids: the checkpoint is damaged; resume from another one")
        return cls(epoch, done, base, key, steps, skipped=list(skipped))

    def resume(self, key_of: Callable[[np.ndarray], str],
               plans: Callable[[np.ndarray], Iterator[Any]]) -> tuple[Iterator[Any], int, bool]:
        """(this rank's plans of the current segment after its finished steps, steps skipped, re-planned?).

        ``key_of(base)`` is this run's segment key for a segment based on ``base``; ``plans(ids)`` plans the epoch
        over sample ids ``ids``. Same key: the segment's plan again, its finished steps skipped (checked against
        ``done`` as they are skipped); another key: a new segment over the samples not yet done."""
        key = key_of(self.base)
        if self.key == key or not self.key:
            self.key = key
            return self._checked(self._plans(plans), self.steps, self.done.copy()), self.steps, False
        self.base, self.steps = self.done.copy(), 0
        self.key = key_of(self.base)
        return self._plans(plans), 0, True

    def _plans(self, plans: Callable[[np.ndarray], Iterator[Any]]) -> Iterator[Any]:
        ids = self.remaining()
        return plans(ids) if len(ids) else iter(())  # every sample done: the epoch has no step left

    def _checked(self, plans: Iterator[Any], skip: int, done: np.ndarray) -> Iterator[Any]:
        """The plans after the first ``skip``, which must have trained exactly ``done - base`` (both taken when
        the resume began: ``record`` moves them on as the later steps finish)."""
        seen, count, verified = self.base.copy(), 0, False
        try:
            for plan in plans:
                if count < skip:
                    seen[np.asarray(plan.sample_id_array, dtype=np.int64)] = True
                    count += 1
                    continue
                if not verified:
                    self._adopt_or_verify(seen, done, count)
                    verified = True
                yield plan
        finally:
            _close(plans)
        if count < skip:
            raise PositionError(f"checkpoint position epoch {self.epoch} step {skip} is past the epoch's end "
                                f"(its plan has {count} steps): the checkpoint is damaged or from another run; "
                                "resume from another one")
        if not verified:
            self._adopt_or_verify(seen, done, count)

    def _adopt_or_verify(self, seen: np.ndarray, done: np.ndarray, count: int) -> None:
        if self.legacy:
            self.done, self.legacy = seen, False
        else:
            self._verify(seen, done, count)

    def _verify(self, seen: np.ndarray, done: np.ndarray, count: int) -> None:
        if not np.array_equal(seen, done):
            diff = np.flatnonzero(seen != done)
            raise PositionError(f"checkpoint position epoch {self.epoch} step {count}: the plan's first {count} steps "
                                f"trained other samples than the checkpoint records (e.g. sample {int(diff[0])}): "
                                "the plan changed in a way dcp cannot see (a custom plan source?); resume with the "
                                "same plans, or from another checkpoint")


def plan_inputs(table: Any, config: Any, world_size: int, version: str) -> list[str]:
    """What an epoch's plan depends on besides the data, as text for :func:`segment_key`: the table's rows
    (another table, e.g. re-profiled on new nodes, plans differently), the planning, model and profiling
    sections of the config (with the advanced fields that change plans), the world size and the dcp version
    (the planner's). ``table`` None: a custom plan source (only the world size and the version count)."""
    import dataclasses
    import json

    from dcp.config_advanced import PLANNING_FIELDS

    sections = {name: dataclasses.asdict(getattr(config, name)) for name in ("planning", "model", "profiling")}
    sections["planning"].update({k: getattr(config.advanced, k) for k in PLANNING_FIELDS})
    rows = repr(table.rows) if table is not None else "custom plan source"
    return [rows, json.dumps(sections, sort_keys=True, default=str), f"w{world_size}", f"dcp {version}"]


class KeptEpoch:
    """The plans of the last epoch a caller iterated in full (``DCPManager.epoch_plans``, e.g. to size an LR
    schedule), kept for the run's own iteration of the same epoch, samples and table: planned once, not twice.
    Taken once; a partial iteration keeps nothing."""

    def __init__(self) -> None:
        self._key: Any = None
        self._table: Any = None  # held, so that no other table can take its id while the plans are kept
        self._plans: list[Any] | None = None

    def record(self, key: Any, table: Any, plans: Iterable[Any]) -> Iterator[Any]:
        got: list[Any] = []
        try:
            for plan in plans:
                got.append(plan)
                yield plan
            self._key, self._table, self._plans = key, table, got
        finally:
            _close(plans)

    def take(self, key: Any, table: Any) -> list[Any] | None:
        plans = self._plans if self._key == key and self._table is table else None
        self._key = self._table = self._plans = None
        return plans


def remapped(plans: Iterable[Any], ids: np.ndarray) -> Iterator[Any]:
    """Plans made over the sub-dataset ``ids`` (sample k of it is dataset sample ``ids[k]``), with their sample
    ids mapped back to the dataset's: the same groups, micro-batches and lengths."""
    ids = np.asarray(ids, dtype=np.int64)
    try:
        for plan in plans:
            yield plan.with_sample_ids(ids[np.asarray(plan.sample_id_array, dtype=np.int64)])
    finally:
        _close(plans)


def _close(plans: Any) -> None:
    """Stop a plan source early (the planning thread or process of dcp.planner.ahead)."""
    close = getattr(plans, "close", None)
    if close is not None:
        close()
