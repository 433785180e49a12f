"""Names for the blocks a recording shows without a stack: the role map beside it.

memprofiler writes, beside each allocator recording, the storages of the model's parameters,
gradients, optimizer state and buffers as they were when the recording began
(:mod:`memprofiler.collectors.block_roles`). A block alive before the recording has no stack;
when its address is the start of one of those storages, readers show its role instead:
``parameter `model.blocks.0.attn.weight```, ``optimizer state (exp_avg) of `...```, grouped
under a category (``parameter``, ``gradient``, ``optimizer state (exp_avg)``, ``buffer``).

The role appears as synthetic frames (file :data:`ROLE_FILE`): the category, then the tensor.

An OOM record's role map (``oom_rank_{r}_{n}.json``, ``roles_at: end``) is taken when the record
is written, at the end of its recording: there the blocks alive at the end that the trace saw
allocated are named too, their role's frames above their own stack (:func:`with_roles`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
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
        # One list per category: the analysis caches formatted stacks by the frames' ``id``.
        self._groups: dict[str, list[dict[str, Any]]] = {}

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
        return self._groups.setdefault(frames[0]["name"], frames[:1]) if frames else None

    def group_frames(self, frames: Any) -> list[dict[str, Any]] | None:
        """The category frame alone when ``frames`` begin with a role's two frames (a block
        :func:`with_roles` named), else ``None``: grouped by category, as older blocks are."""
        if not (isinstance(frames, list) and len(frames) >= 2):
            return None
        head = frames[:2]
        if not all(isinstance(f, Mapping) and f.get("filename") == ROLE_FILE for f in head):
            return None
        return self._groups.setdefault(str(head[0].get("name")), [dict(head[0])])


def role_index(index: Mapping[str, Any] | None) -> RoleIndex | None:
    """The role index of a window index (``None`` when it has no roles)."""
    roles = (index or {}).get("roles")
    return RoleIndex(roles) if isinstance(roles, list) and roles else None


def with_roles(
    data: dict[str, Any], index: Mapping[str, Any] | None
) -> tuple[dict[str, Any], RoleIndex | None]:
    """``data`` as readers show it with the role map ``index`` beside it, and its role index.

    A window's map is taken when its recording begins: it names the blocks older than the
    trace, and readers look those up themselves. An OOM record's (``roles_at: end``) is taken
    at the recording's end: each block the trace allocated and never freed whose address starts
    a storage of the map is that storage, so a copy of ``data`` is returned in which its
    allocation carries the role's frames above its own stack. Only the entries named are copied.
    """
    roles = role_index(index)
    if roles is None or (index or {}).get("roles_at") != "end":
        return data, roles
    traces = data.get("device_traces")
    if not isinstance(traces, list):
        return data, roles
    named = [_name_alive_at_end(t, roles) if isinstance(t, list) else t for t in traces]
    return {**data, "device_traces": named}, roles


def _name_alive_at_end(trace: Sequence[Any], roles: RoleIndex) -> Sequence[Any]:
    """``trace`` with the allocation alive at its end at each role's address named by the role."""
    seen: set[int] = set()
    out: list[Any] | None = None
    for i in range(len(trace) - 1, -1, -1):
        e = trace[i]
        if not isinstance(e, Mapping) or e.get("action") not in _BLOCK_ACTIONS:
            continue
        addr = e.get("addr")
        if type(addr) is not int or addr in seen:
            continue
        seen.add(addr)  # the newest event at an address decides whether its block is alive
        frames = roles.frames(addr) if e.get("action") == "alloc" else None
        if frames is not None:
            if out is None:
                out = list(trace)
            own = e.get("frames")
            out[i] = {**e, "frames": [*frames, *(own if isinstance(own, list) else ())]}
    return trace if out is None else out


#: Trace actions that allocate or free a block (segment events share block addresses).
_BLOCK_ACTIONS = frozenset({"alloc", "free_requested", "free_completed"})


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
