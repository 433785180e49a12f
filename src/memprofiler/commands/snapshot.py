"""``memprofiler snapshot FILE.pickle [--html out.html]``: peaks, live stacks, fragmentation, OOMs;
``--html`` writes the allocation explorer (one offline page)."""

from __future__ import annotations

import argparse


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
            snapshot = load_snapshot(localize(args.file))
        analysis = analyze(snapshot, args.file, top=args.top)
        console = make_console()
        render_snapshot(analysis, console, top=args.top, segments=args.top)
        if args.html:
            try:
                write_text(args.html, build_explorer(snapshot, args.file, analysis, args.top))
            except OSError as err:
                raise ArtifactError(f"{args.html}: cannot write ({err.strerror or err})") from None
            console.print(f"HTML: {args.html}", markup=False, highlight=False)
        return 0
