"""``memprofiler merge-traces DIR -o merged.json``: one Chrome trace for all ranks."""

from __future__ import annotations

import argparse
from pathlib import Path

from memprofiler.analysis.trace_merge import find_profiler_traces, find_rank_traces, merge_rank_traces
from memprofiler.errors import ArtifactError
from memprofiler.output.writers import write_json

#: Output name when ``-o`` is not given, written into DIR.
DEFAULT_OUTPUT = "memory_trace_merged.json"


class MergeTracesCommand:
    """Merge ``memory_trace_rank_*.json`` under DIR into one trace for Perfetto / chrome://tracing."""

    name = "merge-traces"
    help = "Merge every rank's memory_trace_rank_*.json under DIR into one Chrome trace (pid = rank)."

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("dir", type=Path, metavar="DIR", help="run directory (searched recursively)")
        parser.add_argument(
            "-o", "--output", type=Path, default=None, help=f"output file (default: DIR/{DEFAULT_OUTPUT})"
        )
        parser.add_argument(
            "--with-profiler",
            action="store_true",
            help="also fold in each rank's ExtendedPyTorchProfiler traces (*_rank_N.C.pt.trace.json): "
            "operators and kernels under the same pid",
        )

    def run(self, args: argparse.Namespace) -> int:
        traces = find_rank_traces(args.dir)
        profiler = find_profiler_traces(args.dir) if args.with_profiler else None
        merged = merge_rank_traces(traces, profiler)
        output = args.output if args.output is not None else args.dir / DEFAULT_OUTPUT
        try:
            write_json(output, merged)
        except OSError as err:
            raise ArtifactError(f"{output}: cannot write the merged trace ({err.strerror or err})") from None
        n = sum(1 for e in merged["traceEvents"] if e.get("ph") != "M")
        extra = f", {sum(len(v) for v in profiler.values())} profiler trace(s)" if profiler else ""
        print(f"merged {len(traces)} rank(s){extra} ({n} events) into {output}")
        return 0
