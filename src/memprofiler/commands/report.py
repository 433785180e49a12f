"""``memprofiler report RUN_DIR [-o report.html]``: terminal summary and a self-contained HTML report."""

from __future__ import annotations

import argparse
from pathlib import Path


class ReportCommand:
    name = "report"
    help = "Summarise a run directory in the terminal and write a self-contained HTML report."

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("run_dir", metavar="RUN_DIR", help="the run's save_dir, or a directory above it")
        parser.add_argument(
            "-o",
            "--output",
            metavar="HTML",
            default=None,
            help="HTML report path (default: RUN_DIR's save_dir/report.html)",
        )
        parser.add_argument("--no-html", action="store_true", help="only print the terminal summary")
        parser.add_argument("--top", type=int, default=10, help="rows in the top-N tables (default: 10)")

    def run(self, args: argparse.Namespace) -> int:
        from memprofiler.analysis.artifacts import load_run
        from memprofiler.analysis.estimate import estimate_only, report_line
        from memprofiler.errors import ArtifactError
        from memprofiler.output.writers import write_text
        from memprofiler.reporters.html import HtmlReporter
        from memprofiler.reporters.model import build_model
        from memprofiler.reporters.terminal import TerminalReporter, make_console

        if estimate_only(args.run_dir) is not None:  # an estimate alone: its line, no run report
            make_console().print(report_line(args.run_dir, None), markup=False, highlight=False)
            return 0
        model = build_model(load_run(args.run_dir), top=args.top)
        console = make_console()
        TerminalReporter(model, top=args.top).render(console)
        if line := report_line(args.run_dir, model.run):
            console.print(line, markup=False, highlight=False)
        if not args.no_html:
            out = Path(args.output) if args.output else model.run.root / "report.html"
            try:
                write_text(out, HtmlReporter(model, top=args.top).render())
            except OSError as err:
                raise ArtifactError(f"{out}: cannot write the report ({err.strerror or err})") from None
            console.print(f"HTML report: {out}", markup=False, highlight=False)
        return 0
