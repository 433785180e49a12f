"""An allocator history (``torch.cuda.memory._snapshot()``'s trace) replayed: each step's peak,
the blocks live then, grouped by the aten call that made them, and differences between two runs."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

MARK = 7777  # the step marker's requested bytes are MARK + step (an odd size no op asks for)
SETUP, UNLABELED, MIN_BLOCK = "(setup)", "(unlabeled)", 512
Event = dict[str, Any]
Groups = dict[str, list[int]]  # key -> [bytes, blocks]


def rounded(nbytes: int) -> int:
    """The caching allocator's 512 B rounding of a request (the history records requests)."""
    return max(MIN_BLOCK, -(-nbytes // MIN_BLOCK) * MIN_BLOCK)


@dataclass
class Call:
    """One aten op call as the dispatch saw it, with the allocator's figures over the call."""

    step: int
    op: str
    bw: bool
    module: str
    outs: frozenset[int] = frozenset()  # data pointers (estimate: allocation keys) of its outputs
    peak: int = 0  # max allocated during the call (exact on CUDA)
    after: int = 0  # allocated when it returned

    @property
    def label(self) -> str:
        return f"{self.op}{' [bw]' if self.bw else ''} @{self.module}"


@dataclass
class Block:
    addr: int
    size: int  # rounded
    meta: str
    index: int  # the event that allocated it
    frames: list[dict[str, Any]] = field(default_factory=list)
    kind: str = ""  # set by the estimate's log: workspace or scratch


def step_marks(events: Sequence[Event]) -> dict[int, int]:
    """Step -> index of its marker allocation (requested size MARK + step)."""
    return {
        ev["size"] - MARK: i
        for i, ev in enumerate(events)
        if ev.get("action") == "alloc" and MARK < ev.get("size", 0) <= MARK + 64
    }


def initial_live(snapshot: dict[str, Any], events: Sequence[Event]) -> dict[int, Block]:
    """Blocks live before the first event: freed in the trace before any allocation there, or
    still active at the end and never allocated in it (a history that wrapped or began late)."""
    seen_alloc: set[int] = set()
    out: dict[int, Block] = {}
    for ev in events:
        addr = ev.get("addr", -1)
        if ev.get("action") == "alloc":
            seen_alloc.add(addr)
        elif ev.get("action") in ("free_requested", "free_completed") and addr not in seen_alloc:
            out.setdefault(addr, Block(addr, rounded(ev["size"]), "(before history)", -1))
    for seg in snapshot.get("segments", []):
        addr = int(seg.get("address", 0))  # a segment's blocks lie one after the other from it
        for blk in seg.get("blocks", []):
            if blk.get("state") == "active_allocated" and addr not in seen_alloc:
                size = blk.get("requested_size") or blk["size"]
                out.setdefault(addr, Block(addr, rounded(size), "(before history)", -1))
            addr += int(blk["size"])
    return out


def replay(
    events: Sequence[Event], start: dict[int, Block], upto: int | None = None
) -> tuple[list[int], dict[int, Block]]:
    """Sum of live rounded blocks after each event, and the live blocks after event ``upto``.

    ``allocated_bytes`` drops at ``free_requested``; its ``free_completed`` (at once, or after a
    stream's event) changes nothing; a ``free_completed`` with no request before it frees then.
    Segment events change no allocated bytes.
    """
    live = dict(start)
    pending: set[int] = set()
    total = sum(b.size for b in live.values())
    curve: list[int] = []
    kept: dict[int, Block] = dict(live) if upto is not None and upto < 0 else {}
    for i, ev in enumerate(events):
        act, addr = ev.get("action"), ev.get("addr", -1)
        if act == "alloc":
            blk = Block(addr, rounded(ev["size"]), str(ev.get("user_metadata") or ""), i)
            blk.frames = ev.get("frames") or []
            blk.kind = str(ev.get("kind", ""))
            old = live.pop(addr, None)
            total += blk.size - (old.size if old else 0)
            live[addr] = blk
        elif act == "free_requested" or (act == "free_completed" and addr not in pending):
            old = live.pop(addr, None)
            total -= old.size if old else 0
            if act == "free_requested":
                pending.add(addr)
        elif act == "free_completed":
            pending.discard(addr)
        curve.append(total)
        if upto is not None and i == upto:
            kept = dict(live)
    return curve, kept


def label_by_outputs(events: Sequence[Event], calls: Sequence[Call], lookahead: int = 64) -> None:
    """Where the history has no user metadata (a torch without ``_set_memory_metadata``): name
    each event's call by the calls' output addresses, in order (an allocation that is no call's
    output goes to the last call that allocated an output)."""
    marks = {i: step for step, i in step_marks(events).items()}
    first: dict[int, int] = {}
    for k, call in enumerate(calls):
        first.setdefault(call.step, k)
    c: int | None = None
    marker = None
    for i, ev in enumerate(events):
        if i in marks:
            c, marker = first.get(marks[i]), ev.get("addr")
            continue
        if c is None or (ev.get("action") != "alloc" and ev.get("addr") == marker):
            continue  # before the first step (the model, the batch), or the marker's free
        if ev.get("action") == "alloc":
            for k in range(c, min(len(calls), c + lookahead)):
                if ev.get("addr") in calls[k].outs:
                    c = k
                    break
        ev["user_metadata"] = str(c)


def step_windows(events: Sequence[Event]) -> dict[int, tuple[int, int]]:
    """Step -> [first, end) event indices, from one marker to the next."""
    marks = sorted(step_marks(events).items())
    ends = [i for _, i in marks[1:]] + [len(events)] * bool(marks)
    return {step: (i, end) for (step, i), end in zip(marks, ends, strict=True)}


def peak_moment(
    curve: Sequence[int], events: Sequence[Event], calls: Sequence[Call], lo: int, hi: int
) -> int:
    """The event in ``[lo, hi)`` at the step's peak: among the calls with events there, the one
    whose exact peak is largest; inside it the event with the most live bytes. The whole window
    when no event names a call."""
    best, best_key = -1, None
    named = {int(k) for k in (str(ev.get("user_metadata") or "") for ev in events[lo:hi]) if k.isdigit()}
    for idx in sorted(c for c in named if c < len(calls)):  # the first call at the largest peak
        if calls[idx].peak > best:
            best, best_key = calls[idx].peak, str(idx)
    inside = [i for i in range(lo, hi) if best_key is not None and events[i].get("user_metadata") == best_key]
    window = range(inside[0], inside[-1] + 1) if inside else range(lo, hi)
    return max(window, key=lambda i: (curve[i], -i)) if len(window) else lo


def frame_key(frames: Sequence[dict[str, Any]]) -> str:
    """The innermost frame in transformers/ or torch/nn/ (not Module's call machinery), else the
    innermost outside torch, as ``path:line:function``."""

    def show(fr: dict[str, Any]) -> str:
        name = str(fr.get("filename", "?"))
        for cut in ("site-packages/", "/src/", "/tools/"):
            if cut in name:
                name = name.split(cut, 1)[1]
                break
        return f"{name}:{fr.get('line', '?')}:{fr.get('name', '?')}"

    for fr in frames:
        name = str(fr.get("filename", ""))
        if ("/transformers/" in name or "/torch/nn/" in name) and not name.endswith("modules/module.py"):
            return show(fr)
    for fr in frames:
        if "/torch/" not in str(fr.get("filename", "")) and str(fr.get("filename", "")).endswith(".py"):
            return show(fr)
    return "(no python frame)"


def freed_inside(events: Sequence[Event]) -> set[int]:
    """Indices of the allocations freed by the call that made them (same metadata): scratch."""
    made: dict[int, int] = {}
    out: set[int] = set()
    for i, ev in enumerate(events):
        act, addr = ev.get("action"), ev.get("addr", -1)
        if act == "alloc":
            made[addr] = i
        elif act in ("free_requested", "free_completed") and addr in made:
            j = made.pop(addr)
            if ev.get("user_metadata") and events[j].get("user_metadata") == ev.get("user_metadata"):
                out.add(j)
    return out


def block_key(b: Block, calls: Sequence[Call], scratch: set[int], first_mark: int) -> str:
    """``op [bw] @module`` of the call that allocated ``b``; ``:: workspace`` when the call kept it
    without returning it, ``:: scratch`` when the call freed it before returning."""
    if b.meta.isdigit() and int(b.meta) < len(calls):
        call = calls[int(b.meta)]
        if b.kind:
            kind = "" if b.kind == "out" else b.kind
        elif b.addr in call.outs:
            kind = ""
        else:
            kind = "scratch" if b.index in scratch else "workspace"
        return call.label + (f" :: {kind}" if kind else "")
    if b.meta == "(before history)":
        return b.meta
    if b.index < first_mark:
        return SETUP
    return f"{UNLABELED} {frame_key(b.frames)}"


def group(blocks: dict[int, Block], key: Callable[[Block], str]) -> Groups:
    out: Groups = {}
    for b in blocks.values():
        g = out.setdefault(key(b), [0, 0])
        g[0] += b.size
        g[1] += 1
    return out


def collapse(groups: Groups, part: str) -> Groups:
    """Merge ``op [bw] @module :: kind`` keys by ``op`` (with [bw] and kind) or by ``module``."""
    out: Groups = {}
    for key, (n, c) in groups.items():
        head, sep, rest = key.partition(" @")
        if sep:
            module, _, kind = rest.partition(" :: ")
            op, bw = head.removesuffix(" [bw]"), " [bw]" if head.endswith(" [bw]") else ""
            key = f"{op}{bw}{' :: ' + kind if kind else ''}" if part == "op" else f"@{module}{bw}"
        g = out.setdefault(key, [0, 0])
        g[0] += n
        g[1] += c
    return out


def diff(real: Groups, est: Groups, top: int) -> list[dict[str, Any]]:
    """Rows ``real - estimate`` per key, largest difference first."""
    rows: list[dict[str, Any]] = []
    for key in set(real) | set(est):
        r, e = real.get(key, [0, 0]), est.get(key, [0, 0])
        if r[0] != e[0]:
            rows.append({"key": key, "delta": r[0] - e[0], "real": r[0], "est": e[0], "n": [r[1], e[1]]})
    rows.sort(key=lambda row: (-abs(row["delta"]), row["key"]))
    return rows[:top]


def module_peaks(calls: Sequence[Call], depth: int = 3) -> dict[str, int]:
    """The largest allocated inside each (step, forward/backward, module cut to ``depth`` parts),
    in the order they first ran."""
    out: dict[str, int] = {}
    for call in calls:
        key = f"s{call.step} {'bw' if call.bw else 'fw'} {'.'.join(call.module.split('.')[:depth])}"
        out[key] = max(out.get(key, 0), call.peak)
    return out


def gap_jumps(real: dict[str, int], est: dict[str, int], top: int) -> list[dict[str, Any]]:
    """Where ``real - estimate`` of the peak inside each module's forward/backward changes most
    from the module before (in the real run's order; modules on one side only are skipped)."""
    rows: list[dict[str, Any]] = []
    prev = 0
    for key, peak in real.items():
        if key in est:
            gap = peak - est[key]
            rows.append({"module": key, "jump": gap - prev, "gap": gap, "real": peak, "est": est[key]})
            prev = gap
    rows.sort(key=lambda row: -abs(row["jump"]))
    return [r for r in rows[:top] if r["jump"]]
