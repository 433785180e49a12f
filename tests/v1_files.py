"""Files in the integrity format (``#memprofiler-yaml v1`` ... ``#memprofiler-end entries=<n>``), built for tests.

The writers emit this format; these helpers build the same text without a training run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from memprofiler import layout


def v1_text(entries: Mapping[str, Any], blocks: Sequence[int] = ()) -> str:
    """``entries`` as YAML with the header and a block-end after each block of ``blocks`` sizes.

    Without ``blocks`` every entry is one block; the last block-end is the file's last line.
    """
    items = list(entries.items())
    sizes = list(blocks) or [1] * len(items)
    assert sum(sizes) == len(items)
    out, done = [layout.YAML_HEADER + "\n"], 0
    for size in sizes:
        out.append(yaml.safe_dump(dict(items[done : done + size]), sort_keys=False))
        done += size
        out.append(layout.YAML_BLOCK_END.format(n=done) + "\n")
    return "".join(out)


def stats(calls: Sequence[int], fn: str = "training_step", rank: int = 0, rss: int = 1000) -> dict[str, Any]:
    """Start and end snapshots of ``calls``; the end's ``rss_peak`` is ``rss + call``."""
    out: dict[str, Any] = {}
    for c in calls:
        out[layout.snapshot_key(rank, fn, c, "start")] = {"rss": rss}
        out[layout.snapshot_key(rank, fn, c, "end")] = {"rss": rss + c, "rss_peak": rss + c}
    return out


def write_run(root: Path, entries: Mapping[str, Any], manifest: Mapping[str, Any] | None = None) -> Path:
    """A run directory with ``rank_0_memory_stats.yaml`` (v1) and, if given, the run manifest."""
    root.mkdir(parents=True, exist_ok=True)
    (root / layout.MEMORY_STATS_YAML.format(rank=0)).write_text(v1_text(entries))
    if manifest is not None:
        (root / layout.RUN_MANIFEST).write_text(v1_text(manifest, [len(manifest)]))
    return root
