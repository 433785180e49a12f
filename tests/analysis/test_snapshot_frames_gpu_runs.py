"""Frames without plumbing, on the allocator pickles memprofiler wrote on a real GPU.

On the demo's own capture the labels used to include ``wrapper (decorator.py)`` (our
decorator), ``inner (module.py)`` (torch's module call with hooks), ``training_step
(strategy.py)`` (Lightning) and ``_run_subcommand (estimate.py)`` (our CLI). By default none
of these may label a block or appear in a stack the explorer or the terminal table shows.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from rich.console import Console

from memprofiler.analysis.snapshot import frames as sf
from memprofiler.analysis.snapshot.replay import StackTable, replay
from memprofiler.analysis.snapshot.summary import analyze, load_snapshot
from memprofiler.reporters.terminal import render_snapshot

RUNS = Path(__file__).parents[1] / "fixtures" / "gpu_runs"
PICKLES = sorted(RUNS.glob("*/*.pickle"))

#: (file ending or directory, function names or None for every function) that must never show.
PLUMBING = (
    ("memprofiler/core/decorator.py", None),
    ("memprofiler/lightning/", None),
    ("torch/nn/modules/module.py", {"inner", "_call_impl", "_wrapped_call_impl"}),
    ("torch/utils/hooks.py", None),
    ("lightning/pytorch/", None),
    ("lightning/fabric/", None),
    ("jsonargparse/", None),
)


def _is_plumbing(filename: str, name: str) -> bool:
    for where, names in PLUMBING:
        if (filename.endswith(where) or (where.endswith("/") and where in filename)) and (
            names is None or name in names
        ):
            return True
    return False


def test_the_recorded_runs_are_there():
    assert {p.parent.name for p in PICKLES} == {"demo", "oom"} and len(PICKLES) == 4


@pytest.mark.parametrize("path", PICKLES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_no_label_or_shown_frame_is_plumbing(path):
    # GIVEN a pickle memprofiler wrote on the GPU, replayed as the explorer does
    data = load_snapshot(path)
    table = StackTable()
    replay(data, table)
    strings = table.strings
    plumbing_seen = 0
    for sid, fids in enumerate(table.stacks):
        frames = [table.frames[f] for f in fids]
        plumbing_seen += sum(_is_plumbing(strings[f[1]], strings[f[0]]) for f in frames)
        # THEN no block's label is a frame of memprofiler, torch's module plumbing or Lightning
        label = table.labels[sid]
        if label >= 0:
            name, file = strings[table.frames[label][0]], strings[table.frames[label][1]]
            assert not _is_plumbing(file, name), f"stack {sid} labelled by {name} ({file})"
        # AND the frames the explorer shows by default (not INTERNAL) hold none of them either
        for name_id, file_id, _line, kind in frames:
            if _is_plumbing(strings[file_id], strings[name_id]):
                assert kind & sf.INTERNAL, (strings[name_id], strings[file_id])
    # (the capture does hold such frames: they are hidden, not absent)
    assert plumbing_seen > 0
    # AND the terminal table's stacks show none of them
    analysis = analyze(data, str(path), top=50)
    for dev in analysis.devices:
        for group in dev.top_stacks:
            for text in group.frames:
                assert not re.match(
                    r"(wrapper \(decorator|inner \(module|_call_impl|_wrapped_call_impl)", text
                )
                assert not re.search(
                    r"\((strategy|estimate|cli|call|fit_loop|training_epoch_loop|automatic)\.py", text
                )
    console = Console(width=300, record=True)
    render_snapshot(analysis, console, top=50, segments=0)
    printed = console.export_text()
    for word in ("decorator.py", "strategy.py", "estimate.py", "inner (module.py"):
        assert word not in printed


def test_the_demos_blocks_are_labelled_by_the_users_code():
    # GIVEN the demo's end-of-call-4 pickle
    data = load_snapshot(RUNS / "demo" / "cuda_alloc_rank_0.training_step.4.end.pickle")
    table = StackTable()
    replay(data, table)
    labels = {
        f"{table.strings[table.frames[f][0]]} ({Path(table.strings[table.frames[f][1]]).name})"
        for f in table.labels
        if f >= 0
    }
    # THEN the model's forward and the step label what they allocate, the optimizer's own
    # code labels optimizer state, and no dispatch frame labels anything
    assert {"forward (demo.py)", "training_step (demo.py)", "_loss (demo.py)"} <= labels
    assert "_init_group (adam.py)" in labels
    assert not labels & {
        "wrapper (decorator.py)",
        "inner (module.py)",
        "training_step (strategy.py)",
        "_run_subcommand (estimate.py)",
    }


def test_show_all_frames_keeps_everything():
    # GIVEN a stack through memprofiler's decorator and Lightning, as the demo recorded it
    frames = [
        {"name": "forward", "filename": "/home/user/memprofiler/examples/demo.py", "line": 56},
        {
            "name": "inner",
            "filename": "/usr/lib/python3.12/site-packages/torch/nn/modules/module.py",
            "line": 1833,
        },
        {"name": "training_step", "filename": "/home/user/memprofiler/examples/demo.py", "line": 133},
        {
            "name": "wrapper",
            "filename": "/home/user/memprofiler/src/memprofiler/core/decorator.py",
            "line": 80,
        },
        {
            "name": "training_step",
            "filename": "/usr/lib/python3.12/site-packages/lightning/pytorch/strategies/strategy.py",
            "line": 390,
        },
        {"name": "main", "filename": "/home/user/memprofiler/examples/demo.py", "line": 203},
    ]
    kinds = [sf.frame_kind(f["name"], f["filename"]) for f in frames]
    # THEN the user's project (a directory named memprofiler) stays the user's code, our own
    # package's files and Lightning's are dispatch, torch's `inner` is plumbing
    assert kinds[0] == kinds[2] == kinds[5] == sf.PYTHON | sf.USER
    assert kinds[3] == kinds[4] == sf.PYTHON | sf.INTERNAL | sf.DISPATCH
    assert kinds[1] == sf.PYTHON | sf.INTERNAL
    # AND the default view shows the user's frames only, the label being the innermost
    assert [f["line"] for f in sf.readable(frames)] == [56, 133, 203]
    assert sf.label_index(kinds) == 0
    # AND a block allocated by Lightning itself is labelled by the script above it, not by Lightning
    assert sf.label_index(kinds[4:]) == 1
    # AND optimizer code called by Lightning labels its own blocks rather than the script
    adam = {"name": "_init_group", "filename": "/usr/lib/python3.12/site-packages/torch/optim/adam.py"}
    assert sf.label_index([sf.frame_kind(adam["name"], adam["filename"]), *kinds[4:]]) == 0


def test_allocations_without_a_python_stack_are_named_by_their_span():
    # GIVEN the demo's recording: the autograd engine's allocations carry no Python frame, and
    # Lightning's profiler kept its spans in external_annotations
    data = load_snapshot(RUNS / "demo" / "cuda_alloc_rank_0.training_step.4.end.pickle")
    bare = [e for e in data["device_traces"][0] if e["action"] == "alloc" and not e.get("frames")]
    assert len(bare) == 457
    # THEN the explorer labels each by the span it was made in: Lightning's backward
    table = StackTable()
    (rep,) = replay(data, table)
    labels = [
        table.strings[table.frames[table.labels[s]][0]] for s in rep.stack.tolist() if table.labels[s] >= 0
    ]
    during = "no Python stack, during [pl][profile][Strategy]SingleDeviceStrategy.backward"
    assert labels.count(during) == 457
    # AND the terminal table groups the 54 blocks (37,022,720 B) live at the peak under it, where
    # it said "(no stack recorded)"
    (dev,) = analyze(data).devices
    groups = {g.frames: (g.bytes, g.count) for g in dev.top_stacks}
    assert groups[(during,)] == (37_022_720, 54)
    assert ("(no stack recorded)",) not in groups
