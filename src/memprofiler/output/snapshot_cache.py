"""Plain and YAML forms of the snapshots, kept per key so a rewrite costs only what changed.

The stats files are rewritten whenever a collection window closes, so that a process killed
later keeps them. Serialising every snapshot again each time made that quadratic in the
number of windows: with ``repeat: 0`` on a long run a window close cost 0.4 s after 1,500
windows, in PyYAML alone. :class:`SnapshotCache` converts and serialises each snapshot
once, again only when the profiler marks it changed (the late ``step_end`` metrics), and
joins the cached blocks. A top-level block mapping is the concatenation of its entries'
blocks, so the text equals ``yaml.safe_dump`` of the whole mapping.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml

from memprofiler.output.writers import to_plain


class SnapshotCache:
    """Cached ``to_plain`` and YAML text of each snapshot key.

    New keys, and keys whose snapshot was replaced by another object, are found on their own;
    call :meth:`touch` after changing a snapshot in place.
    """

    def __init__(self) -> None:
        self._source: dict[str, Any] = {}  # the snapshot object each cached form came from
        self._plain: dict[str, Any] = {}
        self._yaml: dict[str, str] = {}
        self._stale: set[str] = set()

    def touch(self, key: str) -> None:
        """Mark ``key``'s snapshot as changed since it was last converted."""
        self._stale.add(key)

    def plain(self, snapshots: Mapping[str, Any]) -> dict[str, Any]:
        """``to_plain(snapshots)``, in the snapshots' order, from the cache."""
        keys = self._sync(snapshots)
        return {key: self._plain[key] for key in keys}

    def yaml_text(self, snapshots: Mapping[str, Any]) -> str:
        """``yaml.safe_dump(to_plain(snapshots), sort_keys=False)``, from the cache."""
        keys = self._sync(snapshots)
        parts = []
        for key in keys:
            text = self._yaml.get(key)
            if text is None:
                text = yaml.safe_dump({key: self._plain[key]}, sort_keys=False, default_flow_style=False)
                self._yaml[key] = text
            parts.append(text)
        return "".join(parts) if parts else yaml.safe_dump({})

    def _sync(self, snapshots: Mapping[str, Any]) -> list[str]:
        """Bring the cache up to date; return the keys, in order, that it now covers.

        Works on copies of the key set and of the snapshots' items: a SIGTERM handler's dump
        can run in the middle of a window-close dump and add a snapshot.
        """
        stale, self._stale = self._stale, set()
        for key in stale:
            self._source.pop(key, None)
        items = list(snapshots.items())
        for key, value in items:
            if self._source.get(key) is not value:
                self._source[key] = value
                self._plain[key] = to_plain(value)
                self._yaml.pop(key, None)
        if len(self._source) > len(items):  # keys that left the snapshots
            present = {key for key, _ in items}
            for key in [k for k in self._source if k not in present]:
                del self._source[key], self._plain[key]
                self._yaml.pop(key, None)
        return [key for key, _ in items]
