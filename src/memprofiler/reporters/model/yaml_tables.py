"""Tables from the nested YAML of the trackers' reports (``fsdp_mem_rank_*`` / ``module_mem_rank_*``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass
class ReportTable:
    """One table of an FSDP or module-wise report, and which of its columns hold bytes."""

    title: str
    columns: list[str]
    rows: list[list[Any]]
    byte_columns: frozenset[int] = frozenset()
    """Indexes of the columns whose numbers are bytes (the tracker categories)."""


def _is_device_snapshot(v: Any) -> bool:
    """``{device: {category: bytes}}``, as the trackers' ``peak`` / ``final`` are written."""
    return (
        isinstance(v, Mapping)
        and bool(v)
        and all(
            isinstance(c, Mapping) and all(not isinstance(x, (Mapping, list)) for x in c.values())
            for c in v.values()
        )
    )


def _is_modulewise(v: Any) -> bool:
    """``{module: {phase: [{device: {category: bytes}}, ...]}}``, the trackers' ``modules``."""
    return (
        isinstance(v, Mapping)
        and bool(v)
        and all(
            isinstance(phases, Mapping)
            and all(
                isinstance(snaps, list) and all(_is_device_snapshot(s) for s in snaps)
                for snaps in phases.values()
            )
            for phases in v.values()
        )
    )


def _categories(snapshots: list[Mapping[str, Any]]) -> list[str]:
    cats: list[str] = []
    for snap in snapshots:
        for per_dev in snap.values():
            cats.extend(str(c) for c in per_dev if str(c) not in cats)
    return cats


def report_tables(data: Any) -> list[ReportTable]:
    """Tables for an ``fsdp_mem_rank_*`` / ``module_mem_rank_*`` report's YAML.

    Scalars (``tracker``, ``rank``, ``call``, ``module_depth``, ...) form one key/value table
    shown as written, not as bytes; ``peak`` / ``final`` become a row per device; ``modules``
    becomes a row per module, phase and device; only the category columns are bytes. Empty
    lists (``notes: []``) are left out. Other shapes fall back to :func:`nested_tables`.
    """
    if not isinstance(data, Mapping):
        return [ReportTable(t, c, r) for t, c, r in nested_tables(data)]
    info: list[list[Any]] = []
    for k, v in data.items():
        if isinstance(v, list) and all(not isinstance(x, (Mapping, list)) for x in v):
            info.extend([str(k), x] for x in v)
        elif not isinstance(v, (Mapping, list)):
            info.append([str(k), v])
    out = [ReportTable("", ["key", "value"], info)] if info else []
    for k, v in data.items():
        name = str(k)
        if _is_device_snapshot(v):
            cats = _categories([v])
            rows = [[str(dev), *[per_dev.get(c) for c in cats]] for dev, per_dev in v.items()]
            out.append(ReportTable(name, ["device", *cats], rows, frozenset(range(1, len(cats) + 1))))
        elif _is_modulewise(v):
            snaps = [s for phases in v.values() for ss in phases.values() for s in ss]
            cats = _categories(snaps)
            rows = [
                [str(mod), str(phase), str(dev), *[per_dev.get(c) for c in cats]]
                for mod, phases in v.items()
                for phase, ss in phases.items()
                for s in ss
                for dev, per_dev in s.items()
            ]
            out.append(
                ReportTable(
                    name, ["module", "phase", "device", *cats], rows, frozenset(range(3, len(cats) + 3))
                )
            )
        elif isinstance(v, Mapping) or (
            isinstance(v, list) and any(isinstance(x, (Mapping, list)) for x in v)
        ):
            out.extend(ReportTable(t, c, r) for t, c, r in nested_tables(v, name))
    return out


def nested_tables(data: Any, title: str = "") -> list[tuple[str, list[str], list[list[Any]]]]:
    """Turn a report's nested YAML into ``(title, columns, rows)`` tables.

    A mapping whose values are all flat mappings becomes one table (a row per key, a column
    per inner key); a flat mapping becomes a two-column table; deeper data is split by key.
    The FSDP and module-wise reports are module -> category -> bytes, so each is one table.
    """
    if isinstance(data, Mapping) and data:
        values = list(data.values())
        if all(
            isinstance(v, Mapping) and v and all(not isinstance(x, (Mapping, list)) for x in v.values())
            for v in values
        ):
            cols: list[str] = []
            for v in values:
                cols.extend(str(c) for c in v if str(c) not in cols)
            rows = [[str(k), *[v.get(c) for c in cols]] for k, v in data.items()]
            return [(title, ["", *cols], rows)]
        if all(not isinstance(v, (Mapping, list)) for v in values):
            return [(title, ["key", "value"], [[str(k), v] for k, v in data.items()])]
        out: list[tuple[str, list[str], list[list[Any]]]] = []
        flat = [[str(k), v] for k, v in data.items() if not isinstance(v, (Mapping, list))]
        if flat:
            out.append((title, ["key", "value"], flat))
        for k, v in data.items():
            if isinstance(v, (Mapping, list)) and v:  # an empty list or mapping has no rows
                out.extend(nested_tables(v, f"{title} / {k}" if title else str(k)))
        return out
    if isinstance(data, list) and data and all(isinstance(v, Mapping) for v in data):
        cols = []
        for v in data:
            cols.extend(str(c) for c in v if str(c) not in cols)
        return [(title, cols, [[v.get(c) for c in cols] for v in data])]
    if isinstance(data, list):
        return [(title, ["value"], [[v] for v in data])]
    return [(title, ["value"], [[data]])]


