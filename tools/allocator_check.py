"""Check the estimate's allocator model against real CUDA allocator snapshots.

    PYTHONPATH=src python tools/allocator_check.py SNAPSHOT.pickle [...]

For each ``torch.cuda.memory._snapshot()`` pickle (history recorded): the trace rewound to its
first entry and replayed through the model from there (how often each decision matched the
real allocator's, the first departures), the real peaks and the fragmentation slack at the real
allocated peak, and the same requests replayed from an empty cache as an estimate would start
(``estimate/allocator_trace.py``). Prints one JSON object per file; exit status 1 when a file
does not rewind (its trace and segments disagree) or the model departed anywhere.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict

from memprofiler.analysis.snapshot.summary import load_snapshot
from memprofiler.errors import ArtifactError
from memprofiler.estimate.allocator.trace import RewindError, check_trace, clean_replay, rewind


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("snapshots", nargs="+", help="allocator snapshot pickles")
    parser.add_argument("--device", type=int, default=0)
    args = parser.parse_args(argv)
    status = 0
    for path in args.snapshots:
        try:
            snap = load_snapshot(path)
            check = check_trace(snap, args.device)
            guessed = rewind(snap, args.device).guessed
            clean = clean_replay(snap, args.device)
        except (ArtifactError, RewindError) as exc:
            print(f"{path}: {exc}", file=sys.stderr)
            status = 1
            continue
        exact = check.end_state_equal and not check.divergences and set(check.rates().values()) == {1.0}
        status |= not exact
        figures = asdict(check)
        divergences = figures.pop("divergences")
        print(
            json.dumps(
                {
                    "snapshot": path,
                    "exact": exact,
                    "rates": check.rates(),
                    "figures": figures,
                    "guessed_block_sizes": guessed,
                    "first_divergences": divergences[:5],
                    "clean_start": {k: v for k, v in asdict(clean).items() if k != "windows"},
                },
                indent=1,
            )
        )
    return status


if __name__ == "__main__":
    sys.exit(main())
