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

from _scripts import load_script

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


hist, cmp, runs, elog, synth, check, report = (
    _load(n) for n in ("history", "compare", "real", "estimate_log", "synthetic", "alloc_check", "report")
)

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
        assert (s["delta_rounded"], s["by_key"]) == (0, []), s["by_key"]
        assert s["same_peak_call"]
    groups = cmp.analyze(real["events"], real["calls"], {})[2]["groups"]
    # the four parameters (512 B blocks each) and the batch (1,024 + 512 B), made before step 1
    assert groups[hist.SETUP] == [4 * 512 + 1024 + 512, 6]
    # the dry run's history has the allocator model's segments: the whole check runs on it
    fig = check.allocator_figures(real["snapshot"], real["events"], real["device"])
    assert fig["errors"] == [] and set(fig["rates"].values()) == {1.0}
    assert fig["check"]["allocs"] == sum(1 for ev in real["events"] if ev["action"] == "alloc")
    for s in fig["steps"]:  # small blocks: nothing is kept whole; six blocks made before step 1
        assert s["real_peak"] == s["clean_from_start_peak"] == s["clean_from_step1_peak"]
        assert (s["real_slack"], s["before_steps"]["blocks"]) == (0, 6)


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
    """The torch.cuda calls the tool's CudaBackend makes, over the allocator model's blocks."""

    def __init__(self) -> None:
        self.hist = synth.SyntheticHistory()
        self.peak = 0
        self.meta = ""
        self.history: list[dict[str, Any]] = []

    @property
    def allocated(self) -> int:
        return int(self.hist.allocated)

    def alloc(self, size: int) -> int:
        key, _ = self.hist.alloc(size, self.meta)
        self.peak = max(self.peak, self.allocated)
        return int(key)

    def free(self, key: int) -> None:
        self.hist.free(key, self.meta)

    def reset_peak(self, *args: Any) -> None:
        self.peak = self.allocated

    def empty(self, n: int, **kwargs: Any) -> Any:
        assert kwargs["device"] == "cuda"
        key = self.alloc(n)
        fake = self

        class _Marker:
            def __del__(self) -> None:
                fake.free(key)

        return _Marker()


#: the build and step 1 of the hand case (tools/gpu_probe/synthetic.py places the blocks as torch
#: would): a parameter P of 8,500,000 B is not split from the 8,971,264 B left of a 20 MiB
#: segment (rest 471,040 B < 1 MiB); a temporary's 8,000,000 B hole left by the build is taken
#: whole by the step's 7,000,000 B request (7,000,064 rounded: 999,936 B over)
PARAM_A, TEMP, PARAM_P, WORK, SCRATCH, BETWEEN = 4_000_000, 8_000_000, 8_500_000, 7_000_000, 3000, 50 * MiB
P_SLACK, W_SLACK = 8_971_264 - 8_500_224, 8_000_000 - 7_000_064
BUILD_BLOCKS = 4_000_256 + 8_971_264


def _build(alloc: Any, free: Any) -> None:
    alloc(PARAM_A)
    temp = alloc(TEMP)
    alloc(PARAM_P)
    free(temp)


