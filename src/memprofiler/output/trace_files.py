"""Trace files that manage themselves: named from templates, gzip on request, the oldest deleted.

A :class:`TraceFiles` owns every file of every trace cycle: the Chrome trace itself and any
companion written beside it (a memory-by-category export, a step timeline...). A writer asks
:meth:`TraceFiles.path_for` where a file of a cycle goes, writes it (or lets
:meth:`TraceFiles.write_bytes` do so, gzip included), and reports it with
:meth:`TraceFiles.written`; retention then deletes whole cycles, oldest first, from the local
directory and, through a :class:`~memprofiler.output.mirror.RemoteMirror`, from the store.

Example:
    >>> files = TraceFiles(TraceFilesConfig(use_gzip=True), Path(tmp), {"rank": 0, ...})  # doctest: +SKIP
    >>> cycle = files.cycle(1, epoch=0, batch=4)
    >>> files.write_bytes("trace", cycle, json.dumps(trace).encode())  # ...pt.trace.json.gz
"""

from __future__ import annotations

import gzip
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memprofiler.config.trace_files import (
    FILENAME_FIELDS,
    FOLDER_FIELDS,
    GZIP_SUFFIX,
    TraceFilesConfig,
    template_fields,
)
from memprofiler.errors import ConfigError
from memprofiler.output.mirror import RemoteMirror
from memprofiler.output.writers import atomic_write_bytes

#: The kind of the cycle's main file, the Chrome trace.
TRACE = "trace"
#: gzip level: 6 packs a Kineto trace about 10x at a fraction of the cost of 9.
_GZIP_LEVEL = 6


@dataclass(frozen=True)
class TraceCycle:
    """One trace cycle: its number (from 1) and every template field's value for it."""

    index: int
    fields: Mapping[str, Any] = field(default_factory=dict)


def template_regex(template: str) -> re.Pattern[str]:
    """A regex matching any name ``template`` can produce (each field matches ``.+?``)."""
    parts = re.split(r"\{[^{}]*\}", template.replace("{{", "\0").replace("}}", "\1"))
    body = ".+?".join(re.escape(p.replace("\0", "{").replace("\1", "}")) for p in parts)
    return re.compile(f"^{body}$")


