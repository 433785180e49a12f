"""``memprofiler report RUN_DIR [-o report.html]``: terminal summary and a self-contained HTML report."""

from __future__ import annotations

import argparse
from pathlib import Path

from memprofiler.commands._shared import add_html_output, add_run_dir, add_top, load


class ReportCommand:
    name = "report"
    help = "Summarise a run directory in the terminal and write a self-contained HTML report."

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None:
        add_run_dir(parser)
        add_html_output(parser, default="report.html in the run's save_dir")
        add_top(parser, 10, "rows in the top-N tables")

    def run(self, args: argparse.Namespace) -> int:
        from memprofiler.analysis.estimate import estimate_only, report_line
        from memprofiler.errors import ArtifactError
        from memprofiler.output.writers import write_text
        from memprofiler.reporters.html import HtmlReporter
        from memprofiler.reporters.model import build_model
        from memprofiler.reporters.terminal import TerminalReporter, make_console

        if estimate_only(args.run_dir) is not None:  # an estimate alone: its line, no run report
            make_console().print(report_line(args.run_dir, None), markup=False, highlight=False)
            return 0
        model = build_model(load(self.name, args.run_dir), top=args.top)
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
