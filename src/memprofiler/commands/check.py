"""``memprofiler check RUN_DIR --max rss_peak=2GiB ...``: a memory budget gate for CI; with
``--baseline RUN``, limits on growth over another run (``--max rss_peak=+5%``)."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from memprofiler.commands._shared import add_run_dir, load, refuse_cuts, refuse_empty, warn_crashed

if TYPE_CHECKING:
    from memprofiler.analysis.growth import Growth, GrowthViolation
    from memprofiler.analysis.impossible import ImpossibleValues
    from memprofiler.analysis.runs.artifacts import RunArtifacts


_HINT = "`memprofiler diff --per-call` lists them"


class CheckCommand:
    name = "check"
    help = (
        "Exit 1 (one line per violation) when a collected value exceeds its --max limit, or with "
        "--baseline when a function's median rose more than its +N%% / +SIZE limit; else 0."
    )

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None:
        add_run_dir(parser)
        parser.add_argument(
            "--max",
            dest="limits",
            action="append",
            required=True,
            metavar="METRIC=VALUE",
            help="limit for a metric (or shell pattern), with its unit: rss_peak=2GiB, "
            "saved_tensors.unique_bytes=300MiB, num_ooms=0; with --baseline, a rise over it: "
            "rss_peak=+5%%, saved_tensors.unique_bytes=+1MiB; repeatable",
        )
        parser.add_argument(
            "--baseline",
            metavar="RUN",
            default=None,
            help="a run to compare with (its newest run when it holds several): +N%% and +SIZE "
            "limits apply to each function's median over the calls both runs collected, "
            "with the runs' own noise added for host metrics",
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
        from memprofiler.analysis.growth import is_growth, parse_growth
        from memprofiler.analysis.impossible import ImpossibleValues
        from memprofiler.errors import ConfigError

        absolute: list[Limit] = []
        growth: list[Growth] = []
        for text in args.limits:
            if is_growth(text.partition("=")[2]):
                growth.append(parse_growth(text, "--max"))
            else:
                absolute.append(Limit.parse(text))
        if growth and args.baseline is None:
            raise ConfigError(
                f"--max {growth[0].text}",
                "a limit on the rise needs a run to rise over: add --baseline RUN "
                "(e.g. the main branch's run), or give an absolute limit such as rss_peak=2GiB",
            )
        run = load(self.name, args.run_dir, partial_ok=False, streamed=True)
        lines: list[str] = []
        checked = 0
        # NaN or a negative byte count is no figure to pass a gate on: named by file, it fails it
        impossible = ImpossibleValues()
        if absolute:
            with named_as_given():  # stats files are read here, a block at a time
                violations, checked = check_budget(run, absolute, keys=args.key, impossible=impossible)
                refuse_cuts(run)
            lines += [v.line() for v in violations]
        if growth:
            over, compared = _growth(args, run, growth, impossible)
            lines += [v.line() for v in over]
            checked += compared
        for line in [*impossible.lines("the check fails on it"), *lines]:
            print(line, file=sys.stdout)
        if impossible:
            print(
                f"memprofiler check: {impossible.count:,} value(s) no run writes, left out of the "
                "figures; the check fails",
                file=sys.stderr,
            )
        if lines:
            print(f"memprofiler check: {len(lines)} of {checked} values over budget", file=sys.stderr)
        if lines or impossible:
            return 1
        print(f"memprofiler check: all {checked} values within budget")
        return 0


def _growth(
    args: argparse.Namespace, run: RunArtifacts, limits: list[Growth], impossible: ImpossibleValues
) -> tuple[list[GrowthViolation], int]:
    """Compare each function's medians with the baseline's; print what was not compared."""
    from memprofiler.analysis.diff import diff_functions
    from memprofiler.analysis.files.fs import named_as_given
    from memprofiler.analysis.growth import check_growth
    from memprofiler.errors import ArtifactError

    base = load("check", args.baseline, partial_ok=False, streamed=True)
    refuse_empty((args.baseline, base), (args.run_dir, run))
    warn_crashed("check", (args.baseline, base), (args.run_dir, run))
    with named_as_given():
        rows, unmatched = diff_functions(
            base, run, keys=args.key, include_unchanged=True, impossible=impossible
        )
        refuse_cuts(base)
        refuse_cuts(run)
    if not rows:
        raise ArtifactError(
            f"{args.run_dir} and the baseline {args.baseline} hold no call of the same function "
            f"to compare{'; ' + line if (line := unmatched.line(_HINT, ('the baseline', 'the run'))) else ''}"
        )
    if note := unmatched.line(_HINT, ("the baseline", "the run")):
        print(f"memprofiler check: {note}", file=sys.stderr)
    return check_growth(rows, limits, "--max", f"{args.baseline} and {args.run_dir}")
