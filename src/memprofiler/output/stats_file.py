"""``rank_{rank}_memory_stats.yaml``, grown in blocks: a flush appends only what is new.

The file is one top-level YAML mapping, so ``yaml.safe_load`` reads it whole at any moment.
Each flush appends the YAML of the snapshots recorded since the last one, then a block-end
line (``layout.YAML_BLOCK_END``) that counts the entries so far, so a reader can tell a cut
file from a whole one. The cost of a flush depends on what it adds, not on the run's length:
rewriting the whole file at every window close made a long run's writes quadratic.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from memprofiler import layout
from memprofiler.output.writers import append_bytes, atomic_write_bytes, block_end, to_plain

try:  # libyaml's emitter: about 10x faster than the pure-Python one, same output for plain data
    from yaml import CSafeDumper as _Dumper
except ImportError:  # pragma: no cover - PyYAML built without libyaml
    from yaml import SafeDumper as _Dumper  # type: ignore[assignment]


def entry_yaml(key: str, metrics: Any) -> str:
    """One top-level entry, exactly as ``yaml.safe_dump`` writes it inside the whole mapping."""
    return yaml.dump({key: to_plain(metrics)}, Dumper=_Dumper, sort_keys=False, default_flow_style=False)


class StatsFile:
    """Appends snapshots to one stats YAML; rewrites it whole only when a written entry changed.

    Args:
        path: the file.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._written: set[str] = set()
        self._order: list[str] = []
        self._started = False

    @property
    def written(self) -> frozenset[str]:
        return frozenset(self._written)

    def flush(
        self,
        snapshots: Mapping[str, Any],
        keys: Sequence[str],
        changed: Sequence[str] = (),
        fsync: bool = False,
    ) -> Path:
        """Write the entries ``keys`` (new ones) of ``snapshots``; ``changed``: written ones updated since.

        Changed entries force one whole rewrite from ``snapshots``, which then must hold every
        written key: the profiler only changes an entry (late step-end metrics) before it is
        flushed, so this is the rare path of a user calling ``dump()`` with a step open.
        """
        new = [k for k in keys if k not in self._written and k in snapshots]
        if not self._started or self._order == [] or any(k in self._written for k in changed):
            order = [k for k in self._order if k in snapshots] + new
            body = "".join(entry_yaml(k, snapshots[k]) for k in order) or "{}\n"
            atomic_write_bytes(self.path, f"{layout.YAML_HEADER}\n{body}{block_end(len(order))}".encode())
            self._started = True
            self._order = order
            self._written = set(order)
            return self.path
        if not new:
            return self.path
        self._order.extend(new)
        self._written.update(new)
        text = "".join(entry_yaml(k, snapshots[k]) for k in new) + block_end(len(self._order))
        return append_bytes(self.path, text.encode(), fsync=fsync)
