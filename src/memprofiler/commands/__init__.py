"""One module per ``memprofiler`` subcommand. Each only parses, validates and delegates.

A command is a class with ``name``, ``help``, ``prepare_parser(parser)`` and
``run(args) -> int``. Register it in :func:`all_commands` (``memprofiler.__main__`` builds the
parser from it).
"""

from __future__ import annotations

import argparse
from typing import Protocol


class Command(Protocol):
    name: str
    help: str

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace) -> int: ...


def all_commands() -> list[Command]:
    """Every registered subcommand, in the order ``--help`` lists them."""
    # Each command module imports its heavy dependencies inside ``run``, so ``--help`` is quick.
    from memprofiler.commands.advise import AdviseCommand
    from memprofiler.commands.check import CheckCommand
    from memprofiler.commands.diff import DiffCommand
    from memprofiler.commands.estimate import EstimateCommand
    from memprofiler.commands.merge_traces import MergeTracesCommand
    from memprofiler.commands.report import ReportCommand
    from memprofiler.commands.snapshot import SnapshotCommand

    commands: list[Command] = [
        ReportCommand(),
        DiffCommand(),
        CheckCommand(),
        SnapshotCommand(),
        MergeTracesCommand(),
        AdviseCommand(),
        EstimateCommand(),
    ]
    return commands
