"""``memprofiler snapshot FILE.pickle [--html out.html]``: peaks, live stacks, fragmentation, OOMs;
``--html`` writes the allocation explorer (one offline page)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


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

    def run(self, args: argparse.Namespace) -> int:
        from memprofiler.analysis.fs import localize, named_as_given
        from memprofiler.analysis.snapshot import analyze, load_snapshot
        from memprofiler.errors import ArtifactError
        from memprofiler.output.writers import write_text
        from memprofiler.reporters.explorer import build_explorer
        from memprofiler.reporters.terminal import make_console, render_snapshot

        with named_as_given():
            local = localize(args.file)
            snapshot = load_snapshot(local)
        analysis = analyze(snapshot, args.file, top=args.top)
        console = make_console()
        render_snapshot(analysis, console, top=args.top, segments=args.top)
        if args.html:
            record = _oom_record(local, console) if analysis.ooms else None
            try:
                write_text(args.html, build_explorer(snapshot, args.file, analysis, args.top, record))
            except OSError as err:
                raise ArtifactError(f"{args.html}: cannot write ({err.strerror or err})") from None
            console.print(f"HTML: {args.html}", markup=False, highlight=False)
        return 0


def _oom_record(pickle_path: Path, console: Any) -> dict[str, Any] | None:
    """The YAML an OOM record wrote beside its pickle (``oom_rank_{r}_{n}.yaml``), when there is one.

    It holds what the pickle does not (the device's total, the step, the call counts); the
    explorer's banner states them. An unreadable one is a yellow line, not a failure.
    """
    from memprofiler import layout
    from memprofiler.analysis.artifacts import name_pattern
    from memprofiler.analysis.yaml_read import read_yaml
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
