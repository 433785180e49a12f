"""Operator and module views of one profiler trace: host and device time, memory, calls, shapes.

One sweep per thread nests host spans (operators inside modules inside steps) and puts each
``[memory]`` event under the spans open at its time: the innermost operator gets it as
*self*, every enclosing operator and module as *inclusive*. Kernels reach the operator that
launched them through Kineto's ``External id``.
"""

from __future__ import annotations

from array import array
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from memprofiler.analysis.trace_events import (
    ANNOTATION,
    LIGHTNING_MODULE_PREFIX,
    MODULE,
    MODULE_PREFIXES,
    OP,
    Trace,
)

#: Factory operators the memory events table names with their caller, ``caller (aten::empty)``.
_FACTORIES = frozenset({"aten::empty", "aten::empty_strided", "aten::empty_like", "aten::resize_"})


@dataclass
class Nesting:
    """Where each host span and memory event sits: filled by :func:`nest`."""

    op_parent: array[int]
    """Host span -> the nearest enclosing operator span, or -1."""
    mod_parent: array[int]
    """Host span -> the nearest enclosing module span, or -1."""
    mem_op: array[int]
    """Memory event -> the innermost operator span open at its time, or -1."""
    mem_ops: list[tuple[int, ...]]
    """Memory event -> every operator span open at its time, innermost first."""
    mem_mod: array[int]
    """Memory event -> the innermost module span open at its time, or -1."""
    child_op_time: array[float]
    """Host span -> time (µs) of its direct child operators."""
    child_mod_time: array[float]
    """Module span -> time (µs) of its direct child modules."""
    device_self: array[float]
    """Host span -> device time (µs) of the kernels it launched itself."""


def nest(trace: Trace) -> Nesting:
    """Nest ``trace``'s host spans per thread and place memory events and kernels under them."""
    h, m = trace.host, trace.memory
    n, nm = len(h.ts), len(m.ts)
    out = Nesting(
        op_parent=array("q", [-1]) * n,
        mod_parent=array("q", [-1]) * n,
        mem_op=array("q", [-1]) * nm,
        mem_ops=[()] * nm,
        mem_mod=array("q", [-1]) * nm,
        child_op_time=array("d", [0.0]) * n,
        child_mod_time=array("d", [0.0]) * n,
        device_self=array("d", [0.0]) * n,
    )
    # (time, 0 = span start / 1 = memory event, -duration, index), per thread.
    items: dict[int, list[tuple[float, int, float, int]]] = {}
    for i in range(n):
        if h.kind[i] == OP or is_module(trace, i):
            items.setdefault(h.thread[i], []).append((h.ts[i], 0, -h.dur[i], i))
    for j in range(nm):
        items.setdefault(m.thread[j], []).append((m.ts[j], 1, 0.0, j))
    for seq in items.values():
        seq.sort()
        _sweep(seq, trace, out)
    by_ext: dict[int, int] = {}
    for i in range(n):
        if h.kind[i] == OP and h.ext[i] >= 0:
            by_ext.setdefault(h.ext[i], i)
    d = trace.device
    for k in range(len(d.ts)):
        i = by_ext.get(d.ext[k], -1)
        if i >= 0:
            out.device_self[i] += d.dur[k]
    return out


def is_module(trace: Trace, span: int) -> bool:
    """Whether host span ``span`` is a module the views show (Lightning's when it named any)."""
    h = trace.host
    if h.kind[span] != MODULE:
        return False
    return not trace.modules_from_lightning or trace.names[h.name[span]].startswith(LIGHTNING_MODULE_PREFIX)


def _sweep(seq: list[tuple[float, int, float, int]], trace: Trace, out: Nesting) -> None:
    h = trace.host
    stack: list[int] = []  # open spans, outermost first
    ends: list[float] = []
    for t, what, _, i in seq:
        while stack and ends[-1] <= t and not (what == 1 and ends[-1] == t):
            stack.pop()
            ends.pop()
        if what == 0:
            op_parent = mod_parent = -1
            for s in reversed(stack):
                if op_parent < 0 and h.kind[s] == OP:
                    op_parent = s
                if mod_parent < 0 and h.kind[s] == MODULE:
                    mod_parent = s
            out.op_parent[i], out.mod_parent[i] = op_parent, mod_parent
            if h.kind[i] == OP and op_parent >= 0:
                out.child_op_time[op_parent] += h.dur[i]
            if h.kind[i] == MODULE and mod_parent >= 0:
                out.child_mod_time[mod_parent] += h.dur[i]
            stack.append(i)
            ends.append(h.ts[i] + h.dur[i])
        else:
            ops = tuple(s for s in reversed(stack) if h.kind[s] == OP)
            out.mem_ops[i] = ops
            out.mem_op[i] = ops[0] if ops else -1
            out.mem_mod[i] = next((s for s in reversed(stack) if h.kind[s] == MODULE), -1)


@dataclass
class OpRow:
    """One operator name (or module, for :func:`module_rows`), summed over its calls."""

    name: str
    calls: int = 0
    host_self_us: float = 0.0
    host_total_us: float = 0.0
    device_self_us: float = 0.0
    device_total_us: float = 0.0
    self_alloc_bytes: int = 0
    alloc_bytes: int = 0
    """Bytes allocated inside it, children included (releases not subtracted)."""
    self_increase: int = 0
    increase: int = 0
    shapes: list[tuple[str, int]] = field(default_factory=list)
    """The most frequent ``Input Dims`` and their call counts (``record_shapes``)."""


