"""The explorer of a real OOM record in headless Chromium: it opens on the failure."""

from __future__ import annotations

from pathlib import Path

import pytest

from browser import BROWSER_MARKS, open_page
from memprofiler.__main__ import main
from memprofiler.analysis.snapshot.summary import analyze, load_snapshot

pytestmark = BROWSER_MARKS

PICKLE = Path(__file__).parents[1] / "fixtures" / "gpu_oom_run" / "oom_rank_0_0.pickle"


@pytest.fixture(scope="module")
def oom_html(tmp_path_factory):
    out = tmp_path_factory.mktemp("oom") / "oom.html"
    assert main(["snapshot", str(PICKLE), "--html", str(out)]) == 0
    return out


def _ready(view):
    for _ in range(600):
        if view.eval("() => !!(window.mpExplorer && window.mpExplorer.ready)") or view.errors:
            break
        view.page.wait_for_timeout(50)
    assert view.eval("() => !!(window.mpExplorer && window.mpExplorer.ready)"), view.errors
    return view


def test_the_page_opens_on_the_oom(oom_html):
    # GIVEN the analysis of the recorded OOM pickle: its last entry is the failed 400 GiB request
    (dev,) = analyze(load_snapshot(PICKLE)).devices
    (oom,) = dev.ooms
    assert (oom.index, oom.size, oom.device_free) == (261, 429_496_729_600, 149_121_204_224)
    # WHEN Chromium opens its explorer
    with open_page(oom_html, wait_ms=0) as view:
        x = _ready(view).eval(
            "({sel: mpExplorer.sel, view: mpExplorer.view, tree: mpExplorer.treeTotal,"
            " banner: document.getElementById('mp-oom').innerText,"
            " bannerTop: document.getElementById('mp-oom').getBoundingClientRect().top,"
            " canvasTop: document.getElementById('mp-main').getBoundingClientRect().top,"
            " instant: document.getElementById('mp-instant').innerText,"
            " treeHead: document.getElementById('mp-tree').innerText})"
        )
        # (the OOM button brings the opening view back after zooming out)
        view.page.click("#mp-reset")
        view.page.wait_for_timeout(100)
        whole = view.eval("mpExplorer.view")
        view.page.click("#mp-gooom")
        view.page.wait_for_timeout(100)
        back = view.eval("({view: mpExplorer.view, sel: mpExplorer.sel})")
    assert view.errors == [] and view.offsite == []
    # THEN the banner, above the timeline and in view, states the figures exactly
    assert x["bannerTop"] < x["canvasTop"] < 900
    banner = " ".join(x["banner"].split())
    assert "Out of memory on device 0 at entry 261" in banner
    assert "400.00 GiB requested, 138.88 GiB free of 139.80 GiB total" in banner
    assert "step 3" in banner and "training_step (gpu_oom.py:12)" in banner
    # the timeline shows the last entries before the failure, not the whole trace
    assert x["view"] == [197, 262] and whole == [0, 262]
    # the selected instant is the failure, and the live tree sums what was live then
    assert x["sel"] == oom.index == 261
    assert x["tree"] == dev.end_allocated == 202_489_856  # nothing was freed after the OOM entry
    assert "entry 261" in x["instant"] and "193.11 MiB" in x["treeHead"]
    assert back == {"view": [197, 262], "sel": 261}
