"""The ``memprofiler`` console script.

User mistakes (bad paths, unreadable or unsafe files) end with one line on stderr and exit
code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import os
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


#: Subcommands of a ``MemProfilerCLI`` script that newcomers type after ``memprofiler``: the one
#: line that points to where they are, in place of argparse's ``invalid choice``.
ELSEWHERE = ("estimate", "fit", "validate", "test", "predict")


def elsewhere_line(name: str) -> str:
    """Where ``memprofiler NAME`` lives instead: a subcommand of the LightningCLI that trains."""
    return (
        f"memprofiler: `{name}` is a subcommand of the script that trains, not of `memprofiler`: run "
        f"`python -m memprofiler.lightning {name} --config config.yaml` (the model as `model.class_path`), "
        f"or `python train.py {name} ...` where train.py calls `MemProfilerCLI`"
    )


#: numpy's BLAS threads for the console script: none of the commands multiplies matrices, and on
#: import OpenBLAS starts a thread per core that spins before it sleeps (0.06 s of CPU of `import
#: numpy` on two cores, more on more). Set unless the user set it, before any command imports numpy.
BLAS_THREADS = {"OPENBLAS_NUM_THREADS": "1"}


def console(argv: Sequence[str] | None = None) -> int:
    """The console script: :func:`main`, in a process whose BLAS threads are ours to choose."""
    for key, value in BLAS_THREADS.items():
        os.environ.setdefault(key, value)  # read by OpenBLAS once, when numpy loads it
    return main(argv)


def main(argv: Sequence[str] | None = None) -> int:
    given = sys.argv[1:] if argv is None else list(argv)
    # `memprofiler estimate MODEL` is ours; `estimate --config fit.yaml` is the training script's.
    config = any(a == "--config" or a.startswith("--config=") for a in given[1:])
    if given and given[0] in ELSEWHERE and (given[0] != "estimate" or config):
        print(elsewhere_line(given[0]), file=sys.stderr)
        return 2
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
    sys.exit(console())
