"""``memprofiler snapshot FILE.pickle [--html out.html]``: peaks, live stacks, fragmentation, OOMs."""

from __future__ import annotations

import argparse


class SnapshotCommand:
    name = "snapshot"
    help = "Analyse a CUDA allocator snapshot pickle (torch.cuda.memory._snapshot() / memory_viz format)."

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("file", metavar="FILE.pickle", help="allocator snapshot pickle (a path or a URL)")
        parser.add_argument(
            "--html", metavar="OUT", default=None, help="also write a self-contained HTML page"
        )
        parser.add_argument(
            "--top", type=int, default=10, help="stack groups and segments to show (default: 10)"
        )

    def run(self, args: argparse.Namespace) -> int:
        from memprofiler.analysis.fs import localize, named_as_given
        from memprofiler.analysis.snapshot import analyze, load_snapshot
        from memprofiler.errors import ArtifactError
        from memprofiler.output.writers import write_text
        from memprofiler.reporters.html_snapshot import render_snapshot_page
        from memprofiler.reporters.model import SnapshotEntry
        from memprofiler.reporters.terminal import make_console, render_snapshot

        with named_as_given():
            snapshot = load_snapshot(localize(args.file))
        analysis = analyze(snapshot, args.file, top=args.top)
        console = make_console()
        render_snapshot(analysis, console, top=args.top, segments=args.top)
        if args.html:
            try:
                write_text(
                    args.html, render_snapshot_page(SnapshotEntry(args.file, args.file, analysis), args.top)
                )
            except OSError as err:
                raise ArtifactError(f"{args.html}: cannot write ({err.strerror or err})") from None
            console.print(f"HTML: {args.html}", markup=False, highlight=False)
        return 0
