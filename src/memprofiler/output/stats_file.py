"""``rank_{rank}_memory_stats.yaml``, grown in blocks: a flush appends only what is new.

The file is one top-level YAML mapping, so ``yaml.safe_load`` reads it whole at any moment.
Each flush appends the YAML of the snapshots recorded since the last one, then a block-end
line (``layout.YAML_BLOCK_END``) that counts the entries so far, so a reader can tell a cut
file from a whole one. The cost of a flush depends on what it adds, not on the run's length:
rewriting the whole file at every window close made a long run's writes quadratic.
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from memprofiler import layout
from memprofiler.output.writers import append_bytes, atomic_write_bytes, block_end, to_plain

_SCALAR_KEY = re.compile(r"[A-Za-z0-9_(][A-Za-z0-9_.()<>/+-]*")
_RESOLVER = yaml.resolver.Resolver()
_STR_TAG = "tag:yaml.org,2002:str"


@functools.lru_cache(maxsize=65536)
def _plain(text: str) -> bool:
    """Whether ``text`` can be written unquoted and reads back as this string (PyYAML's resolver
    decides: ``yes``, ``null``, ``1e3`` are not strings)."""
    return (
        len(text) < 1000
        and _SCALAR_KEY.fullmatch(text) is not None
        and _RESOLVER.resolve(yaml.ScalarNode, text, (True, False)) == _STR_TAG
    )


def _scalar(value: Any) -> str | None:
    """``value`` as ``yaml.safe_dump`` writes a scalar, or ``None`` for anything else."""
    kind = type(value)
    if kind is int:
        return str(value)
    if kind is float:  # PyYAML's float form: a dot always, so it reads back as a float
        if value != value:
            return ".nan"
        if value in (math.inf, -math.inf):
            return ".inf" if value > 0 else "-.inf"
        text = repr(value).lower()
        return text.replace("e", ".0e", 1) if "." not in text and "e" in text else text
    if kind is bool:
        return "true" if value else "false"
    if value is None:
        return "null"
    if kind is str:
        return value if _plain(value) else json.dumps(value)  # JSON strings are YAML double-quoted
    return None


def _block(mapping: dict[str, Any], indent: str, out: list[str]) -> bool:
    for key, value in mapping.items():
        if type(key) is not str:
            return False
        name = key if _plain(key) else json.dumps(key)
        if type(value) is dict:
            if not value:
                out.append(f"{indent}{name}: {{}}\n")
                continue
            out.append(f"{indent}{name}:\n")
            if not _block(value, indent + "  ", out):
                return False
            continue
        text = _scalar(value)
        if text is None:
            return False
        out.append(f"{indent}{name}: {text}\n")
    return True


def entry_yaml(key: str, metrics: Any) -> str:
    """One top-level entry, as ``yaml.safe_dump`` writes it inside the whole mapping.

    Snapshots are flat or nested mappings of numbers, so they are written directly, about 20x
    faster than PyYAML's Python representer (a flush of 50 calls with per-module breakdowns
    cost 150 ms on the training thread that way); anything else goes through PyYAML.
    """
    plain = to_plain({key: metrics})
    out: list[str] = []
    if _block(plain, "", out):
        return "".join(out)
    return yaml.dump(plain, Dumper=_Dumper, sort_keys=False, default_flow_style=False)


try:  # libyaml's emitter for what the direct writer leaves to PyYAML
    from yaml import CSafeDumper as _Dumper
except ImportError:  # pragma: no cover - PyYAML built without libyaml
    from yaml import SafeDumper as _Dumper  # type: ignore[assignment]


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