def device_totals(trace: Trace, nesting: Nesting) -> array[float]:
    """Host span -> device time of the kernels it and every operator inside it launched."""
    total = array("d", nesting.device_self)
    # A child starts after its parent, so children come later in start order: add up backwards.
    order = sorted(range(len(total)), key=lambda i: (trace.host.ts[i], -trace.host.dur[i]))
    for i in reversed(order):
        p = nesting.op_parent[i]
        if p >= 0 and total[i]:
            total[p] += total[i]
    return total


def op_rows(trace: Trace, nesting: Nesting) -> list[OpRow]:
    """Every operator name's calls, host and device time and memory, by host self time."""
    h, m = trace.host, trace.memory
    rows: dict[int, OpRow] = {}
    shapes: dict[int, Counter[int]] = {}
    dev_total = device_totals(trace, nesting)
    for i in range(len(h.ts)):
        if h.kind[i] != OP:
            continue
        r = rows.get(h.name[i])
        if r is None:
            r = rows[h.name[i]] = OpRow(trace.names[h.name[i]])
        r.calls += 1
        r.host_total_us += h.dur[i]
        r.host_self_us += max(0.0, h.dur[i] - nesting.child_op_time[i])
        r.device_self_us += nesting.device_self[i]
        r.device_total_us += dev_total[i]
        if h.shapes[i] >= 0:
            shapes.setdefault(h.name[i], Counter())[h.shapes[i]] += 1
    for j in range(len(m.ts)):
        ops = nesting.mem_ops[j]
        if not ops:
            continue
        b = m.nbytes[j]
        for k, name in enumerate(dict.fromkeys(h.name[s] for s in ops)):
            r = rows[name]
            r.increase += b
            r.alloc_bytes += max(b, 0)
            if k == 0:
                r.self_increase += b
                r.self_alloc_bytes += max(b, 0)
    for name, counts in shapes.items():
        rows[name].shapes = [(trace.names[s], c) for s, c in counts.most_common(3)]
    return sorted(rows.values(), key=lambda r: (-r.host_self_us, r.name))


def module_rows(trace: Trace, nesting: Nesting) -> list[OpRow]:
    """Every module's calls, host time (self: less its child modules), device time and memory."""
    h, m = trace.host, trace.memory
    dev_total = device_totals(trace, nesting)
    rows: dict[int, OpRow] = {}
    mod_device = array("d", [0.0]) * len(h.ts)
    for i in range(len(h.ts)):
        # An operator directly under a module: its whole device time is that module's own.
        if h.kind[i] == OP and nesting.op_parent[i] < 0 and (mod := nesting.mod_parent[i]) >= 0:
            mod_device[mod] += dev_total[i]
    mem_self: dict[int, tuple[int, int]] = {}
    for j in range(len(m.ts)):
        if (mod := nesting.mem_mod[j]) >= 0:
            inc, alloc = mem_self.get(mod, (0, 0))
            mem_self[mod] = (inc + m.nbytes[j], alloc + max(m.nbytes[j], 0))
    incl_dev = array("d", mod_device)
    incl_mem = {i: list(v) for i, v in mem_self.items()}
    order = sorted((i for i in range(len(h.ts)) if is_module(trace, i)), key=lambda i: (h.ts[i], -h.dur[i]))
    for i in reversed(order):
        p = nesting.mod_parent[i]
        if p >= 0:
            incl_dev[p] += incl_dev[i]
            mine = incl_mem.get(i, [0, 0])
            theirs = incl_mem.setdefault(p, [0, 0])
            theirs[0] += mine[0]
            theirs[1] += mine[1]
    for i in order:
        r = rows.get(h.name[i])
        if r is None:
            r = rows[h.name[i]] = OpRow(module_name(trace.names[h.name[i]]))
        r.calls += 1
        r.host_total_us += h.dur[i]
        r.host_self_us += max(0.0, h.dur[i] - nesting.child_mod_time[i])
        r.device_self_us += mod_device[i]
        r.device_total_us += incl_dev[i]
        si, sa = mem_self.get(i, (0, 0))
        ti, ta = incl_mem.get(i, [0, 0])
        r.self_increase += si
        r.self_alloc_bytes += sa
        r.increase += ti
        r.alloc_bytes += ta
    return sorted(rows.values(), key=lambda r: (-r.host_total_us, r.name))


def module_name(span: str) -> str:
    """``[pl][module]torch.nn.modules.linear.Linear: layer.0`` -> ``layer.0 (Linear)``."""
    for prefix in MODULE_PREFIXES:
        if span.startswith(prefix):
            rest = span[len(prefix) :]
            cls, sep, path = rest.partition(": ")
            return f"{path} ({cls.rsplit('.', 1)[-1]})" if sep else rest
    return span


def op_label(trace: Trace, nesting: Nesting, span: int) -> str:
    """The operator a memory event is shown under: ``caller (aten::empty)`` for factory ops."""
    if span < 0:
        return "-"
    name = trace.names[trace.host.name[span]]
    parent = nesting.op_parent[span]
    if name in _FACTORIES and parent >= 0:
        return f"{trace.names[trace.host.name[parent]]} ({name})"
    return name


def annotation_spans(trace: Trace, prefixes: Iterable[str]) -> list[tuple[float, float]]:
    """``(start, end)`` of every annotation span whose name starts with one of ``prefixes``."""
    pre = tuple(prefixes)
    h = trace.host
    return [
        (h.ts[i], h.ts[i] + h.dur[i])
        for i in range(len(h.ts))
        if h.kind[i] == ANNOTATION and trace.names[h.name[i]].startswith(pre)
    ]
