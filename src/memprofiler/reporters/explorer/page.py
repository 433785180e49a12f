"""The allocation explorer: one offline HTML file to browse an allocator snapshot's history.

Python does the heavy work (:mod:`~memprofiler.analysis.snapshot.replay` for blocks and lifetimes,
:mod:`~memprofiler.analysis.snapshot.lod` for the level of detail); the page gets compact typed arrays, gzipped
and base64-encoded into one ``<script>`` element, and draws them on canvases with the script
of ``reporters/assets/explorer.js``. Nothing is fetched: the page opens from ``file://`` with a policy
that forbids every request.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from html import escape
from pathlib import Path
from typing import Any

import numpy as np

from memprofiler.analysis.files.gc_pause import gc_paused
from memprofiler.analysis.snapshot.calls import call_ranges, checked_index, entry_range
from memprofiler.analysis.snapshot.columns import TraceColumns
from memprofiler.analysis.snapshot.lod import level_of_detail
from memprofiler.analysis.snapshot.release import release
from memprofiler.analysis.snapshot.replay import DeviceReplay, StackTable, replay_blocks
from memprofiler.analysis.snapshot.roles import RoleIndex, role_index
from memprofiler.analysis.snapshot.summary import SnapshotAnalysis, load_snapshot
from memprofiler.errors import ArtifactError
from memprofiler.reporters.explorer.blob import Blob
from memprofiler.reporters.explorer.oom import banner_html, oom_view
from memprofiler.reporters.explorer.oom import meta as oom_meta
from memprofiler.reporters.model.report import ReportModel, SnapshotEntry
from memprofiler.reporters.parts.assets import asset
from memprofiler.reporters.parts.cells import b, json_script, page
from memprofiler.reporters.parts.snapshot import snapshot_html

#: Where the page's data goes, in the page built before the data is ready.
_DATA = "\0mp-data\0"
#: Folder, next to a run report, that holds one explorer per allocator history.
EXPLORER_DIR = "allocator-explorer"


def explorer_relpath(index: int, pickle_path: str) -> str:
    """Where the run report links the explorer of its ``index``-th allocator pickle."""
    return f"{EXPLORER_DIR}/{index}-{Path(pickle_path).stem}.html"


def _add_devices(
    blob: Blob,
    data: Mapping[str, Any],
    analysis: SnapshotAnalysis,
    table: StackTable,
    roles: RoleIndex | None,
    columns: dict[int, TraceColumns] | None,
) -> tuple[list[DeviceReplay], list[dict[str, Any]]]:
    """Each device's replay, its arrays added to ``blob`` as they are ready (its blocks' before
    its stacks are interned), and what the page states of it."""
    peaks = {d.device: d for d in analysis.devices}
    replays, devices = [], []
    for k, blocks in enumerate(replay_blocks(data, table, roles, columns)):
        p = f"d{k}."
        for name, arr, dtype in (
            ("start", blocks.start, "<i4"),
            ("end", blocks.end, "<i4"),
            ("size", blocks.size, "<f8"),
            ("addr", blocks.addr, "<f8"),
        ):
            blob.add(p + name, arr, dtype)
        blob.send()  # (gzipped while the stacks are interned)
        rep = blocks.replay()
        found = peaks.get(rep.device)
        peak = found.peak_allocated if found else int(rep.size[rep.end >= rep.instants].sum())
        info = _add_device(blob, rep, p, peak)
        info.update(
            device=rep.device,
            entries=rep.entries,
            instants=rep.instants,
            peak=peak,
            peakIndex=max(found.peak_allocated_index, 0) if found else 0,
            peakReserved=found.peak_reserved if found else int(rep.seg_size.sum()),
            ooms=rep.ooms,
        )
        replays.append(rep)
        devices.append(info)
    return replays, devices


def _add_device(blob: Blob, rep: DeviceReplay, p: str, peak: int) -> dict[str, Any]:
    """The arrays of a device after its blocks' (named ``p`` + name), its level of detail's too."""
    blob.add(p + "stack", rep.stack, "<i4")
    blob.add(p + "stream", rep.stream, "<i4")
    blob.send()
    lod = level_of_detail(rep, peak)  # (while the blocks' arrays are gzipped)
    arrays: tuple[tuple[str, np.ndarray, str], ...] = (
        ("level", lod.level, "<i1"),
        ("band", lod.band, "<f4"),
        ("time", rep.time_us, "<f8"),
        ("segStart", rep.seg_start, "<i4"),
        ("segEnd", rep.seg_end, "<i4"),
        ("segAddr", rep.seg_addr, "<f8"),
        ("segSize", rep.seg_size, "<f8"),
        ("segStream", rep.seg_stream, "<i4"),
    )
    for name, arr, dtype in arrays:
        blob.add(p + name, arr, dtype)
    return {"threshold": lod.threshold, "bandOffsets": lod.offsets, "blocks": int(rep.start.size)}


def _add_stacks(blob: Blob, table: StackTable) -> None:
    frames = np.asarray(table.frames, dtype=np.int64).reshape(-1, 4)
    blob.add("frameName", frames[:, 0], "<i4")
    blob.add("frameFile", frames[:, 1], "<i4")
    blob.add("frameLine", frames[:, 2], "<i4")
    blob.add("frameKind", frames[:, 3], "<i1")
    lengths = np.fromiter((len(s) for s in table.stacks), dtype=np.int64, count=len(table.stacks))
    blob.add("stackOffsets", np.concatenate([[0], np.cumsum(lengths)]), "<i4")
    flat = np.fromiter((f for s in table.stacks for f in s), dtype=np.int64, count=int(lengths.sum()))
    blob.add("stackFrames", flat, "<i4")
    blob.add("stackLabel", np.asarray(table.labels, dtype=np.int64), "<i4")


def build_explorer(
    data: Mapping[str, Any],
    source: str,
    analysis: SnapshotAnalysis,
    top: int = 10,
    record: Mapping[str, Any] | None = None,
    index: Mapping[str, Any] | None = None,
    select: str | None = None,
    columns: dict[int, TraceColumns] | None = None,
) -> str:
    """The explorer page of one ``_snapshot()`` dict already checked and analysed.

    Args:
        data: the snapshot dict (:func:`~memprofiler.analysis.snapshot.summary.load_snapshot`).
        source: the file name shown and used in error messages.
        analysis: :func:`~memprofiler.analysis.snapshot.summary.analyze` of ``data``; its peaks are
            the figures the page states.
        top: rows of the summary tables below the explorer.
        record: the OOM record's YAML (``oom_rank_{r}_{n}.yaml``) of an OOM pickle: the device's
            total, the step and the call counts that the banner states beside the pickle's own
            figures. A history with an ``oom`` entry gets the banner without it.
        index: the window index beside a recording (:func:`~memprofiler.analysis.snapshot.calls.read_index`): its
            role map names the blocks older than the trace (drawn and listed by role), and
            its calls (with those marked in the recording) can be picked to show their range.
        select: the call (``training_step:3``) whose range the page opens on.
        columns: the columns the analysis read of ``data``'s traces
            (:func:`~memprofiler.analysis.snapshot.summary.analyze_columns`), handed over to the
            replay (which empties the dict as it goes); without them it reads the traces itself.

    Raises:
        ArtifactError: an entry lacks a field the replay needs.

    Example:
        >>> html = build_explorer(snap, "snap.pickle", analyze(snap))  # doctest: +SKIP
    """
    return start_explorer(data, source, analysis, top, record, index, select, columns)().decode()


def start_explorer(
    data: Mapping[str, Any],
    source: str,
    analysis: SnapshotAnalysis,
    top: int = 10,
    record: Mapping[str, Any] | None = None,
    index: Mapping[str, Any] | None = None,
    select: str | None = None,
    columns: dict[int, TraceColumns] | None = None,
) -> Callable[[], bytes]:
    """:func:`build_explorer` up to the wait for the page's gzip, which runs in a worker thread
    (:mod:`~memprofiler.reporters.explorer.blob`); the function returned waits for it and gives
    the page, UTF-8 encoded (the data is joined into it once, where text would copy it four
    times: at 1M entries 15 MB each). ``data`` is no longer needed by then: a caller that drops it
    first frees the loaded snapshot (at 1M entries 0.2 s) while the gzip runs. Arguments and
    errors as :func:`build_explorer`.
    """
    table = StackTable()
    blob = Blob()
    try:
        try:
            with gc_paused():  # the replay builds plain data only, next to millions of loaded objects
                replays, devices = _add_devices(blob, data, analysis, table, role_index(index), columns)
        except (KeyError, TypeError, ValueError, OverflowError, AttributeError) as err:
            raise ArtifactError(
                f"{source}: malformed allocator snapshot (missing or bad field {err})"
            ) from None
        _add_stacks(blob, table)
        blob.send()
        oom = oom_view(data, replays, record)
        meta = {
            "source": source,
            "devices": devices,
            "strings": table.strings,
            "arrays": blob.manifest,
            "initial": oom_meta(oom) if oom else None,
            "calls": _call_ranges(data, index),
            "select": select,
        }
        summary = snapshot_html(SnapshotEntry(source, source, analysis), top)
    except BaseException:
        blob.close()
        raise
    # The page around its data, whose place is the last of the mark (nothing after it comes
    # from the snapshot).
    head, _, tail = _page(source, meta, _DATA, summary, banner_html(oom) if oom else "").rpartition(_DATA)
    before, after = head.encode(), tail.encode()
    return lambda: b"".join((before, blob.encode(), after))


def _call_ranges(data: Mapping[str, Any], index: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """Each call marked in the recording with its entries per device (``[first, end)``)."""
    traces = data.get("device_traces") or []
    out = []
    for rng in call_ranges(data, index):
        ranges = {}
        for dev, entries in enumerate(traces):
            found = entry_range(entries, rng) if entries else None
            if found is not None and found[1] > found[0]:
                ranges[str(dev)] = list(found)
        out.append({"key": rng.key, "ranges": ranges})
    return out


def _page(source: str, meta: dict[str, Any], blob: str, summary: str, banner: str = "") -> str:
    base = os.path.basename(source) or source
    peaks = " ".join(
        f"<span class='peak' data-device='{d['device']}' data-bytes='{d['peak']}'>device {d['device']}: "
        f"peak active {b(d['peak'])} at entry {d['peakIndex']:,}</span>"
        for d in meta["devices"]
    )
    body = (
        f"<h1>Allocation explorer <span class='muted'>{escape(base)}</span></h1>"
        f"{banner}<p id='mp-peaks'>{peaks}</p>"
        "<div id='mp-app'><p id='mp-loading'>Loading the trace…</p></div>"
        f"<details class='mp-summary'><summary>Summary tables</summary>{summary}</details>"
        f"<script type='application/json' id='mp-meta'>{json_script(meta)}</script>"
        f"<script type='application/octet-stream' id='mp-data'>{blob}</script>"
    )
    return page(
        f"allocation explorer: {base}", body, style=asset("explorer.css"), script=asset("explorer.js")
    )


def explorer_pages(model: ReportModel, top: int = 10) -> Iterator[tuple[str, str]]:
    """``(path relative to the report, page)`` of an explorer for every allocator pickle of a run.

    Raises:
        ArtifactError: a pickle became unreadable since the model was built.
    """
    for k, entry in enumerate(model.snapshots):
        with gc_paused():  # as the snapshot command: the loaded objects are freed before it resumes
            page = _explorer_page(entry, top)
        yield explorer_relpath(k, entry.path), page


def _explorer_page(entry: SnapshotEntry, top: int) -> str:
    data = load_snapshot(entry.path)
    index, _ = checked_index(entry.path, data)  # a foreign index was named in the report
    finish = start_explorer(data, entry.path, entry.analysis, top, entry.record, index)
    release(data)  # (freed while the page's gzip runs)
    return finish().decode()
