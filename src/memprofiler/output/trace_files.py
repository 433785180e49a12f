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
import os
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
#: The longest file name most filesystems take (bytes), when the filesystem cannot be asked.
NAME_MAX = 255
#: Sample values of the per-cycle fields the names are checked with before training: the
#: widest a long run reaches (a billion profiler steps, a million cycles and epochs).
_SAMPLE_CYCLE = {"cycle": 1_000_000, "epoch": 1_000_000, "batch": 1_000_000_000}

#: Any trace memprofiler's readers find (gzip'd or not).
_TRACE_NAME = re.compile(r"\.pt\.trace\.json(\.gz)?$")

#: A file's identity when this run wrote it: device, inode, size, modification time.
_Identity = tuple[int, int, int, int]


def _identity(path: Path) -> _Identity | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _name_max(folder: Path) -> int:
    """The longest file name (bytes) the filesystem of ``folder`` (or its nearest existing
    ancestor) takes."""
    probe = folder
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        return int(os.pathconf(probe, "PC_NAME_MAX"))
    except (OSError, ValueError, AttributeError):
        return NAME_MAX


def name_problem(name: str, name_max: int = NAME_MAX) -> str | None:
    """Why ``name`` is no valid file name (one path component), or ``None``."""
    if not name or name in (".", ".."):
        return f"{name!r} is no file name"
    if "\0" in name:
        return f"{name!r} holds a NUL character"
    if "/" in name or "\\" in name:
        return f"{name!r} holds a path separator"
    size = len(name.encode("utf-8", "surrogateescape"))
    if size > name_max:
        return f"{name[:40]!r}... is {size} bytes long, over the filesystem's {name_max}"
    return None


@dataclass(frozen=True)
class TraceCycle:
    """One trace cycle: its number (from 1) and every template field's value for it."""

    index: int
    fields: Mapping[str, Any] = field(default_factory=dict)