def test_cuda_backend_tags_each_call_and_folds_the_peaks_between_calls(monkeypatch: Any) -> None:
    """The CUDA side's calls, on a fake torch.cuda: every name it uses exists and adds up, and the
    allocator check reads the snapshot it takes."""
    fake = _FakeCuda()
    cuda, mem = torch.cuda, torch.cuda.memory
    monkeypatch.setattr(mem, "_record_memory_history", lambda **kw: fake.history.append(kw))
    monkeypatch.setattr(mem, "_set_memory_metadata", lambda s: setattr(fake, "meta", s))
    monkeypatch.setattr(mem, "_snapshot", lambda *a, **k: fake.hist.snapshot())
    monkeypatch.setattr(cuda, "reset_peak_memory_stats", fake.reset_peak)
    monkeypatch.setattr(cuda, "max_memory_allocated", lambda *a: fake.peak)
    monkeypatch.setattr(cuda, "memory_allocated", lambda *a: fake.allocated)
    monkeypatch.setattr(cuda, "max_memory_reserved", lambda *a: 20 * MiB)
    monkeypatch.setattr(cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(cuda, "current_device", lambda: 0)
    workspace: list[int] = []
    monkeypatch.setattr(
        torch._C, "_cuda_clearCublasWorkspaces", lambda: fake.free(workspace.pop()), raising=False
    )
    monkeypatch.setattr(torch, "empty", fake.empty)

    backend = runs.CudaBackend(max_entries=1000)
    assert fake.history == [{"enabled": "all", "context": "alloc", "stacks": "python", "max_entries": 1000}]
    _build(fake.alloc, fake.free)  # the model, built on the GPU before the first step
    backend.mark(1)
    calls = [hist.Call(1, "aten.addmm.default", False, "fc")]
    backend.begin(0)
    workspace.append(fake.alloc(WORK))  # a workspace the call keeps
    fake.free(fake.alloc(SCRATCH))
    backend.end(calls[0], None)
    assert (calls[0].peak, calls[0].after, fake.meta) == (
        BUILD_BLOCKS + 8_000_000 + 3072,
        BUILD_BLOCKS + 8_000_000,
        "",
    )
    fake.free(fake.alloc(BETWEEN))  # between calls: still the step's (a new 50 MiB segment)
    assert backend.step_end() == [BUILD_BLOCKS + 8_000_000 + BETWEEN, 20 * MiB]
    snap = backend.snapshot()
    assert fake.history[-1] == {"enabled": None}
    events = backend.events(snap)
    assert [ev["user_metadata"] for ev in events if ev["action"] == "alloc"] == ["", "", "", "", "0", "0", ""]
    side = cmp.Side(events, calls, hist.initial_live(snap, events))
    view = side.view(side.peak(1))
    assert view["groups"] == {  # 512 B-rounded requests
        hist.SETUP: [4_000_256 + 8_500_224, 2],
        "aten.addmm.default @fc :: workspace": [7_000_064, 1],
        "aten.addmm.default @fc :: scratch": [3072, 1],
    }
    fig = check.allocator_figures(snap, events, 0)
    assert fig["errors"] == []
    assert set(fig["rates"].values()) == {1.0}  # the fake's allocator is the model itself
    (one,) = fig["steps"]
    assert one["real_peak"] == BUILD_BLOCKS + 8_000_000 + BETWEEN  # the trace's peak is the step's
    assert one["before_steps"] == {"bytes": BUILD_BLOCKS, "blocks": 2, "slack": P_SLACK}
    assert one["during_steps"] == {"bytes": 8_000_000 + BETWEEN, "blocks": 2, "slack": W_SLACK}
    # from an empty cache at step 1 both blocks split: the build's cache added both slacks
    assert one["clean_from_step1_peak"] == 4_000_256 + 8_500_224 + 7_000_064 + BETWEEN
    assert one["real_peak"] - one["clean_from_step1_peak"] == P_SLACK + W_SLACK == 1_470_976
    assert (one["clean_from_start_peak"], one["clean_from_start_slack"]) == (
        one["real_peak"],
        P_SLACK + W_SLACK,
    )
    assert backend.cublas_workspace() == 8_000_000  # the block, not the request


def test_without_user_metadata_calls_are_named_by_their_output_addresses() -> None:
    events = [{k: v for k, v in ev.items() if k != "user_metadata"} for ev in EVENTS]
    hist.label_by_outputs(events, _calls())
    outputs = {ev["addr"]: ev.get("user_metadata") for ev in events if ev["action"] == "alloc"}
    assert {a: outputs[a] for a in (A, X, Y, Z, BIG)} == {A: None, X: "0", Y: "1", Z: "2", BIG: "3"}
    assert [ev.get("user_metadata") for ev in events if ev["addr"] == 0x9000] == [None] * 6  # markers
    # W, allocated in call 1 before its output, goes to call 0 (the last call that made an output)
    assert outputs[W] == "0"


def _two_steps() -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The hand case's build and two steps on the synthetic allocator: step 1 keeps WORK in the
    build's hole; step 2 frees it and asks 16,000,000 B, a new 16 MiB segment kept whole (777,216 B
    over). The step markers are allocations of MARK + step bytes, freed at once."""
    h = synth.SyntheticHistory()
    _build(lambda n: h.alloc(n)[0], h.free)
    h.free(h.alloc(hist.MARK + 1)[0])
    work = h.alloc(WORK, "0")[0]
    h.free(h.alloc(hist.MARK + 2)[0])
    h.free(work, "1")
    h.alloc(16_000_000, "1")
    snap = h.snapshot()
    return snap, snap["device_traces"][0]


def test_allocator_check_splits_each_real_step_peak_by_the_cache_it_began_with() -> None:
    snap, events = _two_steps()
    fig = check.allocator_figures(snap, events)
    assert (fig["errors"], fig["live_before_trace"], fig["guessed_block_sizes"]) == ([], 0, 0)
    assert fig["rates"]["block_size"] == 1.0 and fig["check"]["end_state_equal"]
    one, two = fig["steps"]
    assert (one["real_peak"], one["real_slack"]) == (BUILD_BLOCKS + 8_000_000, P_SLACK + W_SLACK)
    assert one["clean_from_step1_peak"] == 4_000_256 + 8_500_224 + 7_000_064
    y_slack = 16 * MiB - 16_000_000
    assert (two["real_peak"], two["real_slack"]) == (BUILD_BLOCKS + 16 * MiB, P_SLACK + y_slack)
    assert two["before_steps"] == {"bytes": BUILD_BLOCKS, "blocks": 2, "slack": P_SLACK}
    assert two["during_steps"] == {"bytes": 16 * MiB, "blocks": 1, "slack": y_slack}
    # an empty cache at step 1 splits P too; the new segment's block is whole either way
    assert (two["clean_from_step1_peak"], two["clean_from_step1_slack"]) == (
        4_000_256 + 8_500_224 + 16 * MiB,
        y_slack,
    )
    assert fig["check"]["real_slack_at_peak"] == fig["check"]["model_slack_at_peak"] == P_SLACK + y_slack
    # segments: 20 MiB (A, P, WORK), 2 MiB (the markers), 16 MiB (step 2's request): the same either way
    assert fig["real_reserved_in_steps"] == fig["clean_from_step1"]["peak_reserved"] == 38 * MiB
    line = check.summary_line(fig)
    assert (
        "s1 real 20,971,520 vs clean@step1 19,500,544 (+1,470,976), slack 1,470,976 (build 471,040)" in line
    )
    assert "s2 real 29,748,736 vs clean@step1 29,277,696 (+471,040)" in line
    text = "\n".join(report.allocator_lines(fig, {"slack_at_step_peaks": [123, 456]}))
    assert (
        "live at the real peak: 2 blocks made before the steps (12,971,520 B), 1 during them (16,777,216 B)"
        in text
    )
    assert "+1,470,976" in text and "1,470,976 = 471,040 + 999,936   123" in text


def test_allocator_check_says_in_one_line_what_it_could_not_check() -> None:
    snap, events = _two_steps()
    expandable = {**snap, "segments": [{**g, "is_expandable": True} for g in snap["segments"]]}
    fig = check.allocator_figures(expandable, events)
    assert fig["errors"] == [
        "check: RewindError: expandable segments: the trace rewinds, but its replay is not checked"
    ]
    assert [s["real_peak"] for s in fig["steps"]] == [BUILD_BLOCKS + 8_000_000, BUILD_BLOCKS + 16 * MiB]
    broken = {**snap, "segments": []}  # a history the dumped state does not hold
    fig = check.allocator_figures(broken, events)
    assert fig["errors"] == [
        f"rewind: entry {len(events) - 1} (alloc at {events[-1]['addr']:#x}): no segment holds that address"
    ]
    assert "steps" not in fig
    assert check.summary_line(fig) == f"allocator: {fig['errors'][0]}"
    assert report.allocator_summary(fig) == {"rates": None, "errors": fig["errors"], "steps": []}


def test_the_headline_and_the_text_carry_the_allocator_check() -> None:
    snap, events = _two_steps()
    result = {
        "model": "vit",
        "stage": "done",
        "real": {"step_peaks": [[BUILD_BLOCKS + 8_000_000, 0]]},
        "estimate": {
            "step_peaks": [20_000_000, 29_000_000],
            "slack_at_step_peaks": [0, 777_216],
            "reserved_peak_bytes": 40 * MiB,
        },
        "allocator": check.allocator_figures(snap, events),
    }
    fig = result["allocator"]
    fig["steps"][0]["max_memory_allocated"] = BUILD_BLOCKS + 8_000_000  # as the trace says: no line
    fig["steps"][1]["max_memory_allocated"] = BUILD_BLOCKS + 16 * MiB + 512  # one the trace missed
    head = report.headline(result).splitlines()
    assert head[-1].startswith("  allocator: rates 1/1/1/1/1; s1 ")
    # step 2: real 29,748,736 - estimate 29,000,000 = the cache +471,040 + the requests +277,696
    assert head[-1].endswith(
        "s2 +748,736 = cache +471,040 + requests +277,696, slack 1,248,256 (build 471,040) vs est 777,216; "
        "reserved -2,097,152 = cache +0 + requests -2,097,152"
    )
    text = report.render(result)
    assert "-- the allocator model on this trace (" in text and "match rates over 7 allocations" in text
    assert "clean from step1: allocated peak 29,277,696" in text
    assert text.count("max_memory_allocated() in this step") == 1
    assert (
        "reserved peak in the steps: real 39,845,888; the same requests from an empty cache at step 1 "
        "39,845,888; estimate 41,943,040" in text
    )
    assert "the run's max_memory_allocated() in this step: 29,749,248 (+512)" in text


def test_a_kept_trace_drops_the_frames_and_replays_to_the_same_figures(tmp_path: Path) -> None:
    import pickle

    from memprofiler.analysis.snapshot.summary import load_snapshot

    snap, events = _two_steps()
    for ev in events:
        ev["frames"] = HF  # as a real history has them (most of its bytes)
    snap["segments"][0]["frames"] = HF
    calls = [hist.Call(1, "aten.addmm.default", False, "fc"), hist.Call(2, "aten.mm.default", True, "fc")]
    path = tmp_path / "vit_trace.pickle"
    path.write_bytes(pickle.dumps(check.kept_trace(snap, 0, calls), protocol=4))
    kept = load_snapshot(path)  # the restricted unpickler reads it
    assert kept["probe_calls"] == [[1, "aten.addmm.default @fc"], [2, "aten.mm.default [bw] @fc"]]
    assert all("frames" not in ev for ev in kept["device_traces"][0])
    assert "frames" not in kept["segments"][0]
    again = check.allocator_figures(kept, kept["device_traces"][0])
    first = check.allocator_figures(snap, events)
    assert {k: v for k, v in again.items() if k != "seconds"} == {
        k: v for k, v in first.items() if k != "seconds"
    }
    tool = load_script("tools/allocator_check.py")
    assert tool.main([str(path)]) == 0  # the model decides every allocation as the (synthetic) allocator


def test_the_dry_runs_real_blocks_stay_out_of_the_estimates_log() -> None:
    """Failed before: the estimate's log patches AllocatorReplay for its run, and a dry run's real
    storages that the garbage collector freed then went through the synthetic allocator into it
    (the dry-run test lost a parameter's 512 B at step 1 whenever the collector ran there)."""
    h = synth.SyntheticHistory()
    key, _ = h.alloc(1000)
    log = elog.EstimateLog()
    log.live.add(key)  # the estimate's own request 0 is live too
    with log.installed():
        h.free(key)
        h.alloc(2000)
    assert log.events == []


def test_a_real_h200_trace_without_step_markers_is_checked_and_kept_without_frames(tmp_path: Path) -> None:
    """The demo run's history (tests/fixtures/gpu_runs/demo, an H200, torch 2.11): its entries and
    segments carry frames, time_us and compile_context as a real ``_snapshot()`` writes them."""
    import pickle

    from memprofiler.analysis.snapshot.summary import load_snapshot

    snap = load_snapshot(
        TOOLS.parent / "tests/fixtures/gpu_runs/demo/cuda_alloc_rank_0.training_step.4.end.pickle"
    )
    trace = snap["device_traces"][0]
    assert hist.step_windows(trace) == {}  # failed before: zip() of no markers and one end
    fig = check.allocator_figures(snap, trace)
    assert (fig["errors"], fig["steps"], fig["entries"]) == ([], [], 2766)
    assert set(fig["rates"].values()) == {1.0}
    # as tests/estimate/test_allocator_trace.py has it: from an empty cache one 2 MiB segment more
    assert (fig["clean_from_start"]["peak_allocated"], fig["clean_from_start"]["peak_reserved"]) == (
        118_890_496,
        138_412_032 + 2 * MiB,
    )
    assert "clean_from_step1" not in fig
    kept = check.kept_trace(snap, 0, [])
    path = tmp_path / "demo_trace.pickle"
    path.write_bytes(pickle.dumps(kept, protocol=4))
    assert path.stat().st_size < len(pickle.dumps(snap, protocol=4)) // 2
    again = check.allocator_figures(load_snapshot(path), kept["device_traces"][0])
    assert (again["check"], again["clean_from_start"]) == (fig["check"], fig["clean_from_start"])


def test_the_estimates_log_keeps_its_slack_at_each_step_peak() -> None:
    from memprofiler.estimate.allocator.caching import AllocatorReplay

    log = elog.EstimateLog()
    with log.installed():
        r = AllocatorReplay()  # the estimate's own replay, driven by hand: the hand case again
        r.alloc(1, PARAM_A)
        r.alloc(2, TEMP)
        r.alloc(3, PARAM_P)  # kept whole: 471,040 B over
        r.free(2)
        log.mark(1)
        r.alloc(4, WORK)  # the temporary's hole, whole: 999,936 B over
        r.free(4)
        log.mark(2)
        r.alloc(5, 3000)  # the small pool: split, nothing over
    assert log.step_peaks[1] == BUILD_BLOCKS + 8_000_000
    assert log.step_slack == {0: P_SLACK, 1: P_SLACK + W_SLACK, 2: P_SLACK}
    assert log.slack == P_SLACK


def test_a_bf16_mixed_dry_run_runs_forward_under_autocast_on_both_sides() -> None:
    panel = SimpleNamespace(
        PANEL={"tiny": (_Tiny, lambda: {"x": torch.randn(32, 8), "y": torch.randn(32, 4)})},
        OPTIMIZERS={"adamw": lambda ps: torch.optim.AdamW(ps, lr=1e-4)},
        hf_loss=lambda model, batch: model(**batch).loss,
    )
    real = runs.real_run(panel, "tiny", None, cuda=False, max_entries=0, precision="bf16-mixed")
    est = elog.estimate_run(panel, "tiny", None, gpu="H200", device="cpu", precision="bf16-mixed")
    # THEN both sides made the forward's bfloat16 copies, and agree to the byte at each step's peak
    assert any("_to_copy" in c.op for c in real["calls"])
    steps = cmp.compare(
        cmp.Side(real["events"], real["calls"], {}), cmp.Side(est["events"], est["calls"], {}), 20
    )
    assert [(s["step"], s["delta_rounded"]) for s in steps] == [(1, 0), (2, 0)]


def test_a_probe_spec_names_the_model_its_attention_and_its_precision() -> None:
    probe = load_script("tools/gpu_estimate_peak.py")
    assert probe.parse_spec("t5:eager") == ("t5", "eager", "32-true")
    assert probe.parse_spec("llama%bf16-mixed@alt") == ("llama", None, "bf16-mixed")
    assert probe.tag_of("llama:sdpa%bf16-mixed") == "llama_sdpa_bf16-mixed"
