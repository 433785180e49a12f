"""The ``memprofiler`` console script.

User mistakes (bad paths, unreadable or unsafe files) end with one line on stderr and exit
code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from memprofiler import __version__
from memprofiler.commands import all_commands
from memprofiler.errors import MemProfilerError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="memprofiler", description="Read and check memprofiler runs.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for cmd in all_commands():
        p = sub.add_parser(cmd.name, help=cmd.help, description=cmd.help)
        cmd.prepare_parser(p)
        p.set_defaults(_command=cmd)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    cmd = getattr(args, "_command", None)
    if cmd is None:
        parser.print_help()
        return 2
    try:
        return int(cmd.run(args))
    except MemProfilerError as err:
        print(f"memprofiler {cmd.name}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
