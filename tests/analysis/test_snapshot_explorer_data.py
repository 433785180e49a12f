"""The explorer's replay and frames against the terminal analysis and an independent replay.

Fixtures: the real GPU capture (``tests/fixtures/gpu_transformer_forward_mixed.pickle``, see
the README there) and the hand-built snapshots of ``snapshot_fixtures`` with known answers.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from memprofiler.analysis.snapshot import frames as sf
from memprofiler.analysis.snapshot.lod import level_of_detail
from memprofiler.analysis.snapshot.replay import StackTable, replay
from memprofiler.analysis.snapshot.summary import analyze, load_snapshot
from snapshot_fixtures import KNOWN, known_snapshot, rounded_snapshot, trace_only_snapshot

REAL = Path(__file__).parents[1] / "fixtures" / "gpu_transformer_forward_mixed.pickle"
GiB = 1024**3


def real_snapshot():
    return load_snapshot(REAL)


def independent_replay(data, dev):
    """Straight from the trace's meaning, entry by entry: live blocks by address, total after each entry."""
    live = {}
    pre = []
    trace = data["device_traces"][dev] if dev < len(data["device_traces"]) else []
    allocated = {e["addr"] for e in trace if e["action"] == "alloc"}
    for seg in data["segments"]:
        if seg.get("device", 0) == dev:
            for blk in seg["blocks"]:
                if blk["state"] != "inactive" and blk["address"] not in allocated:
                    pre.append((blk["requested_size"], blk["frames"]))
    # blocks freed by the trace without being allocated in it were live from the start
    opened = set()
    for e in trace:
        if e["action"] == "alloc":
            opened.add(e["addr"])
        elif e["action"] == "free_completed" and e["addr"] not in opened:
            live[("pre", e["addr"])] = (e["size"], e["frames"])
    for k, p in enumerate(pre):
        live[("end", k)] = p
    totals, best, best_live = [], sum(s for s, _ in live.values()), dict(live)
    best_i = -1
    for i, e in enumerate(trace):
        if e["action"] == "alloc":
            live[e["addr"]] = (e["size"], e["frames"])
        elif e["action"] == "free_completed":
            if e["addr"] in live:
                del live[e["addr"]]
            else:
                del live[("pre", e["addr"])]
        total = sum(s for s, _ in live.values())
        totals.append(total)
        if total > best:
            best, best_i, best_live = total, i, dict(live)
    return best, best_i, best_live, totals


def _stack_bytes(table, rep, t):
    """Per analysis stack key, the bytes the explorer's replay has live at instant ``t``."""
    from memprofiler.analysis.snapshot.summary import _format_frames

    out = Counter()
    for i in rep.live_at(t):
        sid = int(rep.stack[i])
        frames = [
            {
                "name": table.strings[table.frames[f][0]],
                "filename": table.strings[table.frames[f][1]],
                "line": table.frames[f][2],
            }
            for f in table.stacks[sid]
        ]
        out[_format_frames(frames) or ("(no stack recorded)",)] += int(rep.size[i])
    return out


@pytest.mark.parametrize("make", [real_snapshot, known_snapshot, rounded_snapshot, trace_only_snapshot])
def test_replay_peak_live_set_and_stacks_equal_analysis_and_independent_replay(make):
    # GIVEN a snapshot, its terminal analysis and a naive replay written from the trace's meaning
    data = make()
    analysis = analyze(data, top=10_000)
    table = StackTable()
    reps = {r.device: r for r in replay(data, table)}
    for dev in analysis.devices:
        rep = reps[dev.device]
        best, best_i, best_live, totals = independent_replay(data, dev.device)
        active = rep.active()
        # THEN the peak and where it is agree three ways
        assert int(active.max()) == dev.peak_allocated == best
        if best_i >= 0:
            assert int(np.argmax(active)) == dev.peak_allocated_index == best_i
            assert active.tolist() == totals
        # the live set at the peak: same block count and bytes
        t = max(dev.peak_allocated_index, 0)
        live = rep.live_at(t)
        assert len(live) == dev.live_blocks_at_peak == len(best_live)
        assert int(rep.size[live].sum()) == sum(s for s, _ in best_live.values())
        # per-stack bytes equal the analysis's groups
        assert _stack_bytes(table, rep, t) == Counter({g.frames: g.bytes for g in dev.top_stacks})
        assert int(rep.reserved().max()) == dev.peak_reserved


