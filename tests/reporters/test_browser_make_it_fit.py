"""The report's "make it fit" section in headless Chromium: the blocks by their exact saved bytes,
what each row takes off the peak at most, and the lines that checkpoint them."""

from __future__ import annotations

import itertools
import shutil
from pathlib import Path

import yaml
from fit_run import block_saved, collect, mlps

from browser import BROWSER_MARKS, open_page
from memprofiler.__main__ import main
from memprofiler.units import format_bytes

pytestmark = BROWSER_MARKS

DEMO = Path(__file__).parents[1] / "fixtures" / "gpu_demo_run"
ORDER = [2, 0, 3, 1]

_ROWS = """
(() => { const h = document.getElementById("advice"); let el = h.nextElementSibling;
  while (el && el.tagName !== "TABLE") el = el.nextElementSibling;
  return Array.from(el.tBodies[0].rows).map((tr) => Array.from(tr.cells).map((c) => c.innerText)); })()
"""


def _open(run: Path, tmp_path: Path) -> tuple[list[list[str]], str, list[str]]:
    html = tmp_path / "report.html"
    assert main(["report", str(run), "-o", str(html)]) == 0
    with open_page(html) as view:
        rows = view.eval(_ROWS)
        patch = view.page.inner_text("pre.mp-patch")
        order = view.eval("Array.from(document.querySelectorAll('h2')).map((h) => h.id)")
    assert view.errors == [] and view.offsite == []
    return rows, patch, order


def test_the_blocks_are_listed_by_their_exact_saved_bytes_after_where_memory_goes(tmp_path):
    # GIVEN a collected step of four MLP blocks whose saved bytes are known
    collect(mlps(), tmp_path / "run")
    end = yaml.safe_load((tmp_path / "run" / "rank_0_memory_stats.yaml").read_text())
    peak = end["0.training_step.1.end"]["rss_peak"]
    activations = min(
        end["0.training_step.1.end"]["saved_tensors.unique_bytes"],
        peak - end["0.training_step.1.start"]["rss"],
    )
    # WHEN Chromium opens its report
    rows, patch, order = _open(tmp_path / "run", tmp_path)
    # THEN "make it fit" follows "where memory goes"
    assert order[:2] == ["where", "advice"]
    # AND each block's row is its saved bytes, and the peak less the blocks so far (at most the activations)
    off = [min(c, activations) for c in itertools.accumulate(block_saved(i) for i in ORDER)]
    assert rows == [
        [f"blocks.{i}", format_bytes(block_saved(i)), format_bytes(o), format_bytes(peak - o)]
        for i, o in zip(ORDER, off, strict=True)
    ]
    # AND the patch wraps them in that order, one line per row
    wraps = [line.split(" = ")[0] for line in patch.splitlines() if "= checkpoint_wrapper(" in line]
    assert wraps == [f"root.blocks[{i}]" for i in ORDER]


def test_the_demo_run_proposes_its_four_equal_blocks_off_its_cuda_peak(tmp_path):
    # GIVEN the recorded H200 demo run: four blocks of 8.03 MiB saved each, a 113.38 MiB peak
    run = tmp_path / "run"
    shutil.copytree(DEMO, run)
    rows, patch, _ = _open(run, tmp_path)
    # THEN every block takes its saved bytes off the peak (34.15 MiB of activations held there)
    assert [r[0] for r in rows] == [f"model.blocks.{i}" for i in range(4)]
    assert [r[3] for r in rows] == ["105.35 MiB", "97.32 MiB", "89.29 MiB", "81.26 MiB"]
    assert "root.model.blocks[3] = checkpoint_wrapper(root.model.blocks[3])" in patch
