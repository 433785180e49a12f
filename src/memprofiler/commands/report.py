"""``memprofiler report RUN_DIR [RUN_DIR ...] [-o report.html]``: terminal summary and a self-contained
HTML report. A RUN_DIR may be a URL (``s3://...``); several (one per node) are merged by rank.
Profiler traces (``*.pt.trace.json[.gz]``) under a RUN_DIR, given in its place or with
``--traces`` get the profiler views (memory, operators, modules, steps, ranks)."""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from memprofiler.commands._shared import (
    RUN_DIR_HELP,
    add_html_output,
    add_run_dir,
    add_top,
    load_many,
    warn_cuts,
)
from memprofiler.errors import ArtifactError, NoRunFilesError

if TYPE_CHECKING:
    from rich.console import Console

    from memprofiler.analysis.traces.memory_categories import CategoryTimeline
    from memprofiler.analysis.traces.views import ProfilerViews


class ReportCommand:
    name = "report"
    help = "Summarise a run directory in the terminal and write a self-contained HTML report."

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None:
        add_run_dir(
            parser, nargs="+", help=RUN_DIR_HELP + "; several directories (one per node) are merged by rank"
        )
        add_html_output(parser, default="report.html in the run's save_dir; ./report.html for a URL")
        add_top(parser, 10, "rows in the top-N tables")
        parser.add_argument(
            "--traces",
            action="append",
            default=[],
            metavar="PATH",
            help="a profiler trace (*.pt.trace.json[.gz]) or a directory searched for them (repeatable); "
            "traces under RUN_DIR are read anyway",
        )

    def run(self, args: argparse.Namespace) -> int:
        from memprofiler.analysis.estimate import estimate_only, report_line
        from memprofiler.analysis.files.fs import named_as_given
        from memprofiler.analysis.runs.multi_dir import report_root
        from memprofiler.analysis.traces.events import is_trace_file
        from memprofiler.output.writers import write_text
        from memprofiler.reporters.explorer.page import explorer_pages
        from memprofiler.reporters.html import HtmlReporter
        from memprofiler.reporters.model.report import build_model
        from memprofiler.reporters.terminal import TerminalReporter, make_console

        traces = [a for a in args.run_dir if is_trace_file(a)] + args.traces
        args.run_dir = [a for a in args.run_dir if not is_trace_file(a)]
        if not args.run_dir:
            return _traces_only(args, traces)
        if len(args.run_dir) == 1 and estimate_only(args.run_dir[0]) is not None:
            # an estimate alone: its line, no run report
            make_console().print(report_line(args.run_dir[0], None), markup=False, highlight=False)
            return 0
        try:
            run = load_many(self.name, args.run_dir, streamed=True)
        except ArtifactError as err:
            held = _only_traces(args.run_dir, err)
            if not held:
                raise
            # A folder of profiler traces alone (an ExtendedPyTorchProfiler without memprofiler's
            # callback): its views, and a line saying why there is no run report.
            make_console().print(
                f"{', '.join(args.run_dir)}: no memprofiler run files, only profiler traces: showing "
                "their views (to add traces to a run's report: memprofiler report RUN_DIR --traces DIR)",
                markup=False,
                highlight=False,
            )
            return _traces_only(args, [*args.run_dir, *traces])
        found = len(run.cuts)
        with named_as_given():  # the stats files are read here, a block at a time
            model = build_model(run, top=args.top)
        warn_cuts(self.name, run.cuts[found:])
        console = make_console()
        TerminalReporter(model, top=args.top).render(console)
        views = _views([run.root, *traces], console, args.top, run.run_ids)
        if len(args.run_dir) == 1 and (line := report_line(args.run_dir[0], model.run)):
            console.print(line, markup=False, highlight=False)
        if not args.no_html:
            out = Path(args.output) if args.output else report_root(args.run_dir, run) / "report.html"
            try:
                reporter = HtmlReporter(
                    model,
                    top=args.top,
                    extra=_sections(views, args.top),
                    categories=_timelines(views),
                    allocator=_allocator_peaks(views),
                )
                write_text(out, reporter.render())
                for rel, page in explorer_pages(model, args.top):  # linked from the report
                    write_text(_inside(out.parent, rel), page)
            except OSError as err:
                raise ArtifactError(f"{out}: cannot write the report ({err.strerror or err})") from None
            console.print(f"HTML report: {out}", markup=False, highlight=False)
        return 0