def test_known_snapshot_blocks_have_the_hand_worked_lifetimes():
    table = StackTable()
    (rep,) = replay(known_snapshot(), table)
    assert int(rep.active()[KNOWN["peak_index"]]) == KNOWN["peak_allocated"]
    # 3 allocs, 1 pre-trace free, 2 pre-trace blocks alive at the end
    assert sorted(zip(rep.start.tolist(), rep.end.tolist(), rep.size.tolist(), strict=False)) == [
        (-1, 4, 128 * 1024),
        (-1, 12, 256 * 1024),
        (-1, 12, 512 * 1024),
        (1, 7, 256 * 1024),
        (2, 8, 256 * 1024),
        (5, 12, 1024 * 1024),
    ]
    assert sorted(zip(rep.seg_start.tolist(), rep.seg_end.tolist(), strict=False)) == [
        (-1, 12),
        (-1, 12),
        (0, 12),
        (10, 11),
    ]


def test_level_of_detail_band_holds_every_byte_not_drawn():
    # GIVEN the real capture and its level of detail
    data = real_snapshot()
    (rep,) = replay(data, StackTable())
    active = rep.active()
    lod = level_of_detail(rep, int(active.max()))
    for lv in range(len(lod.offsets) - 1):
        band = lod.band[lod.offsets[lv] : lod.offsets[lv + 1]]
        width = 1 << lv
        # WHEN the drawn blocks are added to the band at each bucket's first instant
        for k in range(0, len(band), max(1, len(band) // 50)):
            t = k * width
            if t >= rep.instants:
                continue
            live = rep.live_at(t)
            drawn = int(rep.size[live][lod.level[live] >= lv].sum())
            # THEN band (the bucket's maximum) + drawn is at least the true total, and exact at level 0
            assert band[k] + drawn >= active[t] * (1 - 1e-6)
            if lv == 0:
                assert band[k] + drawn == pytest.approx(active[t], rel=1e-6)


def test_real_capture_frames_are_readable():
    # GIVEN the real capture's stacks (unwinder, allocator and interpreter frames around Python ones)
    table = StackTable()
    replay(real_snapshot(), table)
    labels = Counter()
    for sid, label in enumerate(table.labels):
        if label >= 0:
            name, file, line, kind = table.frames[label]
            labels[(table.strings[name], Path(table.strings[file]).name, line)] += 1
            # THEN every labelled stack is labelled by the user's own code, never torch or the unwinder
            assert kind & sf.USER, (sid, table.strings[name])
    assert labels[("forward", "transformer.py", 22)] >= 1
    names = {table.strings[n]: k for n, _, _, k in table.frames}
    assert names["torch::unwind::unwind()"] & sf.INTERNAL
    assert names["_PyEval_EvalFrameDefault"] & sf.INTERNAL
    assert (
        names[
            next(
                n
                for n in names
                if n.startswith("c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc")
            )
        ]
        & sf.INTERNAL
    )
    assert not names[next(n for n in names if n.startswith("at::native::einsum"))] & sf.INTERNAL


CPP_ONLY = [
    {"name": "torch::unwind::unwind()", "filename": "??", "line": 0},
    {"name": "torch::CapturedTraceback::gather(bool, bool, bool)", "filename": "??", "line": 0},
    {
        "name": "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc"
        "(signed char, unsigned long, CUstream_st*)",
        "filename": "CUDACachingAllocator.cpp",
        "line": 0,
    },
    {"name": "at::detail::empty_generic(c10::ArrayRef<long>, c10::Allocator*)", "filename": "??", "line": 0},
    {"name": "at::_ops::mm::call(at::Tensor const&, at::Tensor const&)", "filename": "??", "line": 0},
    {
        "name": "torch::autograd::generated::MmBackward0::apply(std::vector<at::Tensor>&&)",
        "filename": "Functions.cpp",
        "line": 0,
    },
    {
        "name": "torch::autograd::Engine::evaluate_function(std::shared_ptr<torch::autograd::GraphTask>&)",
        "filename": "engine.cpp",
        "line": 0,
    },
]


def test_cpp_only_stack_is_labelled_by_its_first_meaningful_frame():
    # GIVEN a gradient's stack made by the autograd engine: C++ only
    kinds = [sf.frame_kind(f["name"], f["filename"]) for f in CPP_ONLY]
    # THEN the unwinder, allocator, factory and dispatcher frames are internal, the backward is not
    assert kinds[:5] == [sf.INTERNAL] * 5
    assert sf.label_index(kinds) == 5
    assert sf.frame_text(CPP_ONLY[5]) == "torch::autograd::generated::MmBackward0::apply (Functions.cpp)"
    # and the terminal analysis shows the readable frames, not the unwinder
    data = {
        "segments": [],
        "device_traces": [[{"action": "alloc", "addr": 1, "size": 10, "stream": 0, "frames": CPP_ONLY}]],
    }
    (dev,) = analyze(data).devices
    assert dev.top_stacks[0].frames == (
        "torch::autograd::generated::MmBackward0::apply (Functions.cpp)",
        "torch::autograd::Engine::evaluate_function (engine.cpp)",
    )


def test_python_frames_first_and_user_code_labels():
    frames = [
        CPP_ONLY[0],
        {"name": "einsum", "filename": "/venv/lib/python3.11/site-packages/torch/functional.py", "line": 407},
        {"name": "_PyEval_EvalFrameDefault", "filename": "??", "line": 0},
        {"name": "at::native::einsum(std::string_view)", "filename": "Linear.cpp", "line": 0},
        {"name": "forward", "filename": "/home/me/model.py", "line": 22},
    ]
    kinds = [sf.frame_kind(f["name"], f["filename"]) for f in frames]
    assert sf.label_index(kinds) == 4
    assert [f["name"] for f in sf.readable(frames)] == [
        "einsum",
        "forward",
        "at::native::einsum(std::string_view)",
    ]


def test_torchs_module_call_plumbing_is_hidden_and_never_labels():
    # GIVEN a stack through two nested modules, as torch records it: forward, then torch's
    # _call_impl / _wrapped_call_impl wrappers, then the caller's forward
    module_py = "/venv/lib/python3.11/site-packages/torch/nn/modules/module.py"
    frames = [
        {
            "name": "linear",
            "filename": "/venv/lib/python3.11/site-packages/torch/nn/functional.py",
            "line": 9,
        },
        {"name": "_call_impl", "filename": module_py, "line": 1750},
        {"name": "_wrapped_call_impl", "filename": module_py, "line": 1739},
        {"name": "forward", "filename": "/home/me/model.py", "line": 22},
        {"name": "_call_impl", "filename": module_py, "line": 1750},
        {"name": "forward", "filename": "/home/me/model.py", "line": 40},
    ]
    kinds = [sf.frame_kind(f["name"], f["filename"]) for f in frames]
    # THEN the wrappers are internal Python frames, hidden by default, and the user's code labels
    assert kinds[1] == kinds[2] == kinds[4] == sf.PYTHON | sf.INTERNAL
    assert sf.label_index(kinds) == 3
    assert [(f["name"], f["line"]) for f in sf.readable(frames)] == [
        ("linear", 9),
        ("forward", 22),
        ("forward", 40),
    ]
    # AND with no user frame, a wrapper never labels the block: torch's functional frame does
    assert sf.label_index(kinds[:3]) == 0
    # AND a user's own function named _call_impl is not hidden
    assert sf.frame_kind("_call_impl", "/home/me/module.py") == sf.PYTHON | sf.USER


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_cli_writes_an_explorer_for_two_devices_at_every_protocol(tmp_path, protocol, capsys):
    import json
    import pickle
    import re

    from memprofiler.__main__ import main

    # GIVEN a snapshot with device 0 (the known one) and device 1 (trace only)
    data = known_snapshot()
    data["device_traces"].append(trace_only_snapshot()["device_traces"][1])
    src = tmp_path / "two.pickle"
    src.write_bytes(pickle.dumps(data, protocol=protocol))
    out = tmp_path / "two.html"
    # WHEN the explorer is written
    assert main(["snapshot", str(src), "--html", str(out)]) == 0
    html = out.read_text()
    # THEN it carries both devices with the analysis's peaks
    meta = json.loads(html.split("id='mp-meta'>", 1)[1].split("</script>", 1)[0])
    assert [(d["device"], d["peak"]) for d in meta["devices"]] == [(0, KNOWN["peak_allocated"]), (1, 300)]
    # and names nothing to fetch (the svg namespace URI is no request)
    assert not re.search(r"(src|href|import)\W+['\"]?https?:", html)


def test_level_of_detail_bands_equal_a_direct_count_where_levels_hold_no_block():
    # GIVEN 1,000 instants and blocks living 1, 20 and 600 entries (levels 0, 4 and 9: the
    # levels between hold no block) and one too small to draw
    from memprofiler.analysis.snapshot.replay import DeviceReplay

    m = 1000
    blocks = [(5, 6, 100), (7, 27, 300), (100, 700, 500), (-1, 1000, 7), (400, 401, 1000), (990, 1000, 50)]
    start, end, size = (np.array([b[k] for b in blocks], dtype=np.int64) for k in range(3))
    none = np.zeros(0, dtype=np.int64)
    rep = DeviceReplay(
        0, m, m, start, end, size, size * 0, size * 0, size * 0, none, none, none, none, none, none
    )
    # WHEN the level of detail is cut for a peak of 2048 * 10 bytes (threshold 10)
    lod = level_of_detail(rep, 2048 * 10)
    assert lod.level.tolist() == [0, 4, 9, -1, 0, 3]
    # THEN each level's band is, per bucket, the most bytes live in blocks not drawn at that level
    s = np.maximum(start, 0)
    for lv in range(len(lod.offsets) - 1):
        banded = [
            sum(
                int(z)
                for a, e, z, lv_b in zip(s, end, size, lod.level, strict=True)
                if a <= t < e and lv_b < lv
            )
            for t in range(m)
        ]
        width = 1 << lv
        want = [max(banded[k : k + width]) for k in range(0, m, width)]
        assert lod.band[lod.offsets[lv] : lod.offsets[lv + 1]].tolist() == want


@pytest.mark.parametrize("size", [1, 2, 17, 1000, 4096, 5001])
def test_bucket_maxima_are_each_buckets_largest_value_at_every_width(size):
    from memprofiler.analysis.snapshot.lod import _bucket_max

    x = np.random.default_rng(size).integers(0, 1 << 40, size).astype(np.float64)
    for lv in range(14):
        width = 1 << lv
        want = [max(x[k : k + width]) for k in range(0, size, width)]
        assert _bucket_max(x, lv).tolist() == want


@pytest.mark.parametrize("seed", range(6))
def test_level_of_detail_of_byte_counts_added_as_int64_is_that_of_float64(seed):
    # GIVEN random blocks over an odd number of instants, sizes up to 2**40 bytes (sums that
    # float32 rounds), with levels that hold no block between those that do
    from memprofiler.analysis.snapshot.replay import DeviceReplay

    rng = np.random.default_rng(seed)
    m, n = int(rng.integers(500, 5000)) | 1, 300
    start = rng.integers(-1, m - 1, n)
    life = np.where(rng.random(n) < 0.5, 1, 2 ** rng.integers(3, 12, n) + rng.integers(0, 7, n))
    end = np.minimum(np.maximum(start, 0) + life, m)
    size = rng.integers(1, 1 << 40, n)
    none = np.zeros(0, dtype=np.int64)

    def lod_of(sizes):
        zero = sizes.astype(np.int64) * 0
        rep = DeviceReplay(0, m, m, start, end, sizes, zero, zero, zero, none, none, none, none, none, none)
        return level_of_detail(rep, int(size.sum()) // 50)

    # WHEN the level of detail is cut from int64 sizes (as the replay holds them) and float64 ones
    exact, floats = lod_of(size), lod_of(size.astype(np.float64))
    # THEN every level, band and offset is the same (the bands' dtype too)
    assert exact.threshold == floats.threshold
    assert exact.level.tolist() == floats.level.tolist()
    assert exact.offsets == floats.offsets
    assert exact.band.dtype == floats.band.dtype == np.float32
    assert exact.band.tobytes() == floats.band.tobytes()
