"""RemoteMirror's upload thread: it ends when idle, and a later request starts another."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from memprofiler.output.mirror import RemoteMirror
from memprofiler.output.remote import RemoteDir


def _mirror_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "memprofiler-remote"]


def test_the_upload_thread_ends_when_idle_and_the_next_request_is_still_served(tmp_path: Path):
    # GIVEN a staging directory mirrored to an in-memory store, and a thread that ends after 0.2 s idle
    before = set(_mirror_threads())
    remote = RemoteDir.from_url("memory://mirror-idle/run")
    mirror = RemoteMirror(
        tmp_path, remote, warn=lambda m: pytest.fail(m), min_interval_s=0.0, idle_exit_s=0.2
    )
    (tmp_path / "a.yaml").write_text("a: 1\n")
    # WHEN a file is uploaded and the mirror then has nothing to do
    assert mirror.sync(wait=True)
    deadline = time.monotonic() + 10
    while set(_mirror_threads()) - before and time.monotonic() < deadline:
        time.sleep(0.05)
    # THEN its thread is gone (a finished run leaves none behind) ...
    assert not set(_mirror_threads()) - before
    # ... and a later change is uploaded by a new one, each file the bytes written
    (tmp_path / "b.yaml").write_text("b: 2\n")
    assert mirror.sync(wait=True)
    assert remote.fs.cat_file(remote.path("a.yaml")) == b"a: 1\n"
    assert remote.fs.cat_file(remote.path("b.yaml")) == b"b: 2\n"
    assert mirror.puts == 2 and mirror.failures == 0


def test_requests_racing_the_idle_end_are_never_lost(tmp_path: Path):
    # GIVEN a mirror whose thread ends as soon as it is idle
    remote = RemoteDir.from_url("memory://mirror-race/run")
    mirror = RemoteMirror(
        tmp_path, remote, warn=lambda m: pytest.fail(m), min_interval_s=0.0, idle_exit_s=0.001
    )
    # WHEN requests come at the moments the thread ends, over and over
    for n in range(200):
        (tmp_path / f"f{n % 5}.txt").write_text(str(n))
        assert mirror.sync(wait=n % 2 == 0)
        if n % 7 == 0:
            time.sleep(0.002)
    # THEN a final request is served within the usual wait, with every file's newest bytes
    assert mirror.sync(wait=True)
    for k in range(5):
        newest = max(n for n in range(200) if n % 5 == k)
        assert remote.fs.cat_file(remote.path(f"f{k}.txt")) == str(newest).encode()
