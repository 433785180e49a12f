"""Run directories and files given as URLs (``s3://``, ``gs://``, any fsspec URL) read as local ones.

A command argument that is a URL is copied once into a temporary directory (removed at exit)
and read from there with the local readers, so a run read from a bucket gives the same numbers
as the same run read from disk. Error messages name the URL, never the temporary copy.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from memprofiler.errors import ArtifactError
from memprofiler.output.remote import RemoteDir, is_url, read_hint

__all__ = ["as_given", "is_url", "localize", "named_as_given"]

#: URL -> its local copy, for this process (a URL read twice is fetched once).
_copies: dict[str, Path] = {}


def _tempdir() -> Path:
    path = Path(tempfile.mkdtemp(prefix="memprofiler-read-"))
    atexit.register(shutil.rmtree, path, True)
    return path


def localize(arg: str | os.PathLike[str]) -> Path:
    """``arg`` as a local path: itself when local, else a local copy of the remote file or directory.

    Raises:
        ArtifactError: the URL does not exist or cannot be read (one line naming it and the fix).
    """
    text = os.fspath(arg)
    if not is_url(text):
        return Path(text)
    url = text.rstrip("/")
    if url in _copies:
        return _copies[url]
    where = RemoteDir.from_url(url, key="the argument")
    fs = where.fs
    try:
        if fs.isfile(where.root):
            local = _tempdir() / where.root.rsplit("/", 1)[-1]
            fs.get_file(where.root, str(local))
        else:
            files = fs.find(where.root)
            if not files:
                raise ArtifactError(f"{url}: no such directory or file; pass the run's save_dir URL")
            local = _tempdir() / "run"
            for remote_path in files:
                rel = str(remote_path)[len(where.root) :].lstrip("/")
                target = local / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                fs.get_file(remote_path, str(target))
    except ArtifactError:
        raise
    except Exception as err:  # botocore/aiohttp errors have no common base class
        reason = str(err).strip().splitlines()[0] if str(err).strip() else ""
        raise ArtifactError(
            f"{url}: cannot read it ({type(err).__name__}: {reason}); {read_hint(url)}"
        ) from None
    _copies[url] = local
    return local


def as_given(text: str) -> str:
    """``text`` naming each URL instead of the local copy read in its place."""
    for url, local in _copies.items():
        text = text.replace(str(local), url)
    return text


@contextlib.contextmanager
def named_as_given() -> Iterator[None]:
    """Inside it, an :class:`ArtifactError` names each URL, not the local copy read in its place."""
    try:
        yield
    except ArtifactError as err:
        message = as_given(str(err))
        if message == str(err):
            raise
        raise type(err)(message) from None  # of its kind still (report tells NoRunFilesError)
