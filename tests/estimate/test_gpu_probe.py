"""tools/gpu_probe (behind tools/gpu_estimate_peak.py): an allocator history replayed and grouped.

The history is a synthetic ``torch.cuda.memory._snapshot()`` (segments with blocks, one device
trace of alloc / free_requested / free_completed events with addr, size, frames and the call's
index as user metadata), so every figure below is known by hand. One test runs the tool's
``--cpu-dry-run`` path on a tiny model: a real CPU run against the estimate on ``device="cpu"``,
which must agree to the byte at both steps' peaks; another runs the CUDA side on a fake
``torch.cuda``.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

TOOLS = Path(__file__).resolve().parents[2] / "tools"
MiB = 1 << 20


def _load(name: str) -> ModuleType:
    """``tools/gpu_probe/<name>.py`` as ``gpu_probe.<name>``, without putting tools/ on sys.path."""
    if "gpu_probe" not in sys.modules:
        pkg = TOOLS / "gpu_probe"
        spec = importlib.util.spec_from_file_location(
            "gpu_probe", pkg / "__init__.py", submodule_search_locations=[str(pkg)]
        )
        assert spec is not None and spec.loader is not None
        sys.modules["gpu_probe"] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules["gpu_probe"])
    return importlib.import_module(f"gpu_probe.{name}")


hist, cmp, runs, elog = (_load(n) for n in ("history", "compare", "real", "estimate_log"))

HF = [
    {
        "filename": "/venv/site-packages/transformers/models/vit/modeling_vit.py",
        "line": 10,
        "name": "__init__",
    }
]


def _ev(action: str, addr: int, size: int, meta: str = "", frames: Any = None) -> dict[str, Any]:
    return {"action": action, "addr": addr, "size": size, "user_metadata": meta, "frames": frames or []}


def _free(addr: int, meta: str = "") -> list[dict[str, Any]]:
    return [_ev("free_requested", addr, 0, meta), _ev("free_completed", addr, 0, meta)]


def _mark(step: int) -> list[dict[str, Any]]:
    return [_ev("alloc", 0x9000, hist.MARK + step), *_free(0x9000)]


A, X, W, S, Y, Z, BIG = 0x1000, 0x2000, 0x3000, 0x4000, 0x5000, 0x6000, 0x7000
EVENTS = [
    _ev("alloc", A, 4_000_000, frames=HF),  # a parameter, before the first step
    *_mark(1),
    _ev("alloc", X, 1000, "0"),  # call 0 returns X
    _ev("alloc", W, 32 * MiB, "1"),  # call 1 keeps W (a library workspace)
    _ev("alloc", S, 3000, "1"),  # ... frees S before it returns (scratch)
    _ev("alloc", Y, 2_000_000, "1"),  # ... and returns Y: the step's peak
    *_free(S, "1"),
    *_free(X, "2"),  # call 2 frees X and returns Z
    _ev("alloc", Z, 100, "2"),
    *_mark(2),
    _ev("alloc", BIG, 40_000_100, "3"),  # call 3 returns BIG, freed after it
    *_free(BIG),
]
#: rounded blocks live at step 1's peak (the 4th event of call 1)
STEP1 = {"setup": 4_000_256, "X": 1024, "W": 32 * MiB, "S": 3072, "Y": 2_000_384}
SLACK = MiB  # what the exact peak of call 1 says beyond the rounded blocks (an unsplit block)


def _calls() -> list[Any]:
    c = hist.Call
    return [
        c(1, "aten.mm.default", False, "layer", frozenset({X}), peak=4_001_280, after=4_001_280),
        c(1, "aten.addmm.default", True, "head", frozenset({Y}), peak=sum(STEP1.values()) + SLACK),
        c(1, "aten.add.Tensor", False, "layer", frozenset({Z}), peak=1, after=1),
        c(2, "aten.mm.default", False, "layer", frozenset({BIG}), peak=80 * MiB),
    ]


def test_replay_finds_each_steps_peak_and_groups_its_live_blocks_by_call() -> None:
    steps = cmp.analyze(EVENTS, _calls(), {})
    one = steps[1]
    assert one["at"] == "aten.addmm.default [bw] @head"
    assert one["rounded_at_moment"] == sum(STEP1.values())
    assert one["call_peak"] - one["rounded_at_moment"] == SLACK
    assert one["groups"] == {
        hist.SETUP: [STEP1["setup"], 1],
        "aten.mm.default @layer": [STEP1["X"], 1],
        "aten.addmm.default [bw] @head :: workspace": [STEP1["W"], 1],
        "aten.addmm.default [bw] @head :: scratch": [STEP1["S"], 1],
        "aten.addmm.default [bw] @head": [STEP1["Y"], 1],
    }
    assert one["frames"]["transformers/models/vit/modeling_vit.py:10:__init__"] == [STEP1["setup"], 1]
    two = steps[2]  # X and S are gone, Z came; BIG is the new block
    assert two["at"] == "aten.mm.default @layer"
    assert two["groups"] == {
        hist.SETUP: [4_000_256, 1],
        "aten.addmm.default [bw] @head :: workspace": [32 * MiB, 1],
        "aten.addmm.default [bw] @head": [2_000_384, 1],
        "aten.add.Tensor @layer": [512, 1],
        "aten.mm.default @layer": [40_000_512, 1],
    }


def test_a_free_completed_after_the_address_is_reused_frees_nothing() -> None:
    events = [
        _ev("alloc", A, 1000),
        _ev("free_requested", A, 0),
        _ev("alloc", A, 2000),
        _ev("free_completed", A, 0),
    ]
    curve, live = hist.replay(events, {}, upto=3)
    assert curve == [1024, 0, 2048, 2048]
    assert [b.size for b in live.values()] == [2048]


def test_blocks_live_before_the_history_are_counted() -> None:
    events = [*_free(A), _ev("alloc", X, 100), *_free(X)]  # A was allocated before the history
    snapshot = {
        "segments": [  # blocks carry no address: they follow each other from the segment's
            {
                "address": W,
                "blocks": [
                    {"size": 2048, "requested_size": 700, "state": "active_allocated"},  # at W
                    {"size": 4096, "requested_size": 4096, "state": "inactive"},
                ],
            },
            {"address": X, "blocks": [{"size": 512, "requested_size": 100, "state": "active_allocated"}]},
        ],
        "device_traces": [events],
    }
    start = hist.initial_live(snapshot, events)
    assert {a: b.size for a, b in start.items()} == {A: 512, W: 1024}  # X was allocated in the trace
    curve, _ = hist.replay(events, start)
    assert curve[0] == 1024  # W stays; A went at its free_requested


def test_diff_and_its_collapses_rank_the_largest_difference_first() -> None:
    real = {"aten.mm.default [bw] @h.0 :: workspace": [8 * MiB, 1], "aten.mm.default @h.0": [3 * MiB, 2]}
    est = {"aten.mm.default @h.0": [1 * MiB, 1], "aten.gelu.default @h.0": [5 * MiB, 1]}
    rows = hist.diff(real, est, 10)
    assert [(r["key"], r["delta"]) for r in rows] == [
        ("aten.mm.default [bw] @h.0 :: workspace", 8 * MiB),
        ("aten.gelu.default @h.0", -5 * MiB),
        ("aten.mm.default @h.0", 2 * MiB),
    ]
    assert hist.collapse(real, "op") == {
        "aten.mm.default [bw] :: workspace": [8 * MiB, 1],
        "aten.mm.default": [3 * MiB, 2],
    }
    assert hist.collapse(real, "module") == {"@h.0 [bw]": [8 * MiB, 1], "@h.0": [3 * MiB, 2]}


class _Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 16), nn.Linear(16, 4)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> SimpleNamespace:
        return SimpleNamespace(loss=F.mse_loss(self.fc2(torch.relu(self.fc1(x))), y))


def test_dry_run_real_cpu_steps_match_the_cpu_estimate_to_the_byte() -> None:
    panel = SimpleNamespace(
        PANEL={"tiny": (_Tiny, lambda: {"x": torch.randn(32, 8), "y": torch.randn(32, 4)})},
        OPTIMIZERS={"adamw": lambda ps: torch.optim.AdamW(ps, lr=1e-4)},
        hf_loss=lambda model, batch: model(**batch).loss,
    )
    real = runs.real_run(panel, "tiny", None, cuda=False, max_entries=0)
    est = elog.estimate_run(panel, "tiny", None, gpu="H200", device="cpu")
    assert real["info"]["calls"] > 20
    steps = cmp.compare(
        cmp.Side(real["events"], real["calls"], {}), cmp.Side(est["events"], est["calls"], {}), 20
    )
    assert [s["step"] for s in steps] == [1, 2]
    for s in steps:
        assert (s["delta_rounded"], s["by_key"]) == (0, [])
        assert s["same_peak_call"]
    groups = cmp.analyze(real["events"], real["calls"], {})[2]["groups"]
    # the four parameters (512 B blocks each) and the batch (1,024 + 512 B), made before step 1
    assert groups[hist.SETUP] == [4 * 512 + 1024 + 512, 6]


def test_compare_diffs_each_side_at_its_peak_and_inside_the_others_peak_call() -> None:
    # the estimate misses call 1's workspace and has 64 MiB more in call 2, where it peaks
    big = _ev("alloc", 0x8000, 64 * MiB, "2")
    est_events = [ev for ev in EVENTS if ev["addr"] != W]
    est_events.insert(est_events.index(_ev("alloc", Z, 100, "2")), big)
    est_calls = _calls()
    est_calls[2].peak = 100 * MiB
    real, est = cmp.Side(EVENTS, _calls(), {}), cmp.Side(est_events, est_calls, {})
    one = cmp.compare(real, est, 10)[0]
    assert (one["real_at"], one["est_at"]) == ("aten.addmm.default [bw] @head", "aten.add.Tensor @layer")
    workspace = ("aten.addmm.default [bw] @head :: workspace", 32 * MiB)
    same = one["est_in_real_peak_call"]  # the estimate in call 1: only the workspace is missing
    assert (same["call"], same["occurrence"]) == ("aten.addmm.default [bw] @head", 0)
    assert same["other_rounded"] == sum(STEP1.values()) - 32 * MiB
    assert [(r["key"], r["delta"]) for r in same["by_key"]] == [workspace]
    other = one["real_in_est_peak_call"]  # the real run in call 2 against the estimate's peak
    assert [(r["key"], r["delta"]) for r in other["by_key"]] == [
        ("aten.add.Tensor @layer :: workspace", -64 * MiB),  # not among call 2's outputs
        workspace,
    ]


def test_gap_jumps_name_the_module_where_the_peaks_part() -> None:
    c = hist.Call
    real = [
        c(1, "aten.mm.default", False, "h.0.mlp", peak=100),
        c(1, "aten.mm.default", False, "h.1.mlp", peak=300),
    ]
    est = [
        c(1, "aten.mm.default", False, "h.0.mlp", peak=100),
        c(1, "aten.mm.default", False, "h.1.mlp", peak=200),
    ]
    peaks = hist.module_peaks(real, depth=2)
    assert peaks == {"s1 fw h.0": 100, "s1 fw h.1": 300}
    assert hist.gap_jumps(peaks, hist.module_peaks(est, depth=2), 5) == [
        {"module": "s1 fw h.1", "jump": 100, "gap": 100, "real": 300, "est": 200}
    ]


class _FakeCuda:
    """The torch.cuda calls the tool's CudaBackend makes, over a count of allocated bytes."""

    def __init__(self) -> None:
        self.allocated = self.peak = 0
        self.meta = ""
        self.events: list[dict[str, Any]] = []
        self.history: list[dict[str, Any]] = []

    def alloc(self, addr: int, size: int) -> None:
        self.events.append(_ev("alloc", addr, size, self.meta))
        self.allocated += hist.rounded(size)
        self.peak = max(self.peak, self.allocated)

    def free(self, addr: int, size: int) -> None:
        self.events += _free(addr, self.meta)
        self.allocated -= hist.rounded(size)

    def reset_peak(self, *args: Any) -> None:
        self.peak = self.allocated

    def empty(self, n: int, **kwargs: Any) -> Any:
        assert kwargs["device"] == "cuda"
        self.alloc(0x9000, n)
        fake = self

        class _Marker:
            def __del__(self) -> None:
                fake.free(0x9000, n)

        return _Marker()


