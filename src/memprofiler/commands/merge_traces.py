"""``memprofiler merge-traces DIR [DIR ...] -o merged.json``: one Chrome trace for all ranks.

A DIR may be a URL (``s3://...``); several (one per node) are merged by rank."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

#: Output name when ``-o`` is not given, written into DIR.
DEFAULT_OUTPUT = "memory_trace_merged.json"


class MergeTracesCommand:
    """Merge ``memory_trace_rank_*.json`` under DIR into one trace for Perfetto / chrome://tracing."""

    name = "merge-traces"
    help = "Merge every rank's memory_trace_rank_*.json under DIR into one Chrome trace (pid = rank)."

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "dir",
            metavar="DIR",
            nargs="+",
            help="run directory (searched recursively), local or a URL (s3://...); several (one per "
            "node) are merged by rank",
        )
        parser.add_argument(
            "-o",
            "--output",
            type=Path,
            default=None,
            help=f"output file (default: DIR/{DEFAULT_OUTPUT}; ./{DEFAULT_OUTPUT} for a URL)",
        )
        parser.add_argument(
            "--with-profiler",
            action="store_true",
            help="also fold in each rank's ExtendedPyTorchProfiler traces (*.pt.trace.json, .gz too): "
            "operators and kernels under the same pid (step timelines are always folded in)",
        )

    def run(self, args: argparse.Namespace) -> int:
        # (here, not at the top: every command module is imported to build the parser)
        from memprofiler.analysis.files.fs import as_given, is_url, localize, named_as_given
        from memprofiler.analysis.runs.evidence import check_merge, gather
        from memprofiler.analysis.runs.multi_dir import merge_rank_maps
        from memprofiler.analysis.traces.merge import (
            find_profiler_traces,
            find_rank_traces,
            find_step_timelines,
            merge_rank_traces,
        )
        from memprofiler.errors import ArtifactError
        from memprofiler.output.writers import write_json

        with named_as_given():
            local = [(d, localize(d)) for d in args.dir]
            traces = merge_rank_maps([(d, find_rank_traces(path)) for d, path in local])
            profiler = (
                merge_rank_maps([(d, find_profiler_traces(path)) for d, path in local])
                if args.with_profiler
                else None
            )
            steps = merge_rank_maps([(d, find_step_timelines(path)) for d, path in local])
            merged = merge_rank_traces(traces, profiler, steps)
            # files of several directories without a run id: what else they carry decides
            nodes = sorted({p.parent for p in traces.values()})
            doubts = check_merge([gather(n) for n in nodes]) if len(nodes) > 1 else []
        for line in doubts:
            print(f"memprofiler {self.name}: warning: {as_given(line)}", file=sys.stderr)
        first = args.dir[0]
        default_dir = Path(".") if any(is_url(d) for d in args.dir) else Path(first)
        output = args.output if args.output is not None else default_dir / DEFAULT_OUTPUT
        try:
            write_json(output, merged)
        except OSError as err:
            raise ArtifactError(f"{output}: cannot write the merged trace ({err.strerror or err})") from None
        n = sum(1 for e in merged["traceEvents"] if e.get("ph") != "M")
        extra = f", {sum(len(v) for v in profiler.values())} profiler trace(s)" if profiler else ""
        extra += f", {len(steps)} step timeline(s)" if steps else ""
        print(f"merged {len(traces)} rank(s){extra} ({n} events) into {output}")
        return 0
