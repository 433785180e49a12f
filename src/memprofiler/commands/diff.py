"""``memprofiler diff RUN_A RUN_B``: per function and metric (``--per-call``: per key), A, B, the change."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from memprofiler.commands._shared import add_run_dir, add_top, load, refuse_empty, warn_crashed, warn_cuts

if TYPE_CHECKING:
    from memprofiler.analysis.diff import FunctionDiffRow
    from memprofiler.analysis.growth import Growth
    from memprofiler.analysis.impossible import ImpossibleValues


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
            "--fail-on",
            action="append",
            default=[],
            metavar="METRIC=+LIMIT",
            help="exit 1, with one line per function and metric, when B's median rose over A's by "
            "more than the limit (plus the noise for host metrics): rss_peak=+5%%, "
            "saved_tensors.unique_bytes=+1MiB; repeatable",
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
        from memprofiler.analysis.impossible import ImpossibleValues
        from memprofiler.analysis.traces.events import is_trace_file
        from memprofiler.reporters.terminal import make_console, render_diff, render_function_diff
        from memprofiler.units import parse_size

        gates = _gates(args)
        if args.profiler or (is_trace_file(args.run_a) and is_trace_file(args.run_b)):
            _no_gate(gates, "--profiler")
            return _profiler_diff(args)
        if line := diff_line(args.run_a, args.run_b):  # an estimate beside a measured run
            _no_gate(gates, "an estimate")
            make_console().print(line, markup=False, highlight=False)
            return 0
        if args.per_call:
            _no_gate(gates, "--per-call")
        min_change = parse_size(args.min_change, key="--min-change")
        a, b = load(self.name, args.run_a, streamed=True), load(self.name, args.run_b, streamed=True)
        refuse_empty((args.run_a, a), (args.run_b, b))
        warn_crashed(self.name, (args.run_a, a), (args.run_b, b))
        found = (len(a.cuts), len(b.cuts))
        console = make_console()
        impossible = ImpossibleValues()  # NaN, a negative byte count: named, left out
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
                    impossible=impossible,
                )
            warn_cuts(self.name, a.cuts[found[0] :] + b.cuts[found[1] :])
            _warn_impossible(impossible, "left out of the comparison (shown as missing)")
            render_diff(rows[: args.top] if args.top > 0 else rows, console, total=len(rows))
            return 0
        with named_as_given():  # the stats files are read here, side by side, a block at a time
            every, unmatched = diff_functions(
                a, b, metrics=args.metric, keys=args.key, include_unchanged=True, impossible=impossible
            )
        frows = [r for r in every if (r.change != 0 or args.all) and abs(r.change) >= min_change]
        warn_cuts(self.name, a.cuts[found[0] :] + b.cuts[found[1] :])
        _warn_impossible(impossible, "left out of the medians")
        shown = frows[: args.top] if args.top > 0 else frows
        render_function_diff(shown, unmatched, console, total=len(frows))
        if not gates:
            return 0
        return _gate(every, gates, f"{args.run_a} and {args.run_b}", bool(impossible))


def _warn_impossible(impossible: ImpossibleValues, outcome: str) -> None:
    """One warning line on stderr per file and metric holding values no run writes."""
    for line in impossible.lines(outcome):
        print(f"memprofiler diff: warning: {line}", file=sys.stderr)


def _gates(args: argparse.Namespace) -> list[Growth]:
    """``--fail-on`` limits, parsed before any file is read.

    Raises:
        ConfigError: a limit that is not a rise (``rss_peak=2GiB``: an absolute budget is
            ``memprofiler check --max``), or a bad one.
    """
    from memprofiler.analysis.growth import GROWTH_FORMS, parse_growth
    from memprofiler.errors import ConfigError

    out = []
    for text in args.fail_on:
        metric, _, value = text.partition("=")
        if value.strip() and not value.strip().startswith("+"):
            raise ConfigError(
                f"--fail-on {metric.strip()}",
                f"got {value.strip()!r}; `diff` gates on the rise from A to B: write {GROWTH_FORMS} "
                f"(an absolute budget is `memprofiler check RUN --max {metric.strip()}=2GiB`)",
            )
        out.append(parse_growth(text, "--fail-on"))
    return out


def _no_gate(gates: list[Growth], what: str) -> None:
    """Refuse ``--fail-on`` where there are no per-function medians to gate on."""
    from memprofiler.errors import ConfigError

    if gates:
        raise ConfigError(
            "--fail-on", f"cannot gate {what}: it compares per function and metric of two runs' snapshots"
        )


def _gate(rows: list[FunctionDiffRow], gates: list[Growth], where: str, impossible: bool = False) -> int:
    """Exit 1 with one line per row over its ``--fail-on`` limit (stdout), or when the stats
    files hold values no run writes (``impossible``: a gate fails closed), else 0."""
    from memprofiler.analysis.growth import check_growth

    over, compared = check_growth(rows, gates, "--fail-on", where)
    for v in over:
        print(v.line())
    if over:
        print(
            f"memprofiler diff: {len(over)} of {compared} compared values rose over --fail-on",
            file=sys.stderr,
        )
    if impossible:
        print(
            "memprofiler diff: --fail-on fails: the stats files hold values no run writes (see the warnings)",
            file=sys.stderr,
        )
    if over or impossible:
        return 1
    print(f"memprofiler diff: all {compared} compared values within --fail-on")
    return 0


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