def _inside(folder: Path, rel: str) -> Path:
    """``folder / rel``, refused when it resolves outside ``folder`` (a symlinked page folder
    would take the pages out of the run directory or the ``-o`` target's folder).

    Raises:
        ArtifactError: one line naming the path, where it leads and the fix.
    """
    path = folder / rel
    root, resolved = folder.resolve(), path.resolve()
    if root not in resolved.parents:
        link = next((q for q in [path, *path.parents] if q.is_symlink()), path)
        raise ArtifactError(
            f"{path}: resolves to {resolved}, outside {root} ({link} is a link); the report writes only "
            f"inside its folder: remove the link, or pass -o to write the report elsewhere"
        )
    return path


def _views(
    paths: Sequence[str | Path], console: Console, top: int, run_ids: Mapping[str, str | None] | None = None
) -> ProfilerViews | None:
    """Read the traces under ``paths`` and print their views; ``None`` when there is none.

    Raises:
        ArtifactError: the traces (and the run directory's files, ``run_ids``) are of two runs.
    """
    from memprofiler.analysis.traces.views import build_views, one_run_traces
    from memprofiler.reporters.traces.terminal import ProfilerTerminalReporter

    for p in paths:
        if not Path(p).exists():
            raise ArtifactError(
                f"{p}: no such trace or directory; pass a *.pt.trace.json[.gz] or a directory"
            )
    views = build_views(one_run_traces([Path(p) for p in paths], run_ids))
    if views is not None:
        ProfilerTerminalReporter(views, top=top).render(console)
    return views


def _trace_label(views: ProfilerViews, n: int, rank: int | None, device: str) -> str:
    """``rank R · trace N · device``: the rank where known, the trace where there are several."""
    return (
        ("" if rank is None else f"rank {rank} · ")
        + (f"trace {n + 1} · " if len(views.traces) > 1 else "")
        + device
    )


def _timelines(views: ProfilerViews | None) -> list[tuple[str, CategoryTimeline]]:
    """Each memory-categories timeline of the traces, labelled by its trace, rank and device."""
    if views is None:
        return []
    return [
        (_trace_label(views, n, tv.rank, tl.device), tl)
        for n, tv in enumerate(views.traces)
        for tl in tv.categories
    ]


def _allocator_peaks(views: ProfilerViews | None) -> list[tuple[str, int]]:
    """Each trace device's allocator-curve peak, labelled as :func:`_timelines` labels them."""
    if views is None:
        return []
    return [
        (_trace_label(views, n, tv.rank, dv.memory.device), dv.memory.peak_allocated)
        for n, tv in enumerate(views.traces)
        for dv in tv.devices
    ]


def _only_traces(run_dirs: Sequence[str], err: ArtifactError) -> bool:
    """Whether ``err`` is "no memprofiler files" for local directories that hold profiler traces."""
    from memprofiler.analysis.traces.views import traces_in

    if not isinstance(err, NoRunFilesError):
        return False
    dirs = [Path(d) for d in run_dirs]
    return all(d.is_dir() for d in dirs) and bool(traces_in(dirs))


def _sections(views: ProfilerViews | None, top: int) -> str:
    from memprofiler.reporters.traces.html import profiler_sections

    return profiler_sections(views, top=max(top, 30)) if views is not None else ""


def _traces_only(args: argparse.Namespace, traces: Sequence[str]) -> int:
    """A report of profiler traces given without a run directory."""
    from memprofiler.output.writers import write_text
    from memprofiler.reporters.terminal import make_console
    from memprofiler.reporters.traces.html import profiler_page

    console = make_console()
    views = _views(traces, console, args.top)
    if views is None:
        raise ArtifactError(
            f"no *.pt.trace.json[.gz] under {', '.join(traces)}; pass the profiler's output directory"
        )
    if not args.no_html:
        out = (
            Path(args.output)
            if args.output
            else Path(traces[0]).parent / "report.html"
            if is_file(traces[0])
            else Path(traces[0]) / "report.html"
        )
        try:
            write_text(
                out, profiler_page(views, f"memprofiler report: {', '.join(traces)}", top=max(args.top, 30))
            )
        except OSError as err:
            raise ArtifactError(f"{out}: cannot write the report ({err.strerror or err})") from None
        console.print(f"HTML report: {out}", markup=False, highlight=False)
    return 0


def is_file(p: str) -> bool:
    return Path(p).is_file()
