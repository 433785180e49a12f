"""A ``save_dir`` on object storage (``s3://``, ``gs://``, ``abfs://``, ``hdfs://``) through fsspec.

Each file goes to the store as one whole object (a single PUT, atomic on object stores), never
appended to in place. The run directory is claimed with a conditional create of its manifest
where the filesystem supports one (S3's ``If-None-Match``); elsewhere the claim is a check then
a write, which two jobs starting in the same second could both pass (see docs/guides/cluster.md). The
protocol's own package (``s3fs``, ``gcsfs``, ``adlfs``) is imported only for a remote
``save_dir``, so the core imports without any of them.
"""

from __future__ import annotations

import contextlib
import fnmatch
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memprofiler import layout
from memprofiler.errors import ArtifactError

#: Protocols fsspec resolves to the local disk: those keep today's local writers.
_LOCAL = ("file", "local")

_PER_RANK_GLOBS = tuple(
    p.replace("{rank}", "*")
    for p in (layout.MEMORY_STATS_YAML, layout.MEMORY_STATS_PICKLE, layout.MEMORY_TRACE_JSON)
)


def is_url(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` names a remote location (``proto://...`` other than ``file://``)."""
    text = os.fspath(path)
    if "://" not in text:
        return False
    return text.split("://", 1)[0].lower() not in _LOCAL


def local_path(path: str | os.PathLike[str]) -> Path:
    """A local ``save_dir`` as a path: ``~`` expanded, a ``file://`` prefix dropped."""
    text = os.fspath(path)
    for prefix in ("file://", "local://"):
        if text.startswith(prefix):
            text = text[len(prefix) :]
    return Path(text).expanduser()


def fix_hint(url: str, action: str = "writing") -> str:
    """The usual fix for a store that refuses us, per protocol."""
    proto = url.split("://", 1)[0].lower()
    if proto in ("s3", "s3a"):
        return (
            "check the bucket exists and that AWS credentials (AWS_ACCESS_KEY_ID / AWS_PROFILE, "
            f"AWS_ENDPOINT_URL for S3-compatible stores) allow {action} there"
        )
    if proto in ("gs", "gcs"):
        return f"check the bucket exists and GOOGLE_APPLICATION_CREDENTIALS allows {action} there"
    if proto in ("abfs", "abfss", "az"):
        return f"check the container exists and AZURE_STORAGE_* credentials allow {action} there"
    return f"check the location exists and the credentials allow {action} there"


def read_hint(url: str) -> str:
    return fix_hint(url, "reading")


def list_hint(url: str) -> str:
    """The permission that lets the credentials list a directory, per protocol."""
    proto = url.split("://", 1)[0].lower()
    if proto in ("s3", "s3a"):
        return (
            "allow `s3:ListBucket` on the bucket to these credentials, or choose a `save_dir` they may list"
        )
    if proto in ("gs", "gcs"):
        return "grant `storage.objects.list` on the bucket to these credentials, or choose a `save_dir` they may list"
    return "allow these credentials to list the location, or choose one they may list"


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0]}" if text else type(err).__name__


@dataclass(frozen=True)
class RemoteDir:
    """A directory on an fsspec filesystem: ``fs`` and the path inside it, plus the URL asked for.

    Example:
        >>> run = RemoteDir.from_url("s3://bucket/run")  # doctest: +SKIP
        >>> run.put("memprofiler_run.yaml", b"...")
    """

    url: str
    fs: Any
    root: str
    #: The config key or option that named this directory, for messages.
    key: str = "save_dir"

    @classmethod
    def from_url(cls, url: str, key: str = "save_dir") -> RemoteDir:
        """Resolve ``url`` with ``fsspec.core.url_to_fs``.

        Raises:
            ArtifactError: fsspec lacks the protocol's package (``pip install s3fs``) or the URL is bad.
        """
        try:
            from fsspec.core import url_to_fs

            fs, root = url_to_fs(url)
        except ImportError as err:
            raise ArtifactError(
                f"`{key}` {url!r} needs a package fsspec could not import ({err}); "
                "install it (e.g. `pip install s3fs` for s3://, `gcsfs` for gs://, `adlfs` for abfs://)"
            ) from None
        except (ValueError, TypeError) as err:
            raise ArtifactError(f"`{key}` {url!r} is not a URL fsspec understands ({err})") from None
        return cls(url=url.rstrip("/"), fs=fs, root=str(root).rstrip("/"), key=key)

    def child(self, name: str) -> RemoteDir:
        return RemoteDir(url=f"{self.url}/{name}", fs=self.fs, root=f"{self.root}/{name}", key=self.key)

    def path(self, name: str) -> str:
        return f"{self.root}/{name}"

    def put(self, name: str, data: bytes) -> None:
        """Write ``name`` as one whole object (overwrites)."""
        self.fs.pipe_file(self.path(name), data)

    def create(self, name: str, data: bytes) -> bool:
        """Create ``name`` only if absent; ``False`` when it exists.

        Uses the filesystem's exclusive create where it has one; elsewhere a check then a write.
        """
        path = self.path(name)
        try:
            self.fs.pipe_file(path, data, mode="create")
        except FileExistsError:
            return False
        except (TypeError, NotImplementedError, ValueError):  # no exclusive create here
            if self.fs.exists(path):
                return False
            self.fs.pipe_file(path, data)
        return True

    def names(self) -> list[str]:
        """Base names directly under this directory; empty when it does not exist.

        Raises:
            ArtifactError: the credentials may not list it (one line naming the key and the fix).
        """
        try:
            try:
                entries = self.fs.ls(self.root, detail=False, refresh=True)
            except TypeError:  # filesystems without a listing cache take no `refresh`
                entries = self.fs.ls(self.root, detail=False)
        except FileNotFoundError:
            return []
        except PermissionError as err:
            raise ArtifactError(
                f"`{self.key}` {self.url!r} can be written but not listed ({_first_line(err)}); memprofiler "
                f"lists it to find a run directory no other run holds: {list_hint(self.url)}"
            ) from None
        return [str(e).rstrip("/").rsplit("/", 1)[-1] for e in entries]


def holds_run(run: RemoteDir, rank: int | None = None) -> bool:
    """Whether ``run`` itself holds a run's files (``rank``: only that rank's own files count)."""
    names = run.names()
    if rank is not None:
        own = {
            p.format(rank=rank)
            for p in (layout.MEMORY_STATS_YAML, layout.MEMORY_STATS_PICKLE, layout.MEMORY_TRACE_JSON)
        }
        return any(n in own for n in names)
    if layout.RUN_MANIFEST in names:
        return True
    return any(fnmatch.fnmatch(n, g) for n in names for g in _PER_RANK_GLOBS)


def check_writable(run: RemoteDir, key: str = "save_dir") -> None:
    """Prove an object can be written (and removed) under ``run``: bucket, credentials, permission.

    Raises:
        ArtifactError: one line naming the key, the URL, what failed and the fix.
    """
    probe = f".memprofiler-write-test-{os.getpid()}"
    try:
        run.put(probe, b"\0" * 1024)
    except Exception as err:  # botocore/aiohttp errors: no shared base class to name
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ArtifactError(
            f"`{key}` {run.url!r} is not writable ({type(err).__name__}: {reason}); {fix_hint(run.url)}"
        ) from None
    # A store that lets us write but not delete still holds the run; the probe is tiny.
    with contextlib.suppress(Exception):
        run.fs.rm_file(run.path(probe))


def candidates(requested: RemoteDir) -> list[RemoteDir]:
    """``requested`` and its ``version_{n}`` subdirectories that exist, plus the next free one."""
    names = set(requested.names())
    out = [requested]
    n = 1
    while layout.RUN_VERSION_DIR.format(n=n) in names:
        out.append(requested.child(layout.RUN_VERSION_DIR.format(n=n)))
        n += 1
    out.append(requested.child(layout.RUN_VERSION_DIR.format(n=n)))
    return out


def claim(requested: RemoteDir, manifest_yaml: bytes) -> RemoteDir:
    """Rank 0: the first candidate that holds no run, claimed by creating its manifest.

    Raises:
        ArtifactError: the store refuses writes under ``requested``.
    """
    check_writable(requested, requested.key)
    run, n = requested, 1
    while holds_run(run) or not run.create(layout.RUN_MANIFEST, manifest_yaml):
        run, n = requested.child(layout.RUN_VERSION_DIR.format(n=n)), n + 1
    return run


def follow(requested: RemoteDir, rank: int) -> RemoteDir:
    """A rank that cannot ask rank 0: the first candidate without this rank's own files."""
    check_writable(requested)
    for run in candidates(requested):
        if not holds_run(run, rank=rank):
            return run
    raise AssertionError("unreachable")  # the last candidate is always empty


def staged(target: str, local: Path) -> Path:
    """Where to write a file bound for ``target``: ``local`` itself, or a fresh local staging
    directory when ``target`` is a URL (:func:`publish` then uploads from it)."""
    if not is_url(target):
        return local
    import tempfile

    return Path(tempfile.mkdtemp(prefix="memprofiler-stage-"))


def publish(path: Path, target: str, key: str) -> str:
    """Upload ``path`` (written under :func:`staged`) to the URL ``target`` as one whole object;
    a local ``target`` is left as is. Returns where the file now is.

    Raises:
        ArtifactError: the store refuses it (one line naming ``key``, the URL and the fix).
    """
    if not is_url(target):
        return str(path)
    where = RemoteDir.from_url(target, key=key)
    check_writable(where, key)
    where.put(path.name, path.read_bytes())
    return f"{where.url}/{path.name}"
