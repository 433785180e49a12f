"""Names for the blocks a recording shows without a stack: the role map beside it.

memprofiler writes, beside each allocator recording, the storages of the model's parameters,
gradients, optimizer state and buffers as they were when the recording began
(:mod:`memprofiler.collectors.block_roles`). A block alive before the recording has no stack;
when its address is the start of one of those storages, readers show its role instead:
``parameter `model.blocks.0.attn.weight```, ``optimizer state (exp_avg) of `...```, grouped
under a category (``parameter``, ``gradient``, ``optimizer state (exp_avg)``, ``buffer``).

The role appears as synthetic frames (file :data:`ROLE_FILE`): the category, then the tensor.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

#: ``filename`` of the synthetic frames that carry a block's role.
ROLE_FILE = "<memprofiler role>"


def role_label(entry: Mapping[str, Any]) -> str:
    """``parameter `model.blocks.0.attn.weight```, ``optimizer state (exp_avg) of `...```."""
    role, name = entry.get("role", "?"), f"`{entry.get('name', '?')}`"
    others = entry.get("others")
    if isinstance(others, list) and others:  # one block, several tensors (FSDP2's gradients)
        name = ", ".join([name, *(f"`{o}`" for o in others)])
    if role == "optimizer state":
        return f"optimizer state ({entry.get('detail', '?')}) of {name}"
    if role == "gradient":  # detail "unsharded": FSDP2's, kept without gradient sync
        detail = entry.get("detail")
        return f"gradient ({detail}) of {name}" if detail else f"gradient of {name}"
    return f"{role} {name}"


def role_category(entry: Mapping[str, Any]) -> str:
    """The category a block is grouped and coloured under: ``optimizer state (exp_avg)``, ``parameter``..."""
    if entry.get("role") == "optimizer state":
        return f"optimizer state ({entry.get('detail', '?')})"
    return str(entry.get("role", "?"))


class RoleIndex:
    """Role entries by storage address.

    Args:
        entries: the ``roles`` list of a window index (``{"addr", "bytes", "role", "name"}``).
    """

    def __init__(self, entries: Iterable[Mapping[str, Any]] = ()) -> None:
        self._by_addr: dict[int, Mapping[str, Any]] = {}
        for e in entries:
            if isinstance(e, Mapping) and type(e.get("addr")) is int:
                self._by_addr.setdefault(e["addr"], e)
        self._frames: dict[int, list[dict[str, Any]]] = {}

    def __len__(self) -> int:
        return len(self._by_addr)

    def get(self, addr: Any) -> Mapping[str, Any] | None:
        return self._by_addr.get(addr) if type(addr) is int else None

    def frames(self, addr: Any) -> list[dict[str, Any]] | None:
        """Synthetic frames (category, then the tensor's label) for the block at ``addr``, or ``None``."""
        entry = self.get(addr)
        if entry is None:
            return None
        out = self._frames.get(addr)
        if out is None:
            out = self._frames[addr] = [
                {"name": role_category(entry), "filename": ROLE_FILE, "line": 0},
                {"name": role_label(entry), "filename": ROLE_FILE, "line": 0},
            ]
        return out

    def category_frames(self, addr: Any) -> list[dict[str, Any]] | None:
        """The category frame alone: the terminal analysis groups by category, not per tensor."""
        frames = self.frames(addr)
        return frames[:1] if frames else None


def role_index(index: Mapping[str, Any] | None) -> RoleIndex | None:
    """The role index of a window index (``None`` when it has no roles)."""
    roles = (index or {}).get("roles")
    return RoleIndex(roles) if isinstance(roles, list) and roles else None


class AnnotationSpans:
    """The ``record_function`` spans a recording kept (``external_annotations``), to name a block
    allocated with no Python stack by the span it was allocated in.

    The autograd engine allocates gradients on its own thread, where torch records no Python
    frame: on the recorded GPU demo every one of the 457 allocations without a stack fell inside
    Lightning's ``backward`` span. A sweep over the spans' starts and ends in time order keeps
    the open spans; the innermost open one names an entry.
    """

    def __init__(self, annotations: Any) -> None:
        events: list[tuple[int, int, str]] = []
        for a in annotations or ():
            if not isinstance(a, Mapping) or type(a.get("time_us")) is not int:
                continue
            stage = 0 if a.get("stage") == "START" else 1 if a.get("stage") == "END" else None
            if stage is not None:
                events.append((a["time_us"], stage, str(a.get("name", "?"))))
        events.sort(key=lambda e: (e[0], e[1]))
        self._events = events
        self._frames: dict[str, list[dict[str, Any]]] = {}

    def __bool__(self) -> bool:
        return bool(self._events)

    def names(self, times: Iterable[int]) -> list[str | None]:
        """The innermost span open at each time (``times`` ascending), or ``None``."""
        out: list[str | None] = []
        open_: list[str] = []
        k, events = 0, self._events
        for t in times:
            while k < len(events) and (events[k][0] < t or (events[k][0] == t and events[k][1] == 0)):
                _, stage, name = events[k]
                if stage == 0:
                    open_.append(name)
                elif name in open_:
                    del open_[len(open_) - 1 - open_[::-1].index(name)]
                k += 1
            out.append(open_[-1] if open_ else None)
        return out

    def frames(self, name: str | None) -> list[dict[str, Any]] | None:
        """One synthetic frame naming the span (see :data:`ROLE_FILE`), or ``None``."""
        if name is None:
            return None
        out = self._frames.get(name)
        if out is None:
            shown = name[len("memprofiler:") :] if name.startswith("memprofiler:") else name
            out = self._frames[name] = [
                {"name": f"no Python stack, during {shown}", "filename": ROLE_FILE, "line": 0}
            ]
        return out
