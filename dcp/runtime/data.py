"""Datasets the manager can plan over, and per-sample randomness that every rank agrees on.

A DCP dataset needs four things (``DCPDataset``): ``__len__``, ``__getitem__(i)``, ``lengths()`` (token
count of every sample, what the planner buckets on) and ``collate(samples) -> Batch``. Two optional
methods refine it: ``set_epoch(epoch)`` (called by the manager at the start of every epoch) and
``target_counts()`` (labelled tokens per sample, which token-weighted losses divide by; default: the
lengths).

Randomness attached to a sample (its synthetic content, diffusion noise, timesteps, masks) must come from
``sample_generator(seed, epoch, sample_id)``: every rank of an SP group collates the same micro-batch
independently, so anything drawn from a process-wide RNG would differ between the ranks that share one
sequence, and their shards would no longer belong to the same sample.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import torch

from dcp.data import Batch, collate_tokens, collate_video


class DatasetError(ValueError):
    """A dataset breaks the protocol the manager relies on; the message names what and how to fix it."""


def sample_seed(seed: int, epoch: int, sample_id: int) -> int:
    """A 63-bit seed that depends only on (seed, epoch, sample_id): the same on every rank and every run."""
    digest = hashlib.blake2b(f"{seed}:{epoch}:{sample_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def sample_generator(seed: int, epoch: int, sample_id: int, device: str | torch.device = "cpu") -> torch.Generator:
    """A torch.Generator seeded from (seed, epoch, sample_id): use it for all randomness of one sample."""
    return torch.Generator(device=device).manual_seed(sample_seed(seed, epoch, sample_id))


@runtime_checkable
class DCPDataset(Protocol):
    """What ``set_manager`` needs from a dataset (map-style, indexed by sample id)."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> Any: ...

    def lengths(self) -> Sequence[int]:
        """Token count of every sample, in index order (2D data: T * S)."""
        ...

    def collate(self, samples: Sequence[Any]) -> Batch:
        """One Batch (dcp.data.Batch) from the samples of a micro-batch, in the given order."""
        ...

    # Optional, for 2D data whose collate pads frames and spatial tokens separately:
    #   def sample_shapes(self) -> Sequence[tuple[int, int]]: (T, S) per sample, T * S == lengths()[i].
    # The planner then keeps every micro-batch's padded max(T) x max(S) within its seq_group's bound.


def check_dataset(dataset: Any) -> list[int]:
    """Validate the protocol once and return the lengths as ints (raises DatasetError)."""
    missing = [m for m in ("__len__", "__getitem__", "lengths", "collate") if not hasattr(dataset, m)]
    if missing:
        raise DatasetError(
            f"dataset ({type(dataset).__name__}) lacks {missing}: a DCP dataset needs __len__, __getitem__, "
            "lengths() (tokens per sample) and collate(samples) -> Batch (see dcp.runtime.data.DCPDataset)"
        )
    from dcp.planner.lengths import check_lengths

    lengths = check_lengths(dataset.lengths(), what="dataset.lengths()", error=DatasetError, low=-(2**62))
    if len(lengths) != len(dataset):
        raise DatasetError(
            f"dataset.lengths() has {len(lengths)} entries but len(dataset) is {len(dataset)}: "
            "return one token count per sample"
        )
    bad = [i for i, n in enumerate(lengths) if n < 1]
    if bad:
        raise DatasetError(
            f"dataset.lengths() has non-positive token counts at indices {bad[:5]}: drop empty samples"
        )
    return lengths


def target_counts(dataset: Any, lengths: Sequence[int]) -> list[int]:
    """Labelled tokens per sample (dataset.target_counts() when defined, else the lengths)."""
    if not hasattr(dataset, "target_counts"):
        return list(lengths)
    counts = [int(c) for c in dataset.target_counts()]
    if len(counts) != len(lengths):
        raise DatasetError(
            f"dataset.target_counts() must give one count per sample ({len(lengths)}), got {len(counts)} "
            "entries: return the labelled tokens the loss of each sample counts"
        )
    bad = [(i, c) for i, c in enumerate(counts) if c < 0]
    if bad:
        raise DatasetError(
            f"dataset.target_counts() has negative counts (index, count) {bad[:5]}"
            f"{f' and {len(bad) - 5} more' if len(bad) > 5 else ''}: each must be >= 0, the labelled tokens the "
            "loss of that sample counts"
        )
    return counts


