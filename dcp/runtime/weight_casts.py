"""advanced.cache_weight_casts: autocast's bf16 weight copies kept for a step's later micro-batches.

Autocast casts a weight in each forward that uses it, and clears its cast cache when the outermost autocast
context exits, so a step of n micro-batches casts every weight n times. ``CastHold`` holds one level of the
training thread's autocast nesting from the step's first forward: the copies made there (with the cache on)
serve the later micro-batches, and are dropped before the update changes the weights they were made from.

What it relies on, and where it stops:
- The weights do not change between a step's micro-batches (the engine updates them once, at the step's end).
  A loop left inside a step whose iterator is kept alive holds on until the iterator is closed; the next hold
  clears the cache first, so nothing made before it is read.
- Autocast's cache is one map for the process, keyed by the weight, while the nesting level and the cache-on
  flag are per thread: another thread's outermost autocast exit clears it (a saving lost, no wrong value),
  and a cast that another thread caches is served to the training thread too.
- A weight used more than once in a forward shares one copy, so its uses' gradients are summed in bf16 before
  the cast back to fp32 (in fp32 without the hold): exact for models that use each weight once per forward,
  as the reference models do.
- The cache must keep the cast's autograd history when the cast was made under ``no_grad`` (a reentrant
  checkpoint's forward, a no-grad call inside a step); torch builds without pytorch/pytorch#165068 cache a
  detached copy, whose weight would then get no gradient. ``cache_keeps_autograd`` checks the running torch.
"""

from __future__ import annotations

from typing import Any

import torch

from dcp.config import AdvancedConfig, ConfigError, RuntimeConfig


class CastHold:
    """One level of the calling thread's autocast nesting, taken at a step's first cached forward."""

    def __init__(self) -> None:
        self.held = False

    def take(self) -> None:
        torch.autocast_increment_nesting()
        torch.clear_autocast_cache()  # nothing cached before this step's forwards is read in them
        self.held = True

    def release(self) -> None:
        """Drop the copies (also under a user's own outer autocast: they go stale at the update)."""
        if self.held:
            torch.autocast_decrement_nesting()
            torch.clear_autocast_cache()
            self.held = False


def cache_keeps_autograd(device_type: str) -> bool:
    """True when a weight cast cached under ``no_grad`` and reused with grad enabled still reaches the weight's
    gradient (pytorch/pytorch#165068): a cast of a 2 x 2 leaf, cache held, then cleared."""
    w = torch.ones(2, 2, device=device_type, requires_grad=True)
    x = torch.ones(2, 2, device=device_type)
    torch.autocast_increment_nesting()
    try:
        with torch.autocast(device_type=device_type, dtype=torch.bfloat16, cache_enabled=True):
            with torch.no_grad():
                torch.mm(x, w)
            return torch.mm(x, w).requires_grad
    finally:
        torch.autocast_decrement_nesting()
        torch.clear_autocast_cache()


def wanted(runtime: RuntimeConfig, advanced: AdvancedConfig, engine: Any, log: Any) -> bool:
    """Whether the engine holds the casts: advanced.cache_weight_casts, where it acts (a forward under autocast,
    eager blocks: a compiled block does not read autocast's cache, and its guard on the cache flag would compile
    each block twice), and refused on a torch whose cache drops the casts' autograd history."""
    if not advanced.cache_weight_casts:
        return False
    if not engine.uses_autocast():
        log.info("advanced.cache_weight_casts does nothing here: the forward runs without autocast "
                 f"(engine {engine.name}, precision {engine.precision})")
        return False
    if runtime.compile != "off":
        log.info(f"advanced.cache_weight_casts is off with runtime.compile = {runtime.compile!r}: compiled blocks "
                 "do not read autocast's cast cache")
        return False
    if not cache_keeps_autograd(engine.device.type):
        raise ConfigError(
            f"advanced.cache_weight_casts (true) needs autocast's cache to keep a cast's autograd history, which "
            f"torch {torch.__version__} does not (pytorch/pytorch#165068): weights cast under no_grad would get "
            "no gradient; set advanced.cache_weight_casts = false, or use a torch with that fix")
    return True
