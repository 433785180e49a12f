"""Files the profiler may have gzipped (``trace_files.use_gzip``), read alike either way.

A file is taken as gzip by its first two bytes, not its name, so every reader of profiler
output (the report's trace views, memory categories, ``merge-traces``) agrees on a renamed one.
"""

from __future__ import annotations

import gzip
import os
from typing import IO

#: The first two bytes of every gzip file.
GZIP_MAGIC = b"\x1f\x8b"


def open_maybe_gzip(path: str | os.PathLike[str]) -> IO[bytes]:
    """``path`` opened for reading its bytes, decompressed when it is gzip (for streaming)."""
    with open(path, "rb") as raw:
        gz = raw.read(2) == GZIP_MAGIC
    if gz:
        return gzip.open(path, "rb")  # type: ignore[return-value]  # a GzipFile reads bytes
    return open(path, "rb")


def read_maybe_gzip(path: str | os.PathLike[str]) -> bytes:
    """The whole content of ``path``, decompressed when it is gzip.

    Raises:
        OSError, EOFError: unreadable, or a gzip file that is corrupt or cut short.
    """
    with open(path, "rb") as f:
        raw = f.read()
    return gzip.decompress(raw) if raw[:2] == GZIP_MAGIC else raw


def read_at_most(path: str | os.PathLike[str], limit: int) -> bytes:
    """The content of ``path``, decompressed when it is gzip, but at most ``limit + 1`` bytes
    (read as a stream: a gzip bomb stops there); longer than ``limit`` means past it.

    Raises:
        OSError, EOFError: unreadable, or a gzip file that is corrupt or cut short.
    """
    with open_maybe_gzip(path) as f:
        return f.read(limit + 1)
