"""The explorer page's data blob: gzipped in a worker thread, the bytes those of one thread.

The page must not change by a byte: the blob is held to the encoding it had before the worker
(one ``compressobj`` fed each array's bytes, and its padding, in order, on the caller's
thread), and the page of the real capture to the page built without freeing the snapshot.
"""

from __future__ import annotations

import base64
import gzip
import threading
import zlib
from pathlib import Path

import numpy as np
import pytest

from memprofiler.analysis.snapshot.release import release
from memprofiler.analysis.snapshot.summary import analyze, load_snapshot
from memprofiler.reporters.explorer import blob as blob_module
from memprofiler.reporters.explorer.blob import Blob
from memprofiler.reporters.explorer.page import build_explorer, start_explorer

REAL = Path(__file__).parents[1] / "fixtures" / "gpu_transformer_forward_mixed.pickle"
DTYPES = ("<i1", "<i4", "<f4", "<f8")


def one_thread(arrays: list[tuple[str, np.ndarray, str]]) -> tuple[bytes, dict[str, list[object]]]:
    """The encoding as it was: each part compressed in turn on this thread, then flushed."""
    parts, size, manifest = [], 0, {}
    for name, array, dtype in arrays:
        a = np.ascontiguousarray(array, dtype=np.dtype(dtype))
        if size % 8:
            parts.append(b"\0" * (-size % 8))
            size += -size % 8
        manifest[name] = [Blob._TYPES[dtype], size, int(a.size)]
        parts.append(a.tobytes())
        size += a.nbytes
    packer = zlib.compressobj(1, zlib.DEFLATED, 31)
    body = b"".join(packer.compress(p) for p in parts) + packer.flush()
    return base64.b64encode(body), manifest


def random_arrays(seed: int, count: int) -> list[tuple[str, np.ndarray, str]]:
    rng = np.random.default_rng(seed)
    out = []
    for k in range(count):
        dtype = DTYPES[int(rng.integers(len(DTYPES)))]
        n = int(rng.integers(0, 200_000))
        # runs and noise, as the page's columns hold (sorted starts, repeated stacks, sizes)
        values = np.repeat(rng.integers(0, 100, size=n // 50 + 1), 50)[:n] + (rng.random(n) < 0.1)
        out.append((f"a{k}", values, dtype))
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_blob_is_byte_for_byte_the_one_thread_encoding_wherever_it_is_sent(seed):
    # GIVEN arrays of every type and odd lengths (padding between them)
    arrays = random_arrays(seed, 9)
    want, manifest = one_thread(arrays)
    for sends in ([], [0], [2, 5], list(range(9))):
        # WHEN they are added, sent to the worker after those in `sends`, and encoded
        blob = Blob()
        for k, (name, array, dtype) in enumerate(arrays):
            blob.add(name, array, dtype)
            if k in sends:
                blob.send()
        # THEN the bytes and the manifest are those of the one-thread encoding
        assert blob.encode() == want
        assert blob.manifest == manifest
    # and the bytes are the arrays' own
    raw = gzip.decompress(base64.b64decode(want))
    for name, array, dtype in arrays:
        _, offset, n = manifest[name]
        assert np.array_equal(np.frombuffer(raw, np.dtype(dtype), n, offset), array.astype(dtype))


def test_an_empty_blob_is_an_empty_gzip():
    assert gzip.decompress(base64.b64decode(Blob().encode())) == b""


def test_an_error_in_the_worker_is_raised_by_encode(monkeypatch):
    # GIVEN a compressor that runs out of memory on the second part
    class Failing:
        def __init__(self):
            self.calls = 0

        def compress(self, part):
            self.calls += 1
            if self.calls == 2:
                raise MemoryError("no room")
            return b""

        def flush(self):
            return b""

    monkeypatch.setattr(blob_module.zlib, "compressobj", lambda *args: Failing())
    blob = Blob()
    for k in range(3):
        blob.add(f"a{k}", np.arange(10), "<i4")
        blob.send()
    # WHEN the page waits for it, THEN the worker's error is raised on the caller's thread
    with pytest.raises(MemoryError, match="no room"):
        blob.encode()


def test_a_blob_closed_before_encoding_lets_its_worker_go():
    before = set(threading.enumerate())
    blob = Blob()
    blob.add("a", np.arange(1000), "<f8")
    blob.send()
    (worker,) = [t for t in set(threading.enumerate()) - before if t.name == "explorer-gzip"]
    blob.close()
    worker.join(timeout=10)
    assert not worker.is_alive()


def test_the_page_is_the_same_when_the_snapshot_is_freed_while_it_is_gzipped():
    # GIVEN the real capture's page built as the run report builds it (nothing freed)
    want = build_explorer(load_snapshot(REAL), "real.pickle", analyze(load_snapshot(REAL)), 5)
    # WHEN it is built as the snapshot command builds it: started, the snapshot emptied, finished
    data = load_snapshot(REAL)
    finish = start_explorer(data, "real.pickle", analyze(data), 5)
    entries = len(data["device_traces"][0])
    release(data)
    # THEN the snapshot's traces are empty and the page is byte for byte the same
    assert entries == 5_992
    assert all(t == [] for t in data["device_traces"])
    assert finish().decode() == want


def test_a_summary_holding_the_mark_of_the_data_leaves_the_page_whole(monkeypatch):
    # GIVEN summary tables that show the mark of the data's place (a frame named so, in a
    # crafted file: JSON escapes its NULs, the tables' HTML does not)
    from memprofiler.reporters.explorer import page

    monkeypatch.setattr(page, "snapshot_html", lambda *args: f"<td>odd{page._DATA}name</td>")
    data = load_snapshot(REAL)
    # WHEN its page is built
    html = build_explorer(data, "real.pickle", analyze(data), 5)
    # THEN the name is shown as it is, and the data is whole in its own element
    head, _, rest = html.partition("<script type='application/octet-stream' id='mp-data'>")
    assert f"<td>odd{page._DATA}name</td>" in head
    blob, _, tail = rest.partition("</script>")
    assert page._DATA not in blob + tail
    assert len(gzip.decompress(base64.b64decode(blob, validate=True))) > 100_000


def test_a_trace_the_replay_cannot_read_is_refused_after_its_blocks_were_sent_and_the_worker_goes():
    # GIVEN a trace the analysis reads but whose second allocation's stream is no integer (read
    # by the replay only, after the device's blocks are handed to the gzip worker)
    from memprofiler.errors import ArtifactError

    frames = [{"name": "f", "filename": "/home/u/train.py", "line": 1}]
    trace = [
        {"action": "alloc", "addr": 0, "size": 8, "stream": 0, "time_us": 1, "frames": frames},
        {"action": "alloc", "addr": 64, "size": 8, "stream": "x", "time_us": 2, "frames": frames},
    ]
    data = {"segments": [], "device_traces": [trace]}
    before = {t for t in threading.enumerate() if t.name == "explorer-gzip"}
    # WHEN its page is built, THEN one line names the file, and no gzip worker is left waiting
    with pytest.raises(
        ArtifactError, match=r"^s\.pickle: malformed allocator snapshot \(missing or bad field"
    ):
        build_explorer(data, "s.pickle", analyze(data, "s.pickle"))
    for worker in {t for t in threading.enumerate() if t.name == "explorer-gzip"} - before:
        worker.join(timeout=10)
        assert not worker.is_alive()
