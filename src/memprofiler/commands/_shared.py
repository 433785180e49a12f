"""What several subcommands share: the run directory argument, output options, loading a run."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from memprofiler.analysis.files.yaml_read import Cut
    from memprofiler.analysis.runs.artifacts import RunArtifacts

RUN_DIR_HELP = (
    "the run's save_dir, or a directory above it (the newest run there is read when it holds "
    "several); a local path or a URL (s3://...)"
)


def add_run_dir(
    parser: argparse.ArgumentParser,
    dest: str = "run_dir",
    metavar: str = "RUN_DIR",
    help: str = "",
    nargs: str | None = None,
) -> None:
    """The positional run directory argument (``nargs="+"``: several, one per node)."""
    parser.add_argument(dest, metavar=metavar, help=help or RUN_DIR_HELP, nargs=nargs)


def add_top(parser: argparse.ArgumentParser, default: int, what: str) -> None:
    """``--top N``: how many rows the ranked tables show."""
    parser.add_argument("--top", type=int, default=default, help=f"{what} (default: {default or 'all'})")


def add_html_output(parser: argparse.ArgumentParser, default: str) -> None:
    """``-o/--output HTML`` and ``--no-html``."""
    parser.add_argument(
        "-o", "--output", metavar="HTML", default=None, help=f"HTML report path (default: {default})"
    )
    parser.add_argument("--no-html", action="store_true", help="only print the terminal summary")


def load(command: str, run_dir: str, partial_ok: bool = True, streamed: bool = False) -> RunArtifacts:
    """Load the run under ``run_dir``; say on stderr which run was picked and what was cut.

    Args:
        command: the subcommand's name, which starts each line.
        run_dir: the directory given on the command line.
        partial_ok: whether a file cut after its last block-end may be read in part (a
            warning line), or is refused (``check``: a budget cannot be judged on partial data).
        streamed: leave the stats files to be read a block at a time
            (:meth:`RunArtifacts.iter_snapshots`); call :func:`refuse_cuts` after reading them.

    Raises:
        ArtifactError: as :func:`memprofiler.analysis.runs.artifacts.load_run`, or a cut file when
            ``partial_ok`` is false.
    """
    from memprofiler.analysis.files.fs import as_given, localize, named_as_given
    from memprofiler.analysis.runs.artifacts import load_run

    with named_as_given():  # a URL is read from a local copy; messages name the URL
        run = load_run(localize(run_dir), streamed=streamed)
        if run.selection:
            print(f"memprofiler {command}: {as_given(run.selection)}", file=sys.stderr)
        if not partial_ok:
            refuse_cuts(run)
        warn_cuts(command, run.cuts)
    return run


def refuse_cuts(run: RunArtifacts) -> None:
    """Raise for the first file of ``run`` found cut (a budget cannot be judged on partial data).

    Raises:
        ArtifactError: one line naming the file and what was dropped.
    """
    from memprofiler.errors import ArtifactError

    for cut in run.cuts:
        raise ArtifactError(f"{cut.line()}; a budget cannot be judged on partial data")


def load_many(command: str, run_dirs: Sequence[str], streamed: bool = False) -> RunArtifacts:
    """:func:`load` each directory (one per node) and merge their ranks; a warning line on
    stderr for each doubt about files without a run id.

    Raises:
        ArtifactError: as :func:`load`, a rank found in two directories (one line naming both),
            or files that prove two runs (:func:`memprofiler.analysis.runs.multi_dir.merge_runs`).
    """
    from memprofiler.analysis.files.fs import as_given, named_as_given
    from memprofiler.analysis.runs.multi_dir import merge_runs

    runs = [(d, load(command, d, streamed=streamed)) for d in run_dirs]
    if len(runs) == 1:
        return runs[0][1]
    with named_as_given():
        run = merge_runs(runs)
    for line in run.merge_warnings:
        print(f"memprofiler {command}: warning: {as_given(line)}", file=sys.stderr)
    return run


def warn_cuts(command: str, cuts: Sequence[Cut]) -> None:
    """One warning line on stderr per file found cut (read in part), naming URLs as given."""
    from memprofiler.analysis.files.fs import as_given

    for cut in cuts:
        print(f"memprofiler {command}: warning: {as_given(cut.line())}", file=sys.stderr)


def refuse_empty(*runs: tuple[str, RunArtifacts]) -> None:
    """A run that collected no call has nothing to compare: say so, and why, not "no differences".

    Raises:
        ArtifactError: one line naming each such run and its own note (a crash first).
    """
    from memprofiler.errors import ArtifactError

    empty = [f"{given}: {run.nothing_collected()}" for given, run in runs if run.collected_nothing()]
    if empty:
        raise ArtifactError("; ".join(empty) + "; there is nothing to compare")


def warn_crashed(command: str, *runs: tuple[str, RunArtifacts]) -> None:
    """One warning line on stderr per run that crashed: it holds only the calls before the crash."""
    from memprofiler.analysis.files.fs import as_given

    for given, run in runs:
        if run.crash is not None:
            print(
                f"memprofiler {command}: warning: {as_given(given)} crashed ({run.crash}); "
                "it holds the calls collected before the crash",
                file=sys.stderr,
            )