class TraceFiles:
    """Names, writes and retires the files of a profiler's trace cycles.

    Args:
        config: naming, gzip, retention and overwrite rules.
        root: local output directory (a remote run's staging directory when ``mirror`` is set).
        run_fields: the values of the folder fields (``rank``, ``run_name``...) for this rank.
        mirror: uploads what is written under ``root`` and deletes what retention retires.
        warn: called with a one-line message when a retired file cannot be deleted.
    """

    def __init__(
        self,
        config: TraceFilesConfig,
        root: Path,
        run_fields: Mapping[str, Any],
        mirror: RemoteMirror | None = None,
        warn: Callable[[str], None] | None = None,
    ) -> None:
        missing = [f for f in FOLDER_FIELDS if f not in run_fields]
        if missing:
            raise ValueError(f"run_fields lacks {', '.join(missing)}")
        self.config = config
        self.root = Path(root)
        self.run_fields = dict(run_fields)
        self.mirror = mirror
        self._warn = warn or (lambda message: None)
        #: cycle index -> files written for it, oldest cycle first.
        self._cycles: dict[int, list[Path]] = {}

    # ------------------------------------------------------------------ naming
    @property
    def folder(self) -> Path:
        """The trace folder: ``root`` / the ``folder`` template filled in."""
        rel = self.config.folder.format(**self.run_fields).strip("/")
        return self.root / rel if rel else self.root

    def cycle(self, index: int, **fields: Any) -> TraceCycle:
        """A cycle with the run's fields plus ``fields`` (``epoch``, ``batch``)."""
        values = {**self.run_fields, "cycle": index, **fields}
        for name in FILENAME_FIELDS:
            values.setdefault(name, "")
        return TraceCycle(index=index, fields=values)

    def path_for(self, kind: str, cycle: TraceCycle, suffix: str = ".json") -> Path:
        """Where the ``kind`` file of ``cycle`` goes.

        ``kind`` ``"trace"`` is the Chrome trace (``filename``); any other kind is a companion
        named after it: ``rank0.4.pt.trace.json`` gives ``rank0.4.{kind}{suffix}``.
        With ``use_gzip`` the name ends in ``.gz`` and the file must be gzip
        (:meth:`write_bytes` does that).
        """
        name = self.config.filename.format(**cycle.fields)
        if kind != TRACE:
            stem = name.removesuffix(".json").removesuffix(".pt.trace")
            name = f"{stem}.{kind}{suffix}"
        if self.config.use_gzip and not name.endswith(GZIP_SUFFIX):
            name += GZIP_SUFFIX
        return self.folder / name

    # ------------------------------------------------------------------ writing
    def write_bytes(self, kind: str, cycle: TraceCycle, data: bytes) -> Path:
        """Write ``data`` (gzip-compressed with ``use_gzip``) atomically; record it with the cycle."""
        path = self.path_for(kind, cycle)
        if path.name.endswith(GZIP_SUFFIX):
            data = gzip.compress(data, compresslevel=_GZIP_LEVEL, mtime=0)
        atomic_write_bytes(path, data)
        self.written(cycle, [path])
        return path

    def written(self, cycle: TraceCycle, paths: Iterable[Path]) -> None:
        """Record files of ``cycle`` written by someone else too; retire cycles beyond the limit."""
        files = self._cycles.setdefault(cycle.index, [])
        files.extend(Path(p) for p in paths if Path(p) not in files)
        keep = self.config.num_traces_to_keep
        while keep >= 1 and len(self._cycles) > keep:
            oldest = min(self._cycles)
            self._retire(self._cycles.pop(oldest))
        if self.mirror is not None:
            self.mirror.sync()

    def cycles(self) -> dict[int, list[Path]]:
        """The files of every cycle still kept, by cycle number."""
        return {k: list(v) for k, v in self._cycles.items()}

    def _retire(self, paths: list[Path]) -> None:
        for path in paths:
            try:
                if self.mirror is not None:
                    self.mirror.remove(path.relative_to(self.root).as_posix())
                else:
                    path.unlink(missing_ok=True)
            except (OSError, ValueError) as err:
                self._warn(f"could not delete the old trace file {path}: {err!r}")

    def finish(self) -> bool:
        """Upload what is left to a remote store and wait for it (end of run); whether it all went."""
        return self.mirror.sync(wait=True) if self.mirror is not None else True

    # ------------------------------------------------------------------ checks before training
    def check_unique_per_rank(self) -> None:
        """Refuse templates that would make every rank of a multi-process run write the same file.

        Raises:
            ConfigError: naming ``trace_files.filename`` and the fields that tell ranks apart.
        """
        if int(self.run_fields.get("world_size", 1)) <= 1:
            return
        used = set(template_fields(self.config.folder)) | set(template_fields(self.config.filename))
        if "rank" in used or {"local_rank", "node_rank"} <= used:
            return
        raise ConfigError(
            "trace_files.filename",
            f"{self.config.filename!r} (in folder {self.config.folder!r}) names no rank, so the "
            f"{self.run_fields['world_size']} ranks would write the same files; add {{rank}}",
        )

    def check_overwrite(self, exclude: Iterable[Path] = ()) -> None:
        """Refuse a trace folder that already holds trace files, unless ``overwrite``.

        Args:
            exclude: files this run wrote itself (an earlier stage of the same Trainer).

        Raises:
            ConfigError: one line naming the folder, a file in it and the fix.
        """
        if self.config.overwrite:
            return
        pattern = template_regex(self.config.trace_filename)
        names: list[str] = []
        own = {Path(p).name for p in exclude if Path(p).parent == self.folder}
        if self.folder.is_dir():
            names = [p.name for p in self.folder.iterdir() if p.is_file() and p.name not in own]
        if self.mirror is not None:
            rel = self.folder.relative_to(self.root).as_posix()
            remote = self.mirror.remote if rel == "." else self.mirror.remote.child(rel)
            names += remote.names()
        clash = sorted(n for n in names if pattern.match(n))
        if clash:
            where = self.mirror.remote.url if self.mirror is not None else str(self.folder)
            raise ConfigError(
                "trace_files.overwrite",
                f"the trace folder {where} already holds {clash[0]!r} from an earlier run; set "
                "`trace_files.overwrite: true` or choose another `trace_files.folder` or `dirpath`",
            )
