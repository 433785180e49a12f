"""A run's own files: where they go, when they are flushed, and the cross-rank summary.

:class:`RunFiles` is the profiler's output half. It claims the run directory (local, or a
staging directory mirrored to an fsspec URL), keeps the bookkeeping of what is new since the
last flush, writes the stats YAML, the pickle, the memory trace and the manifest, drops what
is on disk from memory, and writes ``memory_summary.yaml`` at the end. The profiler decides
*when* (window closes, ``flush_every_calls``, ``flush_interval_s``, the end); this decides
*what* and *where*.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import itertools
import os
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

from memprofiler import layout
from memprofiler.config import MemProfilerConfig, urls
from memprofiler.core import run_setup, summary
from memprofiler.output.mirror import RemoteMirror
from memprofiler.output.remote import is_url, local_path
from memprofiler.output.run_dir import RunManifest, write_manifest
from memprofiler.output.snapshot_cache import SnapshotCache
from memprofiler.output.stats_file import StatsFile
from memprofiler.output.timeline import MemoryTimeline
from memprofiler.output.writers import write_pickle

#: Errors of a full disk (or quota): every file keeps what it held, one warning for the run.
DISK_FULL = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})

#: How long rank 0 waits for the other ranks' figures at the end of a run without collectives,
#: and after an exception (when the others may be stuck in another collective).
SUMMARY_WAIT_S = 60.0
SUMMARY_WAIT_AFTER_EXCEPTION_S = 15.0


class RunFiles:
    """The files of one run of one rank.

    Args:
        config: the profiler's config.
        rank: global rank.
        chosen: ``save_dir`` as asked for: a path or an fsspec URL.
        warn: the profiler's warn-once.
        summary_collective: every rank is known to reach the end together: the cross-rank
            summary then meets in collectives. Otherwise ranks post to the process group's store
            and rank 0 waits at most ``SUMMARY_WAIT_S``: nothing can hang.
    """

    def __init__(
        self,
        config: MemProfilerConfig,
        rank: int,
        chosen: str | os.PathLike[str],
        warn: Callable[..., None],
        summary_collective: bool = False,
    ) -> None:
        self.config = config
        self.rank = rank
        #: Every snapshot recorded and not yet dropped from memory, by key. Only this object
        #: changes it (:meth:`record`, :meth:`merge_late`, eviction after a flush).
        self.snapshots: dict[str, dict[str, Any]] = {}
        self.warn = warn
        #: A remote ``save_dir`` (``s3://...``, any fsspec URL) as asked for; ``None`` when local.
        self.save_url: str | None = os.fspath(chosen) if is_url(chosen) else None
        #: The directory asked for; :attr:`save_dir` is where this run writes (a ``version_{n}``
        #: under it when it already holds a run). With a remote ``save_dir`` both are the local
        #: staging directory mirrored to :attr:`run_url`.
        self.requested = local_path(chosen) if self.save_url is None else Path(tempfile.gettempdir())
        self.save_dir = self.requested
        self.run_url: str | None = None
        self.mirror: RemoteMirror | None = None
        self.manifest: RunManifest | None = None
        self.stats: StatsFile | None = None
        self.timeline: MemoryTimeline | None = None
        #: Snapshots dropped from memory after they reached the stats file.
        self.evicted = 0
        self._disk_full_warned = False
        #: Snapshots dropped unwritten because the disk was full (the oldest beyond the limit).
        self.lost_to_full_disk = 0
        self.summary_collective = summary_collective
        self._summaries = 0
        self._pickle_cache = SnapshotCache()
        self._unflushed: list[str] = []
        self._changed: list[str] = []
        self._calls_since_flush = 0
        self._last_flush = time.monotonic()

    # ------------------------------------------------------------------ set-up
    def claim(self) -> None:
        """Claim the run directory, the same on every rank (one line on failure)."""
        if self.save_url is not None:
            if urls.in_process(self.save_url):  # the API may read it back before exit; say so
                self.warn(f"`save_dir` {urls.in_process_message(self.save_url)} (read them before then)")
            run, self.manifest = run_setup.claim_remote_run_dir(self.save_url, self.rank, self.warn)
            staging = Path(tempfile.mkdtemp(prefix=f"memprofiler-rank{self.rank}-"))
            self.requested = self.save_dir = staging
            self.run_url = run.url
            self.mirror = RemoteMirror(staging, run, lambda message: self.warn(message, all_ranks=True))
            atexit.register(self.mirror.cleanup)
        else:
            self.save_dir, self.manifest = run_setup.claim_run_dir(self.requested, self.rank, self.warn)
        run_id = run_setup.share_run_id(self.rank, self.manifest) or None
        self.stats = StatsFile(self.save_dir / layout.MEMORY_STATS_YAML.format(rank=self.rank), run_id)
        if self.config.dump_memory_trace:
            self.timeline = MemoryTimeline(self.rank, run_id, run_setup.group_size())

    # ------------------------------------------------------------------ bookkeeping
    def record(self, key: str, metrics: dict[str, Any]) -> None:
        """Keep the new snapshot ``key`` for the next flush."""
        self.snapshots[key] = metrics
        if self.config.dump_memorystats_pickle:
            self._pickle_cache.touch(key)
        self._unflushed.append(key)

    def merge_late(self, key: str, metrics: Mapping[str, Any]) -> None:
        """Late (step-end) metrics into the ``end`` snapshot ``key``."""
        if self.config.dump_memorystats_pickle:
            self._pickle_cache.touch(key)  # first: a SIGTERM dump may run mid-update
        if self.stats is not None and self.stats.has(key):
            self._changed.append(key)
        self.snapshots.setdefault(key, {}).update(metrics)
        if key not in self._unflushed:
            self._unflushed.append(key)

    def call_collected(self) -> bool:
        """Count a collected call; whether a flush is due (``flush_every_calls``/``flush_interval_s``)."""
        self._calls_since_flush += 1
        cfg = self.config
        return self._calls_since_flush >= cfg.flush_every_calls or (
            time.monotonic() - self._last_flush >= cfg.flush_interval_s
        )

    # ------------------------------------------------------------------ writing
    def write(self, final: bool, close_manifest: Callable[[RunManifest], list[str]]) -> list[Path]:
        """Write what is new; never raises (a failure is a warning, the other files still go).

        Args:
            final: the run is over: fsync, close the manifest (``close_manifest`` gives its
                notes), and wait for a remote store.
        """
        written: list[Path] = []
        cfg = self.config
        self._calls_since_flush = 0
        self._last_flush = time.monotonic()
        if self._disk_full_warned and not final:
            # The disk filled: retrying every flush would render every pending snapshot again
            # each time (quadratic); they wait in memory, bounded, for the end of the run.
            self._evict_unwritten()
            return written
        unflushed, changed = self._unflushed, self._changed
        self._unflushed, self._changed = [], []
        writers: list[tuple[str, Callable[[], Path]]] = []
        stats = self.stats
        if stats is not None:
            # `has`, not a copy of every key written: that copy grew with the run, at every flush.
            pending = stats.count_unwritten(unflushed)
            if len(self.snapshots) > stats.n_written + pending:  # entries set by hand, not recorded
                unflushed = unflushed + [k for k in self.snapshots if not stats.has(k)]
        if cfg.dump_memorystats_yaml and stats is not None:
            writers.append(
                (stats.path.name, lambda: stats.flush(self.snapshots, unflushed, changed, fsync=final))
            )
        if cfg.dump_memorystats_pickle:
            pickle_path = self.save_dir / layout.MEMORY_STATS_PICKLE.format(rank=self.rank)
            writers.append(
                (
                    pickle_path.name,
                    lambda: write_pickle(pickle_path, self._pickle_cache.plain(self.snapshots), plain=False),
                )
            )
        timeline = self.timeline
        if timeline is not None:
            writers.append(("the memory trace", lambda: timeline.dump(self.save_dir)))
        manifest = self.manifest
        if final and manifest is not None:
            writers.append((layout.RUN_MANIFEST, lambda: self._close_manifest(manifest, close_manifest)))
        # A remote run's uploads read the files under this lock: never half an append.
        with self.mirror.lock if self.mirror is not None else contextlib.nullcontext():
            for what, write in writers:
                try:
                    written.append(write())
                except Exception as err:  # each file on its own: one failure must not cost the others
                    if stats is not None and what == stats.path.name:
                        self._unflushed, self._changed = unflushed + self._unflushed, changed + self._changed
                    if isinstance(err, OSError) and err.errno in DISK_FULL:
                        if not self._disk_full_warned:  # one line for every file and every flush
                            self._disk_full_warned = True
                            self.warn(
                                f"{self.save_dir} is full ({err.strerror}) writing {what}: every file "
                                "keeps the records written before it filled and stays valid; newer "
                                "snapshots wait in memory (the newest `max_snapshots_in_memory`) "
                                "and are written at the end of the run if there is room then",
                                all_ranks=True,
                            )
                        continue
                    self.warn(f"could not write {what} in {self.save_dir}: {err!r}", all_ranks=True)
        return written

    def after_write(self, final: bool) -> None:
        """Drop what is on disk from memory; send the files to a remote store."""
        self._evict_written()
        if self.mirror is not None and not self.mirror.sync(wait=final) and final:
            self.warn(
                f"not every file reached {self.run_url}; the complete files are in {self.save_dir}",
                all_ranks=True,
            )

    def _close_manifest(self, manifest: RunManifest, notes_of: Callable[[RunManifest], list[str]]) -> Path:
        notes = notes_of(manifest)
        manifest.finish(manifest.status if manifest.status == "crashed" else "finished", notes)
        return write_manifest(self.save_dir, manifest)

    def _evict_unwritten(self) -> None:
        """On a full disk: keep the newest ``max_snapshots_in_memory`` snapshots, drop older ones
        never written (counted in :attr:`lost_to_full_disk`)."""
        excess = len(self.snapshots) - self.config.max_snapshots_in_memory
        if excess <= 0:
            return
        stats = self.stats
        for key in list(self.snapshots)[:excess]:
            del self.snapshots[key]
            self.lost_to_full_disk += stats is None or not stats.has(key)
        keep = set(self.snapshots)
        self._unflushed = [k for k in self._unflushed if k in keep]
        self._changed = [k for k in self._changed if k in keep]

    def _evict_written(self) -> None:
        """Drop the oldest snapshots from memory once they are on disk (bounded memory)."""
        limit = self.config.max_snapshots_in_memory
        stats = self.stats
        if len(self.snapshots) <= limit or stats is None or self.config.dump_memorystats_pickle:
            return  # the pickle is rewritten whole from memory: keep everything for it
        excess = len(self.snapshots) - limit
        # The oldest come first: stop at the `excess`-th written one, not at the end of memory.
        for key in list(itertools.islice((k for k in self.snapshots if stats.has(k)), excess)):
            del self.snapshots[key]
        self.evicted += excess
        if self.timeline is not None:
            self.timeline.forget_written(keep=limit)

    # ------------------------------------------------------------------ summary
    def write_summary(self, after_exception: bool) -> list[Path]:
        """Every rank's figures reduced across ranks; rank 0 writes ``memory_summary.yaml``.

        Driven by the core, so plain loops and Fabric get it as the callback does. Never raises.
        """
        if not summary.dist_ready():
            return []
        self._summaries += 1
        collective = self.summary_collective and not after_exception
        try:
            path = summary.write_cross_rank_summary(
                self._all_snapshots(),
                self.save_dir,
                self.rank,
                run_setup.world_size(),
                after_exception=not collective,
                generation=self._summaries,
                timeout_s=SUMMARY_WAIT_AFTER_EXCEPTION_S if after_exception else SUMMARY_WAIT_S,
            )
        except Exception as err:
            self.warn(
                f"could not gather snapshots across ranks ({err!r}); no `{layout.MEMORY_SUMMARY_YAML}`, "
                "each rank's own files are complete",
                all_ranks=True,
            )
            return []
        if path is None:
            return []
        if self.mirror is not None:  # written after the final flush: it goes up too
            self.mirror.sync(wait=True)
        return [path]

    def _all_snapshots(self) -> Mapping[str, Mapping[str, Any]]:
        """Every snapshot of the run: those that left memory are read back from the stats file."""
        if not self.evicted or self.stats is None:
            return self.snapshots
        loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
        on_disk = yaml.load(self.stats.path.read_text(encoding="utf-8"), Loader=loader) or {}
        return {**on_disk, **self.snapshots}
