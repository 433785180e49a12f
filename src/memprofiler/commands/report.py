"""``memprofiler report RUN_DIR [RUN_DIR ...] [-o report.html]``: terminal summary and a self-contained
HTML report. A RUN_DIR may be a URL (``s3://...``); several (one per node) are merged by rank."""

from __future__ import annotations

import argparse
from pathlib import Path

from memprofiler.commands._shared import (
    RUN_DIR_HELP,
    add_html_output,
    add_run_dir,
    add_top,
    load_many,
    warn_cuts,
)


class ReportCommand:
    name = "report"
    help = "Summarise a run directory in the terminal and write a self-contained HTML report."

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None:
        add_run_dir(
            parser, nargs="+", help=RUN_DIR_HELP + "; several directories (one per node) are merged by rank"
        )
        add_html_output(parser, default="report.html in the run's save_dir; ./report.html for a URL")
        add_top(parser, 10, "rows in the top-N tables")

    def run(self, args: argparse.Namespace) -> int:
        from memprofiler.analysis.estimate import estimate_only, report_line
        from memprofiler.analysis.fs import named_as_given
        from memprofiler.analysis.multi_run import report_root
        from memprofiler.errors import ArtifactError
        from memprofiler.output.writers import write_text
        from memprofiler.reporters.explorer import explorer_pages
        from memprofiler.reporters.html import HtmlReporter
        from memprofiler.reporters.model import build_model
        from memprofiler.reporters.terminal import TerminalReporter, make_console

        if len(args.run_dir) == 1 and estimate_only(args.run_dir[0]) is not None:
            # an estimate alone: its line, no run report
            make_console().print(report_line(args.run_dir[0], None), markup=False, highlight=False)
            return 0
        run = load_many(self.name, args.run_dir, streamed=True)
        found = len(run.cuts)
        with named_as_given():  # the stats files are read here, a block at a time
            model = build_model(run, top=args.top)
        warn_cuts(self.name, run.cuts[found:])
        console = make_console()
        TerminalReporter(model, top=args.top).render(console)
        if len(args.run_dir) == 1 and (line := report_line(args.run_dir[0], model.run)):
            console.print(line, markup=False, highlight=False)
        if not args.no_html:
            out = Path(args.output) if args.output else report_root(args.run_dir, run) / "report.html"
            try:
                write_text(out, HtmlReporter(model, top=args.top).render())
                for rel, page in explorer_pages(model, args.top):  # linked from the report
                    write_text(out.parent / rel, page)
            except OSError as err:
                raise ArtifactError(f"{out}: cannot write the report ({err.strerror or err})") from None
            console.print(f"HTML report: {out}", markup=False, highlight=False)
        return 0
