"""``memprofiler diff RUN_A RUN_B``: per key and metric, A, B, the change and the percentage."""

from __future__ import annotations

import argparse


class DiffCommand:
    name = "diff"
    help = "Compare two runs per snapshot key and metric, largest absolute change first."

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("run_a", metavar="RUN_A", help="baseline run directory (a path or a URL)")
        parser.add_argument("run_b", metavar="RUN_B", help="run directory compared with it (a path or a URL)")
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
        parser.add_argument("--top", type=int, default=0, help="show only the first N rows (default: all)")
        parser.add_argument("--all", action="store_true", help="also show unchanged values")
        parser.add_argument("--no-missing", action="store_true", help="hide values found in only one run")

    def run(self, args: argparse.Namespace) -> int:
        from memprofiler.analysis.artifacts import load_run
        from memprofiler.analysis.diff import diff_runs
        from memprofiler.analysis.fs import localize, named_as_given
        from memprofiler.reporters.terminal import make_console, render_diff
        from memprofiler.units import parse_size

        min_change = parse_size(args.min_change, key="--min-change")
        with named_as_given():
            run_a, run_b = load_run(localize(args.run_a)), load_run(localize(args.run_b))
        rows = diff_runs(
            run_a,
            run_b,
            metrics=args.metric,
            keys=args.key,
            min_change=min_change,
            include_unchanged=args.all,
            include_missing=not args.no_missing,
        )
        render_diff(rows[: args.top] if args.top > 0 else rows, make_console(), total=len(rows))
        return 0
