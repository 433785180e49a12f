"""The allocation explorer in real headless Chromium (Playwright), offline: what a user sees and does.

Needs Debian's ``chromium`` (``.ci/run`` installs it); skipped with a reason where none is found.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from browser import BROWSER_MARKS, open_page
from memprofiler.__main__ import main
from memprofiler.analysis.snapshot.summary import analyze, load_snapshot
from memprofiler.units import format_bytes
from snapshot_fixtures import KNOWN, known_snapshot

pytestmark = BROWSER_MARKS

REAL = Path(__file__).parents[1] / "fixtures" / "gpu_transformer_forward_mixed.pickle"


def _open(view):
    # Polled from here: the page's policy forbids the eval that wait_for_function's string uses.
    for _ in range(1200):
        if view.eval("() => !!(window.mpExplorer && window.mpExplorer.ready)") or view.errors:
            break
        view.page.wait_for_timeout(50)
    assert view.eval("() => !!(window.mpExplorer && window.mpExplorer.ready)"), view.errors
    return view


@pytest.fixture(scope="module")
def real_html(tmp_path_factory):
    out = tmp_path_factory.mktemp("explorer") / "real.html"
    assert main(["snapshot", str(REAL), "--html", str(out)]) == 0
    return out


def test_real_capture_opens_offline_with_the_analysis_peak(real_html):
    # GIVEN the explorer of the real GPU capture, and the terminal analysis of the same file
    (dev,) = analyze(load_snapshot(REAL)).devices
    # WHEN Chromium opens it from file:// with every other request refused
    with open_page(real_html, wait_ms=0) as view:
        x = _open(view).eval(
            "({peak: mpExplorer.peak, at: mpExplorer.peakAt, tree: mpExplorer.treeTotal, sel: mpExplorer.sel,"
            " top: mpExplorer.treeTop, text: document.body.innerText, segs: mpExplorer.state.segments})"
        )
    # THEN nothing failed and nothing left the page
    assert view.errors == [] and view.offsite == []
    # the peak the page computes from its own data is the analysis's, at the same entry
    assert x["peak"] == dev.peak_allocated == 23_873_313_792
    assert x["at"] == x["sel"] == dev.peak_allocated_index
    assert (
        f"peak active {format_bytes(dev.peak_allocated)} at entry {dev.peak_allocated_index:,}" in x["text"]
    )
    # the live tree at the peak sums to the peak, largest first, labelled by the user's frames
    assert x["tree"] == dev.peak_allocated
    assert x["top"][0] == ["(no stack recorded)", dev.top_stacks[0].bytes]
    assert x["top"][1][0] == "forward (transformer.py:22)"
    assert "torch::unwind" not in x["text"]
    assert x["segs"] == 688


def test_hover_shows_size_and_frame_and_click_pins_the_stack(real_html):
    with open_page(real_html, wait_ms=0) as view:
        _open(view)
        # GIVEN the largest block allocated in the trace
        i = view.eval(
            "(() => { let best = -1, s = -1; for (let i = 0; i < mpExplorer.blockCount(); i++) {"
            " const b = mpExplorer.block(i); if (b.start >= 0 && b.size > s) { s = b.size; best = i; } } return best; })()"
        )
        block = view.eval(f"mpExplorer.block({i})")
        where = view.eval(f"mpExplorer.locate({i})")
        assert where is not None
        # WHEN the mouse hovers where the page draws it
        view.page.mouse.move(where["x"], where["y"])
        tip = view.page.inner_text("#mp-tip")
        # THEN the tooltip gives its size and its user frame
        assert format_bytes(block["size"]) in tip and f"{int(block['size']):,} bytes" in tip
        assert block["label"] in tip and "transformer.py" in block["label"]
        # and a click pins its stack, Python frames first, internal frames hidden until asked
        view.page.mouse.click(where["x"], where["y"])
        pin = view.page.inner_text("#mp-pin")
        assert block["label"] in pin and "CUDACachingAllocator" not in pin and "internal frames hidden" in pin
        view.page.check("#mp-all")
        view.page.mouse.click(where["x"], where["y"])
        assert "CUDACachingAllocator" in view.page.inner_text("#mp-pin")
    assert view.errors == [] and view.offsite == []


def test_wheel_zoom_and_drag_pan_change_the_visible_range(real_html):
    with open_page(real_html, wait_ms=0) as view:
        _open(view)
        before = view.eval("mpExplorer.view")
        box = view.page.locator("#mp-main").bounding_box()
        view.page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
        # WHEN the wheel zooms in around the middle
        view.page.mouse.wheel(0, -600)
        view.page.wait_for_timeout(100)
        zoomed = view.eval("mpExplorer.view")
        # THEN the visible range narrows inside the old one
        assert zoomed[1] - zoomed[0] < (before[1] - before[0]) / 2
        assert before[0] <= zoomed[0] < zoomed[1] <= before[1]
        # and a drag to the right pans to earlier entries
        x0, y0 = box["x"] + box["width"] / 2, box["y"] + 50
        view.page.mouse.move(x0, y0)
        view.page.mouse.down()
        view.page.mouse.move(x0 + 200, y0, steps=5)
        view.page.mouse.up()
        view.page.wait_for_timeout(100)
        panned = view.eval("mpExplorer.view")
        assert panned[0] < zoomed[0]
        assert panned[1] - panned[0] == pytest.approx(zoomed[1] - zoomed[0])
    assert view.errors == [] and view.offsite == []


def test_known_snapshot_tree_and_allocator_state(tmp_path):
    # GIVEN the hand-built snapshot with worked answers
    src = tmp_path / "known.pickle"
    src.write_bytes(pickle.dumps(known_snapshot(), protocol=5))
    out = tmp_path / "known.html"
    assert main(["snapshot", str(src), "--html", str(out)]) == 0
    with open_page(out, wait_ms=0) as view:
        _open(view)
        # (its trace ends in an OOM, so the page opens there: go to the peak)
        assert view.eval("mpExplorer.sel") == 9  # the oom entry
        view.page.click("#mp-gopeak")
        view.page.wait_for_timeout(50)
        x = view.eval("({peak: mpExplorer.peak, top: mpExplorer.treeTop, state: mpExplorer.state})")
    assert view.errors == [] and view.offsite == []
    # THEN the peak and the live stacks are the worked ones, labelled by their user frame
    assert x["peak"] == KNOWN["peak_allocated"]
    assert sorted(b for _, b in x["top"]) == sorted(b for b, _ in KNOWN["stacks"])
    assert ["linear_forward (linear_forward.py:10)", 1280 * 1024] in x["top"]
    # and at the peak (entry 5) segments A, B, C are reserved (D comes at entry 10)
    assert x["state"]["segments"] == 3 and x["state"]["reserved"] == 4 * 1024 * 1024


def test_a_zoomed_view_draws_exactly_the_blocks_of_its_level_that_it_overlaps(real_html):
    # GIVEN the real capture's blocks and levels, computed here from the analysis side
    from memprofiler.analysis.snapshot.lod import level_of_detail
    from memprofiler.analysis.snapshot.replay import StackTable, replay

    data = load_snapshot(REAL)
    rep = replay(data, StackTable())[0]
    level = level_of_detail(rep, analyze(data).devices[0].peak_allocated).level
    with open_page(real_html, wait_ms=0) as view:
        _open(view)
        n = rep.instants
        for a, b in [(0, n), (n / 3, n / 3 + n / 16), (n / 2, n / 2 + 40), (n - 100, n)]:
            # WHEN the view moves there
            drawn = view.eval(
                f"(() => {{ mpExplorer.setView({a}, {b}); mpExplorer.redraw(); return mpExplorer.drawnBlocks(); }})()"
            )
            t0, t1 = view.eval("mpExplorer.view")
            lv = view.eval("mpExplorer.level")
            # THEN it drew every block of its level or above alive in the view, and no other
            lo, hi = int(t0 // 1), -int(-t1 // 1)
            want = [
                i for i in range(rep.start.size) if level[i] >= lv and rep.start[i] <= hi and rep.end[i] > lo
            ]
            assert drawn == want and want
    assert view.errors == [] and view.offsite == []


def test_a_window_recording_opens_on_its_call_with_roles_as_categories(tmp_path):
    import sys

    sys.path.insert(0, str(Path(__file__).parents[1] / "commands"))
    from test_cmd_snapshot import _window_recording

    # GIVEN a window recording over the fake allocator (calls 2-3 marked, a Linear's weight and
    # bias alive before it began), its explorer opened on call 3
    path = _window_recording(tmp_path)
    out = tmp_path / "w.html"
    assert main(["snapshot", str(path), "--call", "train_step:3", "--html", str(out)]) == 0
    with open_page(out, wait_ms=0) as view:
        x = _open(view).eval(
            "({call: mpExplorer.call, range: mpExplorer.callRange, text: document.body.innerText,"
            " top: mpExplorer.treeTop, picker: document.getElementById('mp-call').value})"
        )
    assert view.errors == [] and view.offsite == []
    # THEN the page selected call 3 and shades its entries (7 to 9 of the recording: entry 6 is the
    # snapshot that looked at the ring after call 2)
    assert x["call"] == "train_step:3" and x["range"] == [7, 10] and x["picker"] == "1"
    assert "call train_step:3: entries 7 - 9" in x["text"]
    # AND the live tree lists the blocks older than the recording by role, not as no stack
    labels = [label for label, _ in x["top"]]
    assert "parameter" in labels and "(no stack recorded)" not in labels


def test_the_peak_label_stays_inside_the_plot_and_the_timeline_has_a_colour_legend(real_html):
    # GIVEN the real capture, whose peak is at entry 5,989 of 5,992: the plot's right edge
    with open_page(real_html, wait_ms=0) as view:
        _open(view)
        view.page.click("#mp-reset")
        view.page.click("#mp-gopeak")
        view.page.wait_for_timeout(100)
        # WHEN the whole trace is drawn
        start, end, right = view.eval("mpExplorer.peakLabel")
        # THEN the label "peak 22.23 GiB" ends inside the plot, left of its line (it was put
        # 90 px from the edge whatever its width, and ran 4 px past it)
        assert view.eval("mpExplorer.peakAt") == 5989
        assert 0 <= start < end <= right
        # AND a legend names the colours of the stacks live at the selected instant
        legend = view.eval("mpExplorer.legend")
        text = view.page.inner_text("#mp-legend")
    assert len(legend) == 8 and all(color.startswith("#") for _, color, _ in legend)
    assert legend[0][0] in text and "grey band" in text and "reserved (lower chart)" in text
    assert view.errors == [] and view.offsite == []
