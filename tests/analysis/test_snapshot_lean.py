"""Loading with one frame list per distinct stack gives the same data as a plain load.

Fixtures: the real GPU capture (``tests/fixtures/gpu_transformer_forward_mixed.pickle``, see
the README there), whose frees share one frame list between their two entries, and a
synthetic trace written at pickle protocols 4 and 5.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from memprofiler.analysis.files import safe_pickle
from memprofiler.analysis.snapshot import lean as snapshot_lean
from memprofiler.analysis.snapshot.lean import FrameSharer
from memprofiler.analysis.snapshot.summary import analyze

REAL = Path(__file__).parents[1] / "fixtures" / "gpu_transformer_forward_mixed.pickle"


def synthetic() -> dict:
    frames = [{"name": f"f{k}", "filename": f"/home/u/m{k % 3}.py", "line": k} for k in range(12)]
    stacks = [frames[k : k + 6] for k in range(6)]
    trace = []
    for i in range(3000):
        addr = 4096 * (i % 50)
        alloc = list(stacks[i % 6])
        free = list(stacks[(i + 3) % 6])  # one list for both free entries, as torch writes
        trace.append({"action": "alloc", "addr": addr, "size": 512 + i, "stream": 0, "frames": alloc})
        trace.append({"action": "free_requested", "addr": addr, "size": 512 + i, "stream": 0, "frames": free})
        trace.append({"action": "free_completed", "addr": addr, "size": 512 + i, "stream": 0, "frames": free})
    return {"segments": [], "device_traces": [trace]}


@pytest.mark.parametrize("every", [1, 64])
@pytest.mark.parametrize("protocol", [4, 5])
def test_shared_frame_lists_load_equal_to_a_plain_load(tmp_path, monkeypatch, every, protocol):
    # GIVEN a trace with a fresh frame list per entry, pickled at protocol 4 or 5
    path = tmp_path / "trace.pickle"
    path.write_bytes(pickle.dumps(synthetic(), protocol=protocol))
    monkeypatch.setattr(snapshot_lean, "_EVERY", every)
    # WHEN it loads through the sharer (visiting every read, or only at the end)
    lean = safe_pickle.load(path, FrameSharer)
    plain = safe_pickle.load(path)
    # THEN every entry equals the plain load's, and the entries hold one list per stack
    assert lean == plain
    lists = {id(e["frames"]) for e in lean["device_traces"][0]}
    assert len(lists) == 6
    assert analyze(lean).devices[0].peak_allocated == analyze(plain).devices[0].peak_allocated


def test_real_capture_loads_equal_with_shared_frame_lists(monkeypatch):
    monkeypatch.setattr(snapshot_lean, "_EVERY", 1)
    lean = safe_pickle.load(REAL, FrameSharer)
    plain = safe_pickle.load(REAL)
    assert lean == plain
    a, b = analyze(lean), analyze(plain)
    assert a.devices[0].peak_allocated == b.devices[0].peak_allocated
    assert [g.bytes for g in a.devices[0].top_stacks] == [g.bytes for g in b.devices[0].top_stacks]
    assert [g.frames for g in a.devices[0].top_stacks] == [g.frames for g in b.devices[0].top_stacks]
    # the real capture's 4,117 frame lists (2,703 allocations, 1,414 frees) become one per stack
    traced = {id(e["frames"]) for e in lean["device_traces"][0]}
    assert len(traced) < len({id(e["frames"]) for e in plain["device_traces"][0]})


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_load_snapshot_shares_lists_of_large_framed_pickles_only(tmp_path, monkeypatch, protocol):
    # GIVEN any file counting as large
    from memprofiler.analysis.snapshot import summary as snapshot

    monkeypatch.setattr(snapshot, "LEAN_BYTES", 0)
    path = tmp_path / "trace.pickle"
    path.write_bytes(pickle.dumps(synthetic(), protocol=protocol))
    # WHEN load_snapshot reads it
    data = snapshot.load_snapshot(path)
    # THEN protocols 4-5 (framed) share one list per stack, older ones load as they are
    lists = {id(e["frames"]) for e in data["device_traces"][0]}
    assert data == safe_pickle.load(path)
    assert (len(lists) == 6) == (protocol >= 4)
