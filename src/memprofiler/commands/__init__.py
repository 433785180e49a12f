"""One module per ``memprofiler`` subcommand. Each only parses, validates and delegates.

A command is a class with ``name``, ``help``, ``prepare_parser(parser)`` and
``run(args) -> int``. Register it in :data:`COMMANDS` (``memprofiler.__main__`` builds the
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
    from memprofiler.commands.merge_traces import MergeTracesCommand

    commands: list[Command] = []
    commands.append(MergeTracesCommand())
    return commands
