"""``memprofiler check RUN_DIR --max rss_peak=2GiB ...``: a memory budget gate for CI."""

from __future__ import annotations

import argparse
import sys

from memprofiler.commands._shared import add_run_dir, load, refuse_cuts


class CheckCommand:
    name = "check"
    help = "Exit 1 (one line per violation) when a collected value exceeds its --max limit, else 0."

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None:
        add_run_dir(parser)
        parser.add_argument(
            "--max",
            dest="limits",
            action="append",
            required=True,
            metavar="METRIC=VALUE",
            help="limit for a metric (or shell pattern), human units: rss_peak=2GiB, "
            "saved_tensors.unique_bytes=300MiB, allocated_bytes.all.peak=1.5GB; repeatable",
        )
        parser.add_argument(
            "--key",
            action="append",
            default=[],
            metavar="PATTERN",
            help="only check snapshot keys matching, e.g. '*.end'",
        )

    def run(self, args: argparse.Namespace) -> int:
        from memprofiler.analysis.budget import Limit, check_budget
        from memprofiler.analysis.files.fs import named_as_given

        limits = [Limit.parse(t) for t in args.limits]
        run = load(self.name, args.run_dir, partial_ok=False, streamed=True)
        with named_as_given():  # stats files are read here, a block at a time
            violations, checked = check_budget(run, limits, keys=args.key)
            refuse_cuts(run)
        for v in violations:
            print(v.line(), file=sys.stdout)
        if violations:
            print(f"memprofiler check: {len(violations)} of {checked} values over budget", file=sys.stderr)
            return 1
        print(f"memprofiler check: all {checked} values within budget")
        return 0
