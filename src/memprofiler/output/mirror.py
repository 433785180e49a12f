"""A local staging directory mirrored to a remote run directory, one whole object per file.

The profiler and its collectors write into the staging directory with the local writers
(appends, tail rewrites, temp file plus rename), unchanged. A background thread PUTs each
file that changed as one whole object: an object store has no append, and a single PUT is
atomic there, so a reader of the bucket sees every file as it was at some flush, never half of
one. The thread reads the files under :attr:`RemoteMirror.lock`, which the profiler holds
while it appends, so it never copies half an append.

What training pays at a flush is :meth:`sync`: setting a flag. Uploads run at most every
:data:`MIN_INTERVAL_S`, taking the newest state of every changed file: whole-file PUTs grow
with the run, and a window closing every few steps must not mean a PUT of every file every few
steps. The final flush (end of run, crash, SIGTERM) uploads at once and waits. A store that
fails is warned about once; later flushes retry, and the objects already there stay valid (the
last upload that reached the store).
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path

from memprofiler.output.remote import RemoteDir, fix_hint

#: Seconds between two uploads while the run goes on (the final flush does not wait for it).
MIN_INTERVAL_S = 5.0
#: How long the final flush waits for the store before giving up (and saying where the files are).
FINAL_TIMEOUT_S = 120.0
#: Seconds the upload thread waits for a request before it ends (the next :meth:`sync` starts
#: another): a finished run leaves no thread behind in a process that goes on.
IDLE_EXIT_S = 30.0

_Signature = tuple[int, int, int]


def _signature(path: Path) -> _Signature | None:
    """What tells a changed file: the inode (atomic rewrites rename a new file in), the size
    (appends, tail rewrites) and the mtime (the kernel's clock may be too coarse on its own)."""
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


class RemoteMirror:
    """Uploads what changed in ``local`` to ``remote``, from a background thread.

    Args:
        local: the staging directory the writers use.
        remote: the claimed run directory on the store.
        warn: called once with a one-line message when the store fails.
        min_interval_s: seconds between two uploads before the final one.
        idle_exit_s: seconds without a request after which the upload thread ends.
    """

    def __init__(
        self,
        local: Path,
        remote: RemoteDir,
        warn: Callable[[str], None],
        min_interval_s: float = MIN_INTERVAL_S,
        idle_exit_s: float = IDLE_EXIT_S,
    ) -> None:
        self.local = local
        self.remote = remote
        self.min_interval_s = min_interval_s
        self.idle_exit_s = idle_exit_s
        #: Held by the writers while a file is mid-append; the uploads read files under it.
        self.lock = threading.Lock()
        self._warn = warn
        self._uploaded: dict[str, _Signature] = {}
        #: Files deleted locally whose objects are still to be deleted from the store.
        self._deleted: set[str] = set()
        self._cond = threading.Condition()
        self._requested = 0  # sync() calls so far
        self._done = 0  # the last request whose upload pass has finished
        self._urgent = False
        self._ok = True  # the last pass uploaded everything it found
        self._last_pass = -float("inf")
        self._thread: threading.Thread | None = None
        self._warned = False
        self.failures = 0
        self.puts = 0

    def sync(self, wait: bool = False) -> bool:
        """Ask for an upload of every changed file. Never raises.

        Without ``wait`` it returns at once (the upload follows within :attr:`min_interval_s`).
        With ``wait`` it uploads now and returns whether everything reached the store within
        :data:`FINAL_TIMEOUT_S`.
        """
        with self._cond:
            self._requested += 1
            ticket = self._requested
            self._urgent = self._urgent or wait
            if self._thread is None or not self._thread.is_alive():  # none, or the last one ended
                self._thread = threading.Thread(target=self._run, name="memprofiler-remote", daemon=True)
                self._thread.start()
            self._cond.notify_all()
            if not wait:
                return True
            done = self._cond.wait_for(lambda: self._done >= ticket, timeout=FINAL_TIMEOUT_S)
            return done and self._ok

    def remove(self, rel: str) -> None:
        """Delete ``rel`` from the staging directory now and from the store at the next upload.

        For files a writer retires (old trace cycles); never raises for a file already gone.
        """
        with self.lock:
            (self.local / rel).unlink(missing_ok=True)
            self._uploaded.pop(rel, None)
            self._deleted.add(rel)
        self.sync()

    def _changed(self) -> dict[str, tuple[bytes, _Signature]]:
        out: dict[str, tuple[bytes, _Signature]] = {}
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

    def _run(self) -> None:
        try:
            self._serve()
        finally:
            with self._cond:  # one that ended on an error is replaced at the next sync
                if self._thread is threading.current_thread():
                    self._thread = None

    def _serve(self) -> None:
        while True:
            with self._cond:
                if not self._cond.wait_for(lambda: self._requested > self._done, timeout=self.idle_exit_s):
                    # idle: this thread ends, said under the lock `sync` takes, so that a request
                    # made from now on starts another thread and none is missed
                    self._thread = None
                    return
                while not self._urgent:
                    left = self._last_pass + self.min_interval_s - time.monotonic()
                    if left <= 0 or not self._cond.wait(timeout=left):
                        break
                ticket, self._urgent = self._requested, False
            self._last_pass = time.monotonic()
            ok = self._upload()
            with self._cond:
                self._ok, self._done = ok, ticket
                self._cond.notify_all()

    def _upload(self) -> bool:
        with self.lock:
            changed = self._changed()
        ok = True
        for rel, (data, sig) in changed.items():
            try:
                self.remote.put(rel, data)
            except Exception as err:
                ok = False
                self._failed(
                    f"could not write {rel} to {self.remote.url} ({type(err).__name__}: {err}); "
                    f"training goes on, the store keeps the last upload that reached it, later "
                    f"flushes retry and a local copy is in {self.local}"
                )
                continue
            self.puts += 1
            self._uploaded[rel] = sig
        return self._delete_retired() and ok

    def _failed(self, message: str) -> None:
        """Count a failed store operation; warn about the first one only."""
        self.failures += 1
        if not self._warned:
            self._warned = True
            self._warn(f"{message}; {fix_hint(self.remote.url)}")

    def _delete_retired(self) -> bool:
        """Delete the objects of files removed with :meth:`remove`; a failure is retried later."""
        with self.lock:
            retired = sorted(self._deleted)
        ok = True
        for rel in retired:
            try:
                self.remote.fs.rm_file(self.remote.path(rel))
            except FileNotFoundError:
                pass
            except Exception as err:
                ok = False
                self._failed(
                    f"could not delete {rel} from {self.remote.url} ({type(err).__name__}: {err}); "
                    "later flushes retry"
                )
                continue
            with self.lock:
                self._deleted.discard(rel)
        return ok

    def cleanup(self) -> None:
        """Remove the staging directory if the store holds every file in it (at exit). Never raises."""
        try:
            with self._cond:
                if self._requested > self._done:
                    return
            if not self._changed():
                shutil.rmtree(self.local, ignore_errors=True)
        except Exception:
            pass
