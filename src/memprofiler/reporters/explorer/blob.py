"""The explorer page's data: typed arrays packed one after another, gzipped as they are added.

The gzip runs in a worker thread, fed in the order the arrays are added: zlib lets go of the
GIL while it compresses, so the compression (at 1M entries a quarter of a second, as much as
the replay's stacks) runs beside what the page still computes, and beside the freeing of the
loaded snapshot when the caller drops it before :meth:`Blob.encode`. The bytes are those of one
``compressobj`` fed the same parts in the same order on one thread.
"""

from __future__ import annotations

import base64
import threading
import zlib
from queue import SimpleQueue
from typing import Any

import numpy as np

#: Level 1: at 1M entries 0.3 s and 11.5 MB against 2.5 s and 10.8 MB at level 6.
LEVEL = 1


class Blob:
    """Typed arrays packed one after another (8-byte aligned, little-endian), with a manifest.

    The arrays added are held until :meth:`send` hands them to the gzip worker as one part:
    a few large parts, since the worker takes the GIL back each time zlib returns (after each
    part, and as its output grows), and each time waits for the thread holding it to let go.

    Raises (from :meth:`encode`): whatever the compression raised (a ``MemoryError``).
    """

    _TYPES = {"<i1": "i8", "<i4": "i32", "<f4": "f32", "<f8": "f64"}

    def __init__(self) -> None:
        self.size = 0
        self.manifest: dict[str, list[Any]] = {}
        self._held: list[bytes | memoryview] = []
        self._todo: SimpleQueue[bytes | None] = SimpleQueue()
        self._done: list[bytes] = []
        self._error: BaseException | None = None
        self._worker: threading.Thread | None = None

    def add(self, name: str, array: np.ndarray, dtype: str) -> None:
        a = np.ascontiguousarray(array, dtype=np.dtype(dtype))
        pad = -self.size % 8
        if pad:
            self._held.append(b"\0" * pad)
            self.size += pad
        self.manifest[name] = [self._TYPES[dtype], self.size, int(a.size)]
        self._held.append(a.data.cast("B"))  # (copied by send(): the caller's array may change)
        self.size += a.nbytes

    def send(self) -> None:
        """Start gzipping the arrays added so far (in the worker, after those sent before)."""
        if not self._held:
            return
        if self._worker is None:
            self._worker = threading.Thread(target=self._compress, name="explorer-gzip", daemon=True)
            self._worker.start()
        part = b"".join(self._held)
        self._held.clear()
        self._todo.put(part)

    def encode(self) -> bytes:
        """The gzipped arrays, base64-encoded (ASCII): sends the rest and waits for the worker."""
        self.send()
        if self._worker is None:  # (nothing added)
            self._compress_now()
        else:
            self._todo.put(None)
            self._worker.join()
        if self._error is not None:
            raise self._error
        return base64.b64encode(b"".join(self._done))

    def close(self) -> None:
        """Let the worker go without the page (an error before :meth:`encode`)."""
        self._held.clear()
        if self._worker is not None:
            self._todo.put(None)

    def _compress_now(self) -> None:
        self._todo.put(None)
        self._compress()

    def _compress(self) -> None:
        packer = zlib.compressobj(LEVEL, zlib.DEFLATED, 31)  # gzip: DecompressionStream reads it
        while True:
            part = self._todo.get()
            if self._error is None:  # (after an error, the parts still coming are dropped)
                try:
                    self._done.append(packer.compress(part) if part is not None else packer.flush())
                except BaseException as err:  # (raised by encode(), on the caller's thread)
                    self._error = err
            if part is None:
                return