class SyntheticTokenDataset:
    """Random token sequences of given lengths (Transformer-1D and causal LMs).

    Sample ``i`` of epoch ``e`` holds ``lengths[i]`` tokens drawn from ``sample_generator(seed, e, i)``; its
    targets are the next tokens, so it has ``lengths[i] - 1`` labelled tokens.
    """

    def __init__(self, lengths: Sequence[int], *, vocab_size: int, seed: int = 0) -> None:
        if vocab_size < 1:
            raise DatasetError(f"vocab_size ({vocab_size}) must be >= 1: pass the model's vocabulary size")
        self._lengths = [int(n) for n in lengths]
        if any(n < 2 for n in self._lengths):
            raise DatasetError(
                f"SyntheticTokenDataset lengths ({min(self._lengths)} min) must be >= 2: "
                "a causal LM sample needs a next token to predict"
            )
        self.vocab_size = vocab_size
        self.seed = seed
        self.epoch = 0

    def __len__(self) -> int:
        return len(self._lengths)

    def lengths(self) -> list[int]:
        return list(self._lengths)

    def target_counts(self) -> list[int]:
        return [n - 1 for n in self._lengths]

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def content_digest(self) -> str:
        """What the tokens are drawn from besides the lengths (the manager's data check compares it across ranks
        and with a checkpoint's): another seed or vocabulary is other data under the same lengths."""
        return f"synthetic tokens: seed {self.seed}, vocab {self.vocab_size}"

    def __getitem__(self, index: int) -> tuple[int, torch.Tensor]:
        gen = sample_generator(self.seed, self.epoch, index)
        return index, torch.randint(0, self.vocab_size, (self._lengths[index],), generator=gen)

    def collate(self, samples: Sequence[tuple[int, torch.Tensor]]) -> Batch:
        return collate_tokens([s for _, s in samples], [i for i, _ in samples])


class SyntheticVideoDataset:
    """Random video latents with per-sample shape (T frames, S spatial tokens) (Transformer-2D).

    The clean latent of sample ``i`` is fixed (drawn from ``sample_generator(seed, 0, i)``); the noise
    level and the noise, the per-epoch randomness of a diffusion step, come from
    ``sample_generator(seed, epoch, i)``. Input = noisy latent, target = the noise.
    """

    def __init__(
        self, shapes: Sequence[tuple[int, int]], *, in_channels: int, out_channels: int = 0, seed: int = 0
    ) -> None:
        self.shapes = [(int(t), int(s)) for t, s in shapes]
        if any(t < 1 or s < 1 for t, s in self.shapes):
            raise DatasetError("SyntheticVideoDataset shapes must have T >= 1 and S >= 1: drop empty videos")
        out = out_channels or in_channels
        if in_channels < 1 or out != in_channels:
            raise DatasetError(
                f"out_channels ({out}) must equal in_channels ({in_channels}) >= 1: the target is the added noise"
            )
        self.channels = in_channels
        self.seed = seed
        self.epoch = 0

    def __len__(self) -> int:
        return len(self.shapes)

    def lengths(self) -> list[int]:
        return [t * s for t, s in self.shapes]

    def sample_shapes(self) -> list[tuple[int, int]]:
        """(T, S) per sample: collate pads T and S separately, and the planner must know it."""
        return list(self.shapes)

    def target_counts(self) -> list[int]:
        return self.lengths()

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def content_digest(self) -> str:
        """What the latents are drawn from besides the shapes (see SyntheticTokenDataset.content_digest)."""
        return f"synthetic video: seed {self.seed}, channels {self.channels}"

    def __getitem__(self, index: int) -> tuple[int, torch.Tensor, torch.Tensor]:
        t, s = self.shapes[index]
        clean = torch.randn(t, s, self.channels, generator=sample_generator(self.seed, 0, index))
        gen = sample_generator(self.seed, self.epoch, index)
        level = torch.rand((), generator=gen)
        noise = torch.randn(t, s, self.channels, generator=gen)
        noisy = (1 - level).sqrt() * clean + level.sqrt() * noise
        return index, noisy, noise

    def collate(self, samples: Sequence[tuple[int, torch.Tensor, torch.Tensor]]) -> Batch:
        return collate_video([(x, y) for _, x, y in samples], [i for i, _, _ in samples])
