"""``rank_{rank}_memory_stats.yaml``, grown in blocks: a flush appends only what is new.

The file is one top-level YAML mapping, so ``yaml.safe_load`` reads it whole at any moment.
Each entry is one line, ``<key>: {...}``: a YAML flow mapping written in JSON's syntax, so
that ``memprofiler`` reads it back with the C JSON decoder (a 100,000-call file in about a
second, where reading block YAML line by line in Python took 6.5 s). Entries JSON cannot
write as YAML reads them back (``nan``, a lone surrogate) fall back to block style.
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
#: An escaped surrogate (JSON's form of a character beyond U+FFFF; YAML decodes each half alone).
_SURROGATE = re.compile(r"\\u[dD][89abAB]")


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
        if _plain(value):
            return value
        text = json.dumps(value)  # JSON strings are YAML double-quoted...
        return None if _SURROGATE.search(text) else text  # ...but for characters beyond U+FFFF
    return None


def _block(mapping: dict[str, Any], indent: str, out: list[str]) -> bool:
    for key, value in mapping.items():
        if type(key) is not str:
            return False
        name = key if _plain(key) else json.dumps(key)
        if _SURROGATE.search(name):
            return False
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


#: JSON strings (skipped) or the integer part of a number with an exponent and no fraction
#: (``1e-05``: a string to YAML 1.1), which gets a ``.0``.
_NUMBER_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|(?<![\w.])(-?\d+)(?=[eE])')
_NO_DOT = 2  # _json_shape: a float JSON writes without a dot


def _dot(m: re.Match[str]) -> str:
    return m.group(0) if m.group(1) is None else m.group(1) + ".0"


def _json_shape(mapping: dict[Any, Any], nested: bool = True) -> int:
    """0: not plain data JSON writes as YAML reads it; 1: it is; ``_NO_DOT``: it is, but a
    float needs its ``.0`` (about 3 us for a snapshot with a 20-module breakdown)."""
    shape = 1
    for k, v in mapping.items():
        if type(k) is not str:
            return 0
        kind = type(v)
        if kind is int or kind is str or kind is bool or v is None:
            continue
        if kind is float:
            if v - v != 0:  # nan, inf: YAML's .nan / .inf, not JSON
                return 0
            if "." not in repr(v):
                shape = _NO_DOT
        elif kind is dict and nested:
            inner = _json_shape(v, False)
            if not inner:
                return 0
            shape = max(shape, inner)
        else:
            return 0
    return shape


def flow_json(mapping: dict[str, Any]) -> str | None:
    """``mapping`` (str keys; numbers, strings, bools, None and one level of such mappings) as
    one JSON line that ``yaml.safe_load`` reads back equal, or ``None``.

    JSON is a YAML flow mapping except where YAML 1.1 reads differently: ``1e-05`` (a string
    to YAML; written ``1.0e-05``), ``NaN`` (refused here), and a character beyond U+FFFF,
    which JSON writes as an escaped surrogate pair and YAML would decode half by half.
    """
    shape = _json_shape(mapping)
    if not shape:
        return None
    text = json.dumps(mapping)
    if _SURROGATE.search(text):
        return None
    return _NUMBER_TOKEN.sub(_dot, text) if shape == _NO_DOT else text


#: Per key tuple: the snapshot's JSON with ``%d`` for each value (``None``: a key the template
#: cannot write, see :func:`_int_template`). Snapshots repeat one key set call after call.
_INT_TEMPLATES: dict[tuple[str, ...], str | None] = {}
_INT_TEMPLATES_MAX = 256


def _int_template(keys: tuple[str, ...]) -> str | None:
    if keys in _INT_TEMPLATES:
        return _INT_TEMPLATES[keys]
    template: str | None = None
    if all(type(k) is str for k in keys):
        names = [json.dumps(k) for k in keys]
        if not any(_SURROGATE.search(n) for n in names):
            template = "{" + ", ".join(n.replace("%", "%%") + ": %d" for n in names) + "}"
    if len(_INT_TEMPLATES) < _INT_TEMPLATES_MAX:
        _INT_TEMPLATES[keys] = template
    return template


def _int_flow(metrics: dict[str, Any]) -> str | None:
    """``flow_json(metrics)`` for a mapping whose values are all ``int`` (the common snapshot:
    ~125 ``memory_stats()`` counters, RSS): one ``%`` format of a template cached per key set,
    the same text as ``json.dumps`` at about a third of its cost. ``None``: not that case."""
    values = tuple(metrics.values())
    if set(map(type, values)) != _INT_ONLY:
        return None
    template = _int_template(tuple(metrics))
    return None if template is None else template % values


_INT_ONLY = {int}


def entry_yaml(key: str, metrics: Any) -> str:
    """One top-level entry: ``key: {...}`` on one line (see the module doc), or block YAML.

    Snapshots are mappings of numbers (and the names of a per-module breakdown), so the C
    JSON encoder writes them: about 12 us for one with a 20-module breakdown, where the
    direct block writer took 35 us and PyYAML's representer 550 us. Anything else is
    written as ``yaml.safe_dump`` does.
    """
    if type(metrics) is dict and _plain(key):
        if not metrics:  # as the block writer writes it
            return f"{key}: {{}}\n"
        flow = _int_flow(metrics)
        if flow is None:
            flow = flow_json(metrics)
        if flow is not None:
            return f"{key}: {flow}\n"
    plain = to_plain({key: metrics})
    value = plain[key]
    if type(value) is dict and value:
        flow = flow_json(value)
        if flow is not None and _plain(key):
            return f"{key}: {flow}\n"
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

    def __init__(self, path: Path, run_id: str | None = None) -> None:
        self.path = path
        #: Written under the header (``layout.RUN_ID_LINE``); ``None``: a rank that never
        #: learned it (no process group to ask rank 0 through).
        self.run_id = run_id
        self._written: set[str] = set()
        self._order: list[str] = []
        self._started = False

    @property
    def written(self) -> frozenset[str]:
        """A copy of the keys written (costs the run's length: per key, use :meth:`has`)."""
        return frozenset(self._written)

    @property
    def n_written(self) -> int:
        return len(self._written)

    def count_unwritten(self, keys: Sequence[str]) -> int:
        """How many distinct ``keys`` are not in the file yet."""
        return len(set(keys).difference(self._written))

    def has(self, key: str) -> bool:
        """Whether ``key`` is in the file."""
        return key in self._written

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
            kept = [k for k in self._order if k in snapshots]
            self._rewrite(snapshots, kept, new)
            return self.path
        if not new:
            return self.path
        try:
            self._append(snapshots, new, fsync)
        except OSError:
            # A full disk: keep as many whole entries as still fit, one at a time; the rest stay
            # unwritten, in memory, and the next flush tries them again.
            for k in new:
                try:
                    self._append(snapshots, [k], fsync)
                except OSError:
                    break
            raise
        return self.path

    def _rewrite(self, snapshots: Mapping[str, Any], kept: list[str], new: list[str]) -> None:
        """The whole file, atomically: ``kept`` and as many of ``new`` as fit (all, on a disk with
        room; on a full one, the first half, quarter... so a first flush of many calls still
        leaves a valid file with the snapshots that fitted). Raises the disk's error if not all did."""
        head = f"{layout.YAML_HEADER}\n" + (
            f"{layout.RUN_ID_LINE.format(run_id=self.run_id)}\n" if self.run_id else ""
        )
        n, error = len(new), None
        while True:
            order = kept + new[:n]
            body = "".join(entry_yaml(k, snapshots[k]) for k in order) or "{}\n"
            try:
                atomic_write_bytes(self.path, f"{head}{body}{block_end(len(order))}".encode())
                break
            except OSError as err:
                if n == 0:
                    raise
                error, n = error or err, n // 2
        self._started = True
        self._order = order
        self._written = set(order)
        if error is not None:
            raise error

    def _append(self, snapshots: Mapping[str, Any], new: list[str], fsync: bool) -> None:
        text = "".join(entry_yaml(k, snapshots[k]) for k in new) + block_end(len(self._order) + len(new))
        # A failed append (a full disk) is cut back off by `append_bytes`: the file ends at its
        # last whole entry and the entries stay unwritten.
        append_bytes(self.path, text.encode(), fsync=fsync)
        self._order.extend(new)
        self._written.update(new)
