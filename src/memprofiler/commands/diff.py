"""``memprofiler diff RUN_A RUN_B``: per function and metric (``--per-call``: per key), A, B, the change."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from memprofiler.commands._shared import add_run_dir, add_top, load, warn_cuts

if TYPE_CHECKING:
    from memprofiler.analysis.runs.artifacts import RunArtifacts


class DiffCommand:
    name = "diff"
    help = (
        "Compare two runs per function and metric (medians over the calls both hold; --per-call: "
        "per snapshot key), largest absolute change first."
    )

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None:
        add_run_dir(parser, "run_a", "RUN_A", "baseline run directory (its newest run when it holds several)")
        add_run_dir(parser, "run_b", "RUN_B", "run directory compared with it")
        parser.add_argument(
            "--metric",
            action="append",
            default=[],
            metavar="PATTERN",
            help="only metrics matching (repeatable), e.g. 'rss*'",
        )
        parser.add_argument(
            "--key",
            action="append",
            default=[],
            metavar="PATTERN",
            help="only snapshot keys matching, e.g. '*.end'",
        )
        parser.add_argument(
            "--min-change", default="0", metavar="SIZE", help="hide smaller absolute changes, e.g. 1MiB"
        )
        add_top(parser, 0, "show only the first N rows")
        parser.add_argument("--all", action="store_true", help="also show unchanged values")
        parser.add_argument(
            "--per-call",
            action="store_true",
            help="one row per snapshot key and metric, keys found in one run only included as (missing)",
        )
        parser.add_argument(
            "--no-missing", action="store_true", help="with --per-call: hide values found in only one run"
        )
        parser.add_argument(
            "--profiler",
            action="store_true",
            help="compare the profiler traces (*.pt.trace.json[.gz]) under RUN_A and RUN_B by operator "
            "and module (implied when both are trace files)",
        )

    def run(self, args: argparse.Namespace) -> int:
        from memprofiler.analysis.diff import diff_functions, diff_runs
        from memprofiler.analysis.estimate import diff_line
        from memprofiler.analysis.files.fs import named_as_given
        from memprofiler.analysis.traces.events import is_trace_file
        from memprofiler.reporters.terminal import make_console, render_diff, render_function_diff
        from memprofiler.units import parse_size

        if args.profiler or (is_trace_file(args.run_a) and is_trace_file(args.run_b)):
            return _profiler_diff(args)
        if line := diff_line(args.run_a, args.run_b):  # an estimate beside a measured run
            make_console().print(line, markup=False, highlight=False)
            return 0
        min_change = parse_size(args.min_change, key="--min-change")
        a, b = load(self.name, args.run_a, streamed=True), load(self.name, args.run_b, streamed=True)
        _refuse_empty((args.run_a, a), (args.run_b, b))
        found = (len(a.cuts), len(b.cuts))
        console = make_console()
        if args.per_call:
            with named_as_given():  # the stats files are read here
                rows = diff_runs(
                    a,
                    b,
                    metrics=args.metric,
                    keys=args.key,
                    min_change=min_change,
                    include_unchanged=args.all,
                    include_missing=not args.no_missing,
                )
            warn_cuts(self.name, a.cuts[found[0] :] + b.cuts[found[1] :])
            render_diff(rows[: args.top] if args.top > 0 else rows, console, total=len(rows))
            return 0
        with named_as_given():  # the stats files are read here, side by side, a block at a time
            frows, unmatched = diff_functions(
                a, b, metrics=args.metric, keys=args.key, min_change=min_change, include_unchanged=args.all
            )
        warn_cuts(self.name, a.cuts[found[0] :] + b.cuts[found[1] :])
        shown = frows[: args.top] if args.top > 0 else frows
        render_function_diff(shown, unmatched, console, total=len(frows))
        return 0


def _refuse_empty(*runs: tuple[str, RunArtifacts]) -> None:
    """A run that collected no call has nothing to compare: say so, and why, not "no differences".

    Raises:
        ArtifactError: one line naming each such run and its own note.
    """
    from memprofiler.errors import ArtifactError

    empty = [f"{given}: {run.nothing_collected()}" for given, run in runs if run.collected_nothing()]
    if empty:
        raise ArtifactError("; ".join(empty) + "; there is nothing to compare")


def _profiler_diff(args: argparse.Namespace) -> int:
    """Operators and modules of run A's traces against run B's: time and memory deltas."""
    from pathlib import Path

    from memprofiler.analysis.traces.diff import diff_views
    from memprofiler.analysis.traces.views import build_views, one_run_traces
    from memprofiler.errors import ArtifactError
    from memprofiler.reporters.terminal import make_console
    from memprofiler.reporters.traces.terminal import render_profiler_diff

    views = []
    for given in (args.run_a, args.run_b):
        # each side is one run: traces of another run under it would be summed in silently
        files = one_run_traces([Path(given)]) if Path(given).exists() else []
        v = build_views(files) if files else None
        if v is None:
            raise ArtifactError(
                f"{given}: no *.pt.trace.json[.gz] found; pass a trace or the profiler's output directory"
            )
        views.append(v)
    console = make_console()
    for what, modules in (("operator", False), ("module", True)):
        rows = diff_views(views[0], views[1], modules=modules)
        if rows:
            render_profiler_diff(rows[: args.top] if args.top > 0 else rows, what, console, total=len(rows))
    return 0
