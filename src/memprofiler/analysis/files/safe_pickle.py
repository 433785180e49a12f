"""A restricted unpickler: the only way memprofiler reads a pickle it did not just write.

Allocator snapshots and stats pickles hold only dicts, lists, tuples, strings and numbers.
``pickle.load`` on such a file from someone else would run whatever callable the file names
(``os.system`` and friends) while loading. Here every global lookup, and so every call a
pickle can make, goes through :meth:`_SafeUnpickler.find_class`, which allows only a few
builtin container types; anything else is refused before it is imported, let alone called.
"""

from __future__ import annotations

import io
import os
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, Protocol

from memprofiler.analysis.files.gc_pause import gc_paused
from memprofiler.errors import ArtifactError

#: Globals a plain-data pickle may name: protocols 0-2 build sets and frozensets by calling
#: these, which only ever produce data no larger than their input. (Python 2 spelled the
#: module ``__builtin__``; protocol-2 pickles still do.) ``bytearray`` and ``complex`` are
#: not here: ``bytearray(1_500_000_000)`` is a 33-byte pickle that allocates 1.5 GB, and no
#: snapshot or stats file holds either type.
_ALLOWED: frozenset[tuple[str, str]] = frozenset(
    (mod, name) for mod in ("builtins", "__builtin__") for name in ("set", "frozenset")
)
#: Encodings protocol 0-2 pickles use to spell ``bytes`` (``_codecs.encode(text, "latin1")``).
_BYTES_ENCODINGS = frozenset(("latin1", "latin-1"))


def _encode_bytes(text: str, encoding: str = "utf-8") -> bytes:
    """``_codecs.encode`` as protocol 0-2 pickles call it for ``bytes``, and nothing else."""
    if not isinstance(text, str) or encoding not in _BYTES_ENCODINGS:
        raise _Refused("_codecs", f"encode(..., {encoding!r})")
    return text.encode("latin-1")


class _Refused(Exception):
    def __init__(self, module: str, name: str) -> None:
        super().__init__(f"{module}.{name}")
        self.target = f"{module}.{name}"


class _SafeUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED:
            return super().find_class(module, name)
        if (module, name) == ("_codecs", "encode"):
            return _encode_bytes
        raise _Refused(module, name)

    def persistent_load(self, pid: Any) -> Any:
        # torch.save archives and other object stores use persistent ids: never data we read.
        raise _Refused("persistent_id", type(pid).__name__)


def loads(data: bytes, source: str = "<bytes>") -> Any:
    """Unpickle ``data`` allowing only builtin containers and scalars.

    Args:
        data: the pickle bytes.
        source: the file name used in error messages.

    Raises:
        ArtifactError: empty, truncated, not a pickle, or naming any callable/class outside the
            allow-list (the callable is never imported or run).

    Example:
        >>> loads(pickle.dumps({"a": [1, 2.5, "x"]}))
        {'a': [1, 2.5, 'x']}
    """
    if not data:
        raise ArtifactError(f"{source}: file is empty; re-run to write it again")
    return _load_stream(io.BytesIO(data), source)


class Watcher(Protocol):
    """A reader between the file and the unpickler that may tidy what it has built so far.

    ``read`` and ``readline`` serve the unpickler (from ``stream``); ``unpickler`` is set before
    the load starts; ``finish`` gets the loaded object and returns the result.
    """

    unpickler: Any

    def read(self, n: int = -1) -> bytes: ...

    def readline(self) -> bytes: ...

    def finish(self, obj: Any) -> Any: ...


def _load_stream(
    stream: IO[bytes], source: str, watcher: Callable[[IO[bytes]], Watcher] | None = None
) -> Any:
    # The cyclic GC would rescan the growing object graph again and again while a
    # million-entry snapshot loads; plain data has no cycles to collect.
    head = stream.read(4)
    stream.seek(0)
    if head.startswith(b"PK\x03\x04"):
        raise ArtifactError(f"{source}: is a zip archive (a torch.save checkpoint?), not a pickle snapshot")
    # Protocol 2+ pickles start with PROTO (0x80); older ones are text that a foreign file
    # can resemble, so their failures are reported as "not a pickle" rather than "truncated".
    modern = head[:1] == b"\x80"
    try:
        with gc_paused():
            if watcher is None:
                return _SafeUnpickler(stream).load()
            reader = watcher(stream)
            reader.unpickler = _SafeUnpickler(reader)
            return reader.finish(reader.unpickler.load())
    except _Refused as err:
        raise ArtifactError(
            f"{source}: refused to load: the pickle wants to import or call `{err.target}`; only "
            "plain data (dicts, lists, strings, numbers) is allowed, so this is not a memprofiler "
            "or torch allocator snapshot (or it was tampered with)"
        ) from None
    except EOFError:
        if not modern:
            raise ArtifactError(f"{source}: not a pickle file (or a truncated protocol-0/1 one)") from None
        raise ArtifactError(f"{source}: pickle is truncated (the write was cut off); re-create it") from None
    except (pickle.UnpicklingError, ValueError, TypeError, IndexError, KeyError, AttributeError) as err:
        what = str(err).splitlines()[0] if str(err) else type(err).__name__
        if "truncated" in what and modern:
            raise ArtifactError(
                f"{source}: pickle is truncated (the write was cut off); re-create it"
            ) from None
        raise ArtifactError(f"{source}: not a pickle file, or corrupted ({what})") from None
    except MemoryError:
        raise ArtifactError(f"{source}: too large to load into memory") from None
    except RecursionError:
        raise ArtifactError(f"{source}: nesting too deep to load safely") from None
    except Exception as err:  # any other failure is a bad file: one line, never a traceback
        # e.g. OverflowError from a corrupted FRAME length: the file, not our code, is at fault.
        raise ArtifactError(f"{source}: not a pickle file, or corrupted ({type(err).__name__})") from None


def load(path: str | os.PathLike[str], watcher: Callable[[IO[bytes]], Watcher] | None = None) -> Any:
    """Read and unpickle the file at ``path`` through :func:`loads` (through ``watcher`` if given).

    Raises:
        ArtifactError: the file is missing, unreadable, or rejected by :func:`loads`.

    Example:
        >>> snapshot = load("cuda_alloc_rank_0.training_step.2.end.pickle")  # doctest: +SKIP
    """
    p = Path(path)
    try:
        # Unpickle from the open file rather than a bytes copy: a 40 MB snapshot then costs
        # only the objects it holds.
        with p.open("rb") as f:
            if os.fstat(f.fileno()).st_size == 0:
                raise ArtifactError(f"{p}: file is empty; re-run to write it again")
            return _load_stream(f, str(p), watcher)
    except FileNotFoundError:
        raise ArtifactError(f"{p}: no such file") from None
    except IsADirectoryError:
        raise ArtifactError(f"{p}: is a directory, expected a .pickle file") from None
    except OSError as err:
        raise ArtifactError(f"{p}: cannot read ({err.strerror or err})") from None