def test_cuda_backend_tags_each_call_and_folds_the_peaks_between_calls(monkeypatch: Any) -> None:
    """The CUDA side's calls, on a fake torch.cuda: every name it uses exists and adds up."""
    fake = _FakeCuda()
    cuda, mem = torch.cuda, torch.cuda.memory
    monkeypatch.setattr(mem, "_record_memory_history", lambda **kw: fake.history.append(kw))
    monkeypatch.setattr(mem, "_set_memory_metadata", lambda s: setattr(fake, "meta", s))
    monkeypatch.setattr(
        mem, "_snapshot", lambda *a, **k: {"segments": [], "device_traces": [list(fake.events)]}
    )
    monkeypatch.setattr(cuda, "reset_peak_memory_stats", fake.reset_peak)
    monkeypatch.setattr(cuda, "max_memory_allocated", lambda *a: fake.peak)
    monkeypatch.setattr(cuda, "memory_allocated", lambda *a: fake.allocated)
    monkeypatch.setattr(cuda, "max_memory_reserved", lambda *a: 20 * MiB)
    monkeypatch.setattr(cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(cuda, "current_device", lambda: 0)
    monkeypatch.setattr(
        torch._C, "_cuda_clearCublasWorkspaces", lambda: fake.free(W, 32 * MiB), raising=False
    )
    monkeypatch.setattr(torch, "empty", fake.empty)

    backend = runs.CudaBackend(max_entries=1000)
    assert fake.history == [{"enabled": "all", "context": "alloc", "stacks": "python", "max_entries": 1000}]
    fake.alloc(A, 4_000_000)  # the model, built before the first step
    backend.mark(1)
    calls = [hist.Call(1, "aten.addmm.default", False, "fc")]
    backend.begin(0)
    fake.alloc(W, 32 * MiB)  # a workspace the call keeps
    fake.alloc(S, 3000)
    fake.free(S, 3000)
    backend.end(calls[0], None)
    assert (calls[0].peak, calls[0].after, fake.meta) == (
        4_000_256 + 32 * MiB + 3072,
        4_000_256 + 32 * MiB,
        "",
    )
    fake.alloc(X, 50 * MiB)  # between calls: still the step's
    fake.free(X, 50 * MiB)
    assert backend.step_end() == [4_000_256 + 82 * MiB, 20 * MiB]
    snap = backend.snapshot()
    assert fake.history[-1] == {"enabled": None}
    events = backend.events(snap)
    assert [ev["user_metadata"] for ev in events if ev["action"] == "alloc"] == ["", "", "0", "0", ""]
    side = cmp.Side(events, calls, hist.initial_live(snap, events))
    view = side.view(side.peak(1))
    assert view["groups"] == {
        hist.SETUP: [4_000_256, 1],
        "aten.addmm.default @fc :: workspace": [32 * MiB, 1],
        "aten.addmm.default @fc :: scratch": [3072, 1],
    }
    assert backend.cublas_workspace() == 32 * MiB


def test_without_user_metadata_calls_are_named_by_their_output_addresses() -> None:
    events = [{k: v for k, v in ev.items() if k != "user_metadata"} for ev in EVENTS]
    hist.label_by_outputs(events, _calls())
    outputs = {ev["addr"]: ev.get("user_metadata") for ev in events if ev["action"] == "alloc"}
    assert {a: outputs[a] for a in (A, X, Y, Z, BIG)} == {A: None, X: "0", Y: "1", Z: "2", BIG: "3"}
    assert [ev.get("user_metadata") for ev in events if ev["addr"] == 0x9000] == [None] * 6  # markers
    # W, allocated in call 1 before its output, goes to call 0 (the last call that made an output)
    assert outputs[W] == "0"
