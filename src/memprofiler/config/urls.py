"""Checks on a directory given as text, before anything is written: a URL that is almost right
(``s3:/bucket/run``, ``s3:``, ``s3:///x``, a bucket name that cannot exist) is refused with one
line naming the key and the fix, instead of becoming a local folder named ``s3:``.

Torch-free and fsspec-free. Each directory is checked once, where it enters: ``save_dir`` when
a config is built, the profiler's own ``save_dir`` argument when it is built, Lightning's
``default_root_dir`` when the callback derives its default from it.
"""

from __future__ import annotations

import os
import re

from memprofiler.errors import ConfigError

#: Storage protocols a directory may name. Only these are checked for a missing ``//``: a local
#: folder may have a colon in its name (``exp:1``), a Windows drive has a one-letter one.
STORAGE_PROTOCOLS = frozenset(
    [
        "s3",
        "s3a",
        "gs",
        "gcs",
        "abfs",
        "abfss",
        "az",
        "adl",
        "hdfs",
        "webhdfs",
        "oss",
        "oci",
        "ocilake",
        "tos",
        "tosfs",
        "dbfs",
        "lakefs",
        "hf",
        "sftp",
        "ssh",
        "ftp",
        "smb",
        "webdav",
        "http",
        "https",
        "memory",
        "file",
        "local",
    ]
)
#: Protocols whose first path segment is a bucket or container that must be named.
_BUCKETED = frozenset(["s3", "s3a", "gs", "gcs", "abfs", "abfss", "az", "adl", "oss", "tos", "tosfs"])
#: Stores that live in this process only: what is written there is gone when it exits.
IN_PROCESS = frozenset({"memory"})

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):(.*)$", re.DOTALL)
_S3_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_GS_BUCKET = re.compile(r"^[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]$")
_IP = re.compile(r"^\d+\.\d+\.\d+\.\d+$")


def protocol(value: str | os.PathLike[str]) -> str | None:
    """The storage protocol ``value`` names (``s3`` for ``s3://b/r`` and for ``s3:/b/r``), lower case."""
    match = _SCHEME.match(os.fspath(value))
    if match is None or match.group(1).lower() not in STORAGE_PROTOCOLS:
        return None
    return match.group(1).lower()


def check_dir(value: str | os.PathLike[str], key: str) -> None:
    """Refuse a directory that looks like a storage URL but is not a usable one.

    Args:
        value: the directory as the user gave it (a path or a URL).
        key: the config key or option that holds it, for the message.

    Raises:
        ConfigError: one line naming ``key``, the value and the fix.

    Example:
        >>> check_dir("s3:/bucket/run", "save_dir")
        Traceback (most recent call last):
        ...
        memprofiler.errors.ConfigError: `save_dir`: 's3:/bucket/run' is not a valid s3 URL (it would be a local folder named 's3:'); write 's3://bucket/run'
    """
    text = os.fspath(value)
    proto = protocol(text)
    if proto is None:
        return
    rest = text.split(":", 1)[1]
    if not rest.startswith("//"):
        target = rest.lstrip("/")
        if not target:
            raise ConfigError(key, f"{text!r} names no location; write '{proto}://BUCKET/PATH'")
        raise ConfigError(
            key,
            f"{text!r} is not a valid {proto} URL (it would be a local folder named '{text.split(':', 1)[0]}:'); "
            + (f"write {rest!r}" if proto in ("file", "local") else f"write '{proto}://{target}'"),
        )
    path = rest[2:]
    if proto not in _BUCKETED:
        return
    bucket, _, inside = path.partition("/")
    if not bucket:
        where = (
            f"'{proto}://BUCKET/{inside.lstrip('/')}'" if inside.strip("/") else f"'{proto}://BUCKET/PATH'"
        )
        raise ConfigError(
            key, f"{text!r} names no bucket (nothing between '{proto}://' and '/'); write {where}"
        )
    rule = bucket_rule(proto, bucket)
    if rule is not None:
        raise ConfigError(key, f"bucket {bucket!r} in {text!r} cannot exist ({rule}); fix the bucket name")


def bucket_rule(proto: str, bucket: str) -> str | None:
    """The naming rule ``bucket`` breaks on ``proto``'s store, or ``None`` when it may exist."""
    if proto in ("s3", "s3a"):
        if bucket.startswith("arn:"):  # an access point ARN: s3fs resolves it
            return None
        ok = _S3_BUCKET.match(bucket) and ".." not in bucket and not _IP.match(bucket)
        rule = "S3 bucket names are 3-63 lowercase letters, digits, dots and hyphens, starting and ending with a letter or digit"
        return None if ok else rule
    if proto in ("gs", "gcs"):
        ok = (
            _GS_BUCKET.match(bucket)
            and all(0 < len(p) <= 63 for p in bucket.split("."))
            and not _IP.match(bucket)
        )
        rule = "GCS bucket names are 3-63 lowercase letters, digits, dots, hyphens and underscores, starting and ending with a letter or digit"
        return None if ok else rule
    return None


def in_process(value: str | os.PathLike[str]) -> bool:
    """Whether ``value`` is a store that does not outlive this process (``memory://``)."""
    return protocol(value) in IN_PROCESS


def in_process_message(value: str | os.PathLike[str], when: str = "when this process exits") -> str:
    """Why an in-process store keeps nothing (gone ``when``), and what to use instead."""
    return (
        f"{os.fspath(value)!r} is fsspec's in-process memory store: whatever is written there is gone "
        f"{when}; give a local directory or an object store (s3://, gs://, abfs://)"
    )