def template_regex(template: str, known: Mapping[str, Any] | None = None) -> re.Pattern[str]:
    """A regex matching any name ``template`` can produce: each field matches ``.+?``, or,
    when ``known`` gives its value, that value alone."""
    pieces = re.split(r"(\{[^{}]*\})", template.replace("{{", "\0").replace("}}", "\1"))
    body = ""
    for k, piece in enumerate(pieces):
        if k % 2 == 0:
            body += re.escape(piece.replace("\0", "{").replace("\1", "}"))
            continue
        name = piece[1:-1].split(":", 1)[0].split("!", 1)[0]
        if known is not None and name in known:
            try:
                body += re.escape(piece.format(**{name: known[name]}))
                continue
            except (ValueError, KeyError, IndexError):
                pass
        body += ".+?"
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
        #: file -> its identity when this run last wrote it: retention deletes no other file.
        self._identity: dict[Path, _Identity | None] = {}

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

    def file_name(self, kind: str, fields: Mapping[str, Any], suffix: str = ".json") -> str:
        """The name of the ``kind`` file of a cycle with ``fields`` (see :meth:`path_for`)."""
        name = self.config.filename.format(**fields)
        if kind != TRACE:
            stem = name.removesuffix(".json").removesuffix(".pt.trace")
            name = f"{stem}.{kind}{suffix}"
        if self.config.use_gzip and not name.endswith(GZIP_SUFFIX):
            name += GZIP_SUFFIX
        return name

    def path_for(self, kind: str, cycle: TraceCycle, suffix: str = ".json") -> Path:
        """Where the ``kind`` file of ``cycle`` goes.

        ``kind`` ``"trace"`` is the Chrome trace (``filename``); any other kind is a companion
        named after it: ``rank0.4.pt.trace.json`` gives ``rank0.4.{kind}{suffix}``.
        With ``use_gzip`` the name ends in ``.gz`` and the file must be gzip
        (:meth:`write_bytes` does that).

        Raises:
            ValueError: the name is no file name, or the folder resolves (through a symlink
                made since training started) outside the output directory; the writer warns.
        """
        name = self.file_name(kind, cycle.fields, suffix)
        problem = name_problem(name)
        if problem is not None:
            raise ValueError(f"trace file name {problem}")
        folder = self.folder
        self._check_inside(folder)
        return folder / name

    def _check_inside(self, folder: Path) -> None:
        root = self.root.resolve()
        resolved = folder.resolve()
        if resolved != root and root not in resolved.parents:
            raise ValueError(f"the trace folder {folder} resolves to {resolved}, outside {root}")

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
        for p in map(Path, paths):
            if p not in files:
                files.append(p)
            self._identity[p] = _identity(p)
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
        """Delete files of a retired cycle: only those this run wrote and nobody changed since,
        never one a kept cycle (the one just written included) wrote too."""
        kept = {p for files in self._cycles.values() for p in files}
        for path in paths:
            if path in kept:
                continue
            written = self._identity.pop(path, None)
            if written is None or _identity(path) != written:
                continue  # not (or no longer) the file this run wrote: not ours to delete
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
    def check_paths(self, kinds: Iterable[tuple[str, str]] = ()) -> None:
        """Expand every template now and refuse names that would fail at each cycle's write.

        The folder must stay inside the output directory once ``..`` and symlinks are
        resolved; the trace name, and each companion's ``(kind, suffix)`` in ``kinds``, must be
        a file name the folder's filesystem takes (no separator or NUL, at most its name length)
        for the widest cycle, epoch and batch numbers a run reaches.

        Raises:
            ConfigError: one line naming ``trace_files.folder`` / ``filename`` / ``run_name``.
        """
        try:
            rel = self.config.folder.format(**self.run_fields).strip("/")
            sample = {**self.run_fields, **_SAMPLE_CYCLE}
            names = [self.file_name(TRACE, sample)] + [self.file_name(k, sample, sfx) for k, sfx in kinds]
        except (ValueError, TypeError, KeyError) as err:
            raise ConfigError(
                "trace_files.filename", f"{self.config.filename!r} cannot be filled in: {err}"
            ) from None
        key = "trace_files.run_name" if "{run_name" in self.config.folder else "trace_files.folder"
        parts = [p for p in re.split(r"[/\\]", rel) if p]
        for part in parts:
            problem = name_problem(part) if part != ".." else "'..' leaves the output directory"
            if problem is not None:
                raise ConfigError(key, f"the trace folder {rel!r} is refused: {problem}")
        folder = self.folder
        try:
            self._check_inside(folder)
        except (ValueError, OSError) as err:
            raise ConfigError(key, f"{err}; give a folder inside the output directory") from None
        name_max = _name_max(folder)
        key = "trace_files.run_name" if "{run_name" in self.config.filename else "trace_files.filename"
        for name in names:
            problem = name_problem(name, name_max)
            if problem is not None:
                raise ConfigError(
                    key, f"{self.config.filename!r} gives the trace file name {problem}; shorten or fix it"
                )

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

    def check_overwrite(self, exclude: Iterable[Path] = (), run_files: Iterable[Path] = ()) -> None:
        """Refuse to write over an earlier run's files, unless ``overwrite`` says so and it is safe.

        The rule: ``overwrite: true`` lets this run replace an earlier run's files, and a run's
        files are its traces plus the run-level files with fixed names (``run_files``: the step
        timeline, the summary). Replacing them is only whole when the earlier run's traces are
        replaced too, i.e. match this run's ``filename``. When the folder holds traces named
        otherwise beside a run-level file this run would rewrite, the earlier run meant to
        coexist: rewriting its step timeline and summary would leave its traces beside another
        run's timeline, so that is refused even with ``overwrite: true``.

        Args:
            exclude: files this run wrote itself (an earlier stage of the same Trainer).
            run_files: the run-level files this rank will write, under ``root``.

        Raises:
            ConfigError: one line naming the folder, a file in it and the fix.
        """
        pattern = template_regex(self.config.trace_filename)
        own = {Path(p) for p in exclude}
        names: list[str] = []
        if self.folder.is_dir():
            names = [p.name for p in self.folder.iterdir() if p.is_file() and self.folder / p.name not in own]
        if self.mirror is not None:
            rel = self.folder.relative_to(self.root).as_posix()
            remote = self.mirror.remote if rel == "." else self.mirror.remote.child(rel)
            names += remote.names()
        where = self.mirror.remote.url if self.mirror is not None else str(self.folder)
        clash = sorted(n for n in names if pattern.match(n))
        if clash and not self.config.overwrite:
            raise ConfigError(
                "trace_files.overwrite",
                f"the trace folder {where} already holds {clash[0]!r} from an earlier run; set "
                "`trace_files.overwrite: true` or choose another `trace_files.folder` or `dirpath`",
            )
        taken = sorted(p for p in map(Path, run_files) if p not in own and self._exists(p))
        if not taken:
            return
        if not self.config.overwrite:
            raise ConfigError(
                "trace_files.overwrite",
                f"{taken[0]} is from an earlier run; set `trace_files.overwrite: true` or choose "
                "another `trace_files.folder` or `dirpath`",
            )
        # This run replaces only traces named as its own (its run name, rank... filled in): an
        # earlier run's traces under another `{run_name}` stay, so its run files must too.
        mine = template_regex(self.config.trace_filename, self.run_fields)
        others = sorted(n for n in names if _TRACE_NAME.search(n) and not mine.match(n))
        if others:
            raise ConfigError(
                "trace_files.overwrite",
                f"{taken[0]} belongs to an earlier run whose traces are named otherwise "
                f"({others[0]!r}); overwriting would replace its step timeline and summary but "
                "keep its traces; give this run its own folder (e.g. `trace_files.folder: "
                '"{run_name}"`) or `dirpath`',
            )

    def _exists(self, path: Path) -> bool:
        if path.is_file():
            return True
        if self.mirror is None:
            return False
        try:
            rel = path.relative_to(self.root).as_posix()
        except ValueError:
            return False
        parent, _, name = rel.rpartition("/")
        remote = self.mirror.remote.child(parent) if parent else self.mirror.remote
        try:
            return name in remote.names()
        except Exception:
            return False
