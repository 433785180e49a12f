"""A local staging directory mirrored to a remote run directory, one whole object per file.

The profiler and its collectors write into the staging directory with the local writers
(appends, tail rewrites, temp file plus rename), unchanged. After each flush, :meth:`sync`
takes a copy of every file that changed since its last upload and a background thread PUTs
each one whole: an object store has no append, and a single PUT is atomic there, so a reader
of the bucket sees every file as it was at some flush, never half of one. The training thread
pays only for reading the changed files from the page cache; a slow or failing store delays
nothing. A store that fails is warned about once; later flushes retry, and the objects already
there stay valid (the last flush that reached the store).
"""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Callable
from pathlib import Path

from memprofiler.output.remote import RemoteDir, fix_hint

#: How long the final flush waits for the store before giving up (and saying where the files are).
FINAL_TIMEOUT_S = 120.0


def _signature(path: Path) -> tuple[int, int, int] | None:
    """What tells a changed file: the inode (atomic rewrites rename a new file in), the size
    (appends, tail rewrites) and the mtime (the kernel's clock may be too coarse on its own)."""
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


class RemoteMirror:
    """Uploads what changed in ``local`` to ``remote``, in a background thread.

    Args:
        local: the staging directory the writers use.
        remote: the claimed run directory on the store.
        warn: called once with a one-line message when the store fails.
    """

    def __init__(self, local: Path, remote: RemoteDir, warn: Callable[[str], None]) -> None:
        self.local = local
        self.remote = remote
        self._warn = warn
        self._uploaded: dict[str, tuple[int, int, int]] = {}
        self._pending: dict[str, tuple[bytes, tuple[int, int, int]]] = {}
        self._cond = threading.Condition()
        self._busy = False
        self._thread: threading.Thread | None = None
        self._gave_up = False  # the thread stopped on a failure; the next sync restarts it
        self._warned = False
        self.failures = 0
        self.puts = 0

    def _changed(self) -> dict[str, tuple[bytes, tuple[int, int, int]]]:
        out: dict[str, tuple[bytes, tuple[int, int, int]]] = {}
        for root, _dirs, files in os.walk(self.local):
            for name in files:
                if name.startswith("."):  # temp files of the atomic writers, write probes
                    continue
                path = Path(root) / name
                rel = path.relative_to(self.local).as_posix()
                sig = _signature(path)
                if sig is None or self._uploaded.get(rel) == sig:
                    continue
                try:
                    out[rel] = (path.read_bytes(), sig)
                except OSError:
                    continue
        return out

    def sync(self, wait: bool = False) -> bool:
        """Queue every changed file for upload; with ``wait``, upload now and return whether all
        reached the store (within :data:`FINAL_TIMEOUT_S`). Never raises.

        Call it right after the writers ran (same thread): the copy is taken here, so the files
        may change again as soon as it returns.
        """
        changed = self._changed()
        with self._cond:
            self._pending.update(changed)
            if self._thread is None or not self._thread.is_alive():
                self._gave_up = False
                self._thread = threading.Thread(target=self._run, name="memprofiler-remote", daemon=True)
                self._thread.start()
            self._cond.notify_all()
            if not wait:
                return True
            done = self._cond.wait_for(
                lambda: not self._busy and (not self._pending or self._gave_up), timeout=FINAL_TIMEOUT_S
            )
            return done and all(self._uploaded.get(k) == _signature(self.local / k) for k in changed)

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: bool(self._pending))
                batch, self._pending = self._pending, {}
                self._busy = True
            failed: dict[str, tuple[bytes, tuple[int, int, int]]] = {}
            for rel, (data, sig) in batch.items():
                try:
                    self.remote.put(rel, data)
                    self.puts += 1
                    self._uploaded[rel] = sig
                except Exception as err:
                    failed[rel] = (data, sig)
                    self.failures += 1
                    if self._warned:
                        continue
                    self._warned = True
                    self._warn(
                        f"could not write {rel} to {self.remote.url} ({type(err).__name__}: {err}); "
                        f"training goes on, the store keeps the last flush that reached it, later "
                        f"flushes retry and a local copy is in {self.local}; {fix_hint(self.remote.url)}"
                    )
            with self._cond:
                for rel, item in failed.items():
                    self._pending.setdefault(rel, item)  # a newer copy queued meanwhile wins
                self._busy = False
                self._gave_up = bool(failed)
                self._cond.notify_all()
                if failed:
                    return  # retried at the next sync, not in a tight loop

    def cleanup(self) -> None:
        """Remove the staging directory if the store holds every file in it (at exit). Never raises."""
        try:
            with self._cond:
                if self._pending or self._busy:
                    return
            if not self._changed():
                shutil.rmtree(self.local, ignore_errors=True)
        except Exception:
            pass