#: What the per-module table derives from a module's snapshots: ``(column, later phases,
#: earlier phases)``, each the later snapshot's total minus the earlier one's; the first phase
#: name a module has is read (``MemTracker``'s names, then ``FSDPMemTracker``'s).
MODULE_DELTAS = (
    ("forward leaves", ("Post-Forward", "After Post-Forward"), ("Pre-Forward", "Before Pre-Forward")),
    ("forward peak above its start", ("Peak-Forward", "Peak Forward"), ("Pre-Forward", "Before Pre-Forward")),
    (
        "backward peak above its start",
        ("Peak-Backward", "Peak Backward"),
        ("Pre-Backward", "Before Pre-Backward"),
    ),
)


def _phase(phases: Mapping[str, Any], names: tuple[str, ...]) -> Any:
    return next((phases[n] for n in names if n in phases), None)


def _total(snaps: Any, device: str) -> int | None:
    """The ``Total`` (or ``total``) of ``device`` in a phase's first snapshot."""
    if not isinstance(snaps, list) or not snaps or not isinstance(snaps[0], Mapping):
        return None
    per_dev = snaps[0].get(device)
    if not isinstance(per_dev, Mapping):
        return None
    v = per_dev.get("Total", per_dev.get("total"))
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def module_deltas(data: Any) -> ReportTable | None:
    """Per module, what it added: its forward's bytes left at its end and its forward's and
    backward's peaks above their start, from the tracker's snapshots at the module's boundaries.

    The tracker's snapshots themselves are the whole device's memory at each boundary: every
    module's rows repeat the global totals. Their differences belong to the module (children
    included). ``None`` when the report has no module-wise snapshots.

    Example:
        >>> snap = lambda t: [{"cpu": {"Total": t}}]
        >>> module_deltas({"modules": {"m": {"Pre-Forward": snap(10), "Post-Forward": snap(25),
        ...     "Peak-Forward": snap(40)}}}).rows
        [['m', 'cpu', 15, 30, None]]
    """
    mods = data.get("modules") if isinstance(data, Mapping) else None
    if not _is_modulewise(mods):
        return None
    assert isinstance(mods, Mapping)
    per_module: dict[str, list[list[Any]]] = {}
    for mod, phases in mods.items():
        devices = [str(d) for ss in phases.values() for s in ss[:1] for d in s]
        for dev in dict.fromkeys(devices):
            cells: list[Any] = [dev]
            for _, later, earlier in MODULE_DELTAS:
                a, b = _total(_phase(phases, later), dev), _total(_phase(phases, earlier), dev)
                cells.append(a - b if a is not None and b is not None else None)
            per_module.setdefault(str(mod), []).append(cells)
    rows = [[name, *cells] for name, group in fold_wrappers(per_module) for cells in group]
    cols = ["module", "device", *(c for c, _, _ in MODULE_DELTAS)]
    return ReportTable("what each module added", cols, rows, frozenset(range(2, len(cols))))


#: Between the names of a folded chain of wrappers: ``DemoGPT`` then ``model``, a single
#: right-pointing angle quotation mark between them (written escaped: ruff flags the character).
CHAIN = " \u203a "


def fold_wrappers(rows: Mapping[str, list[list[Any]]]) -> list[tuple[str, list[list[Any]]]]:
    """Module rows with each wrapper folded into its one child: a module whose only child in
    ``rows`` has the same figures (a LightningModule around ``self.model``) is one row, named
    by the parent and the child's last name joined by :data:`CHAIN`. A wrapper that added
    anything of its own keeps its row.

    Example:
        >>> rows = fold_wrappers({"Lit": [[5]], "Lit.model": [[5]], "Lit.model.a": [[2]], "Lit.model.b": [[3]]})
        >>> rows == [("Lit" + CHAIN + "model", [[5]]), ("Lit.model.a", [[2]]), ("Lit.model.b", [[3]])]
        True
    """
    names = list(rows)
    folded: dict[str, str] = {}  # a module whose row is its wrappers' too -> the row's name
    for name in names:
        kids = [n for n in names if n.startswith(name + ".")]
        child = kids[0] if kids else None
        if child is None or child.count(".") != name.count(".") + 1 or rows[child] != rows[name]:
            continue
        if any(not k.startswith(child + ".") and k != child for k in kids):
            continue  # more than one child: not a wrapper
        folded[child] = folded.pop(name, name) + CHAIN + child.rsplit(".", 1)[1]
        folded[name] = ""  # its row is its child's
    return [(folded.get(n) or n, rows[n]) for n in names if folded.get(n, n) != ""]
