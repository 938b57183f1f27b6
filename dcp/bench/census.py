"""A census of the torch.distributed calls one process makes: kind, group size, bytes, and when.

``Census`` replaces the collective functions of ``torch.distributed`` (the module attributes, which is how
dcp calls them: ``dist.all_gather(...)``) with thin wrappers that record one :class:`Call` each and then
call the original, and ``new_group`` and ``split_group`` (what the SP registry calls in a world bound to a
device) with a wrapper that counts the groups this process asks for. It is
installed by ``dcp bench scale`` inside its own worker process and removed on exit (``with Census(...)``).

Under PyTorch's fake process group (backend ``fake``: collectives return at once and move no data) a
census can also stand in for the other ranks of a healthy job: ``agreeing_world=True`` makes an
all-gather return the caller's own contribution from every rank (what a job whose ranks agree gathers),
so the manager's plan checks pass, and every group is created on the fake backend (a gloo group cannot be
made over the fake store). The time spent filling those outputs is the census's own and is reported apart
(``own_s``) so that callers can subtract it.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

COLLECTIVES = ("all_gather", "all_gather_into_tensor", "all_gather_single", "all_gather_object", "all_reduce",
               "all_to_all", "all_to_all_single", "barrier", "broadcast", "broadcast_object_list", "gather", "reduce",
               "reduce_scatter_tensor", "scatter", "send", "recv")
"""The torch.distributed functions counted (the ones dcp, DDP-style engines and the profiler call)."""
GROUP_MAKERS = ("new_group", "split_group")
"""The torch.distributed functions that create process groups (counted in ``Census.new_groups``)."""


@dataclass(frozen=True, slots=True)
class Call:
    """One collective this process issued."""

    kind: str
    """torch.distributed function name, e.g. 'all_gather'."""
    group_size: int
    """Ranks in its process group."""
    nbytes: int
    """Bytes this rank contributes (its input tensor(s); 0 for object collectives and barriers)."""
    tick: int
    """The caller's clock when it was issued (``dcp bench scale``: the manager's finished steps)."""
    tag: str = ""
    """What the caller was doing (``Census.tag`` at the call), e.g. 'grad-sync' inside the engine."""


def _tensor_bytes(x: Any) -> int:
    if hasattr(x, "element_size") and hasattr(x, "numel"):
        return int(x.element_size() * x.numel())
    if isinstance(x, list | tuple):
        return sum(_tensor_bytes(t) for t in x)
    return 0


def _payload(kind: str, args: tuple, kwargs: dict) -> int:
    """Bytes this rank sends: the input argument of each collective (its position differs by function)."""
    if kind in ("all_gather", "all_gather_into_tensor", "all_gather_single", "all_to_all_single",
                "reduce_scatter_tensor"):
        x = args[1] if len(args) > 1 else kwargs.get("tensor", kwargs.get("input_tensor", kwargs.get("input")))
    elif kind == "all_to_all":
        x = args[1] if len(args) > 1 else kwargs.get("input_tensor_list")
    elif kind in ("all_reduce", "broadcast", "reduce", "send", "recv", "gather", "scatter"):
        x = args[0] if args else kwargs.get("tensor")
    else:
        return 0
    return _tensor_bytes(x)


class Census:
    """Counts collectives and group creations (``new_group``, ``split_group``) while installed
    (``with Census(dist): ...``)."""

    def __init__(self, dist: Any, *, clock: Callable[[], int] = lambda: 0, agreeing_world: bool = False,
                 others_row: Callable[[Any], Any] | None = None) -> None:
        self.dist = dist
        self.others_row = others_row
        """agreeing_world: what the other ranks' slots of an all-gather get, from this rank's input (default:
        a copy of it)."""
        self.clock = clock
        """Returns the tick every call is filed under (read at the call)."""
        self.agreeing_world = agreeing_world
        self.calls: list[Call] = []
        self.new_groups = 0
        """new_group and split_group calls this process made (each one a group it asked torch for, member or
        not)."""
        self.member_groups = 0
        """Of those, the groups that hold this rank (a real process group came back)."""
        self.new_group_s = 0.0
        """Seconds spent inside new_group and split_group."""
        self.own_s: dict[int, float] = {}
        """tick -> seconds the census itself spent standing in for other ranks (agreeing_world)."""
        self.tag = ""
        """Filed with every call (the caller sets it around a phase, e.g. the engine's gradient sync)."""
        self._saved: dict[str, Any] = {}

    def __enter__(self) -> Census:
        for name in (*COLLECTIVES, *GROUP_MAKERS):
            fn = getattr(self.dist, name, None)
            if fn is None:
                continue
            self._saved[name] = fn
            setattr(self.dist, name, self._new_group(fn) if name in GROUP_MAKERS else self._wrap(name, fn))
        return self

    def __exit__(self, *exc: Any) -> None:
        for name, fn in self._saved.items():
            setattr(self.dist, name, fn)
        self._saved.clear()

    def _group_size(self, kwargs: dict, args: tuple, kind: str) -> int:
        group = kwargs.get("group")
        if group is None and kind in ("all_reduce", "barrier") and len(args) > 2:
            group = args[2]
        return int(self.dist.get_world_size(group)) if group is not None else int(self.dist.get_world_size())

    def _wrap(self, kind: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(Call(kind, self._group_size(kwargs, args, kind), _payload(kind, args, kwargs),
                                   self.clock(), self.tag))
            out = fn(*args, **kwargs)
            if self.agreeing_world and kind in ("all_gather", "all_gather_into_tensor", "all_gather_single"):
                t0 = time.perf_counter()
                outputs, x = args[0], args[1] if len(args) > 1 else kwargs.get("tensor", kwargs.get("input_tensor"))
                mine = self.dist.get_rank(kwargs.get("group"))
                other = self.others_row(x) if self.others_row is not None else x
                # every rank of an agreeing job contributed what this one did
                if kind == "all_gather":
                    for i, o in enumerate(outputs):
                        o.copy_(x if i == mine else other)
                else:  # one output of W rows, flat or not
                    rows = outputs.view(-1, x.numel())
                    rows.copy_(other.reshape(1, -1).expand_as(rows))
                    rows[mine].copy_(x.reshape(-1))
                tick = self.clock()
                self.own_s[tick] = self.own_s.get(tick, 0.0) + time.perf_counter() - t0
            return out

        return counted

    def _new_group(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def counted(*args: Any, **kwargs: Any) -> Any:
            if self.agreeing_world:
                kwargs.pop("backend", None)  # the fake world's backend serves every group
            t0 = time.perf_counter()
            group = fn(*args, **kwargs)
            self.new_group_s += time.perf_counter() - t0
            self.new_groups += 1
            self.member_groups += int(group is not None and group is not self.dist.GroupMember.NON_GROUP_MEMBER)
            return group

        return counted

    def by_tick(self) -> dict[int, Counter]:
        """tick -> Counter of (tag, kind, group_size, nbytes) -> calls."""
        out: dict[int, Counter] = {}
        for c in self.calls:
            out.setdefault(c.tick, Counter())[(c.tag, c.kind, c.group_size, c.nbytes)] += 1
        return out
