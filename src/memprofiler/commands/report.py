"""``memprofiler report RUN_DIR [RUN_DIR ...] [-o report.html]``: terminal summary and a self-contained
HTML report. A RUN_DIR may be a URL (``s3://...``); several (one per node) are merged by rank."""

from __future__ import annotations

import argparse
from pathlib import Path


class ReportCommand:
    name = "report"
    help = "Summarise a run directory in the terminal and write a self-contained HTML report."

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "run_dir",
            metavar="RUN_DIR",
            nargs="+",
            help="the run's save_dir, or a directory above it; a local path or a URL (s3://...); "
            "several directories (one per node) are merged by rank",
        )
        parser.add_argument(
            "-o",
            "--output",
            metavar="HTML",
            default=None,
            help="HTML report path (default: RUN_DIR's save_dir/report.html; ./report.html for a URL)",
        )
        parser.add_argument("--no-html", action="store_true", help="only print the terminal summary")
        parser.add_argument("--top", type=int, default=10, help="rows in the top-N tables (default: 10)")

    def run(self, args: argparse.Namespace) -> int:
        from memprofiler.analysis.artifacts import load_run
        from memprofiler.analysis.fs import localize, named_as_given
        from memprofiler.analysis.multi_run import merge_runs, report_root
        from memprofiler.errors import ArtifactError
        from memprofiler.output.writers import write_text
        from memprofiler.reporters.html import HtmlReporter
        from memprofiler.reporters.model import build_model
        from memprofiler.reporters.terminal import TerminalReporter, make_console

        with named_as_given():
            run = merge_runs([(d, load_run(localize(d))) for d in args.run_dir])
        model = build_model(run, top=args.top)
        console = make_console()
        TerminalReporter(model, top=args.top).render(console)
        if not args.no_html:
            out = Path(args.output) if args.output else report_root(args.run_dir, run) / "report.html"
            try:
                write_text(out, HtmlReporter(model, top=args.top).render())
            except OSError as err:
                raise ArtifactError(f"{out}: cannot write the report ({err.strerror or err})") from None
            console.print(f"HTML report: {out}", markup=False, highlight=False)
        return 0
