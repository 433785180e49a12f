"""``memprofiler snapshot FILE.pickle [--call FN:N] [--html out.html]``: peaks, live stacks,
fragmentation, OOMs; ``--call`` shows one collected call of a window's recording, ``--html``
writes the allocation explorer (one offline page)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from memprofiler.analysis.snapshot.calls import CallRange


class SnapshotCommand:
    name = "snapshot"
    help = "Analyse a CUDA allocator snapshot pickle (torch.cuda.memory._snapshot() / memory_viz format)."

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("file", metavar="FILE.pickle", help="allocator snapshot pickle (a path or a URL)")
        parser.add_argument(
            "--html",
            metavar="OUT",
            default=None,
            help="also write the allocation explorer: one self-contained, offline HTML page",
        )
        parser.add_argument(
            "--top", type=int, default=10, help="stack groups and segments to show (default: 10)"
        )
        parser.add_argument(
            "--call",
            metavar="FN:N",
            default=None,
            help="one collected call of a window's recording (e.g. training_step:3): the snapshot "
            "as it stood at its end (or --phase start); the explorer opens on its range",
        )
        parser.add_argument(
            "--phase",
            choices=("start", "end"),
            default="end",
            help="with --call: the call's start or end (default: end)",
        )

    def run(self, args: argparse.Namespace) -> int:
        from memprofiler.analysis.files.gc_pause import gc_paused

        # The cyclic GC stays off from the load to the page: the millions of objects a large
        # snapshot loads would otherwise be scanned by each collection that the analysis and
        # the page's arrays start (a third of a 1M-entry conversion). They hold no cycles and
        # are freed as _run returns, before the GC resumes.
        with gc_paused():
            return self._run(args)

    def _run(self, args: argparse.Namespace) -> int:
        from memprofiler.analysis.files.fs import localize, named_as_given
        from memprofiler.analysis.snapshot.calls import (
            call_ranges,
            call_view,
            checked_index,
            find_call,
            parse_call,
        )
        from memprofiler.analysis.snapshot.oom_roles import is_oom_pickle, oom_role_index
        from memprofiler.analysis.snapshot.release import release
        from memprofiler.analysis.snapshot.roles import with_roles
        from memprofiler.analysis.snapshot.summary import analyze, analyze_columns, load_snapshot
        from memprofiler.errors import ArtifactError
        from memprofiler.output.writers import atomic_write_bytes
        from memprofiler.reporters.explorer.page import start_explorer
        from memprofiler.reporters.terminal import make_console, render_snapshot

        wanted = parse_call(args.call) if args.call else None
        with named_as_given():
            local = localize(args.file)
            snapshot = load_snapshot(local)
        # An OOM record's role map names what was alive at the OOM; without it the record reads as before.
        index, note = (
            oom_role_index(local, snapshot) if is_oom_pickle(local) else checked_index(local, snapshot)
        )
        if note is not None:
            print(f"memprofiler {self.name}: warning: {note}", file=sys.stderr)
        snapshot, roles = with_roles(snapshot, index)
        ranges = call_ranges(snapshot, index)
        console = make_console()
        # (the page's replay shares the columns the analysis read of the traces)
        whole, columns = analyze_columns(snapshot, args.file, top=args.top, roles=roles)
        if wanted is not None:
            rng = find_call(ranges, *wanted, source=args.file)
            ring = (index or {}).get("ring_entries")
            view = call_view(snapshot, rng, args.phase, args.file, ring if type(ring) is int else None)
            title = f"{args.file}, {rng.key} at its {args.phase}"
            render_snapshot(
                analyze(view, title, top=args.top, roles=roles), console, title, args.top, args.top
            )
        else:
            render_snapshot(whole, console, top=args.top, segments=args.top)
        if ranges:
            console.print(_calls_line(snapshot, ranges, wanted), markup=False, highlight=False)
        if args.html:
            record = _oom_record(local, console) if whole.ooms else None
            finish = start_explorer(snapshot, args.file, whole, args.top, record, index, args.call, columns)
            release(snapshot)  # (freed while the page's gzip runs in its worker thread)
            del snapshot
            try:
                atomic_write_bytes(args.html, finish())
            except OSError as err:
                raise ArtifactError(f"{args.html}: cannot write ({err.strerror or err})") from None
            console.print(f"HTML: {args.html}", markup=False, highlight=False)
        return 0


def _calls_line(snapshot: Mapping[str, Any], ranges: list[CallRange], wanted: object) -> str:
    """The calls marked in a recording, each with its entries in the trace."""
    from memprofiler.analysis.snapshot.calls import entry_range

    traces = snapshot.get("device_traces") or []
    parts = []
    for r in ranges:
        spans = [entry_range(t, r) for t in traces if t]
        span = next((s for s in spans if s is not None), None)
        if span is None:
            where = "incomplete"
        elif span[1] == 0:
            where = "no longer in the ring"
        else:
            where = f"entries {span[0]:,}-{max(span[0], span[1] - 1):,}"
        parts.append(f"{r.key} ({where})")
    return (
        f"calls marked in this recording ({len(ranges)}): "
        + ", ".join(parts)
        + ("" if wanted else "; show one with --call FN:N")
    )


def _oom_record(pickle_path: Path, console: Any) -> dict[str, Any] | None:
    """The YAML an OOM record wrote beside its pickle (``oom_rank_{r}_{n}.yaml``), when there is one.

    It holds what the pickle does not (the device's total, the step, the call counts); the
    explorer's banner states them. An unreadable one is a yellow line, not a failure.
    """
    from memprofiler import layout
    from memprofiler.analysis.files.yaml_read import read_yaml
    from memprofiler.analysis.runs.artifacts import name_pattern
    from memprofiler.errors import ArtifactError

    found = name_pattern(layout.OOM_PICKLE).match(pickle_path.name)
    if found is None:
        return None
    path = pickle_path.with_name(layout.OOM_YAML.format(rank=found["rank"], n=found["n"]))
    if not path.is_file():
        return None
    try:
        record = read_yaml(path)
    except ArtifactError as err:
        console.print(
            f"[yellow]warning:[/yellow] {err}; the OOM banner leaves out the step and total", highlight=False
        )
        return None
    return record if isinstance(record, dict) else None
