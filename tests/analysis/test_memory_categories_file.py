"""The memory-categories reader: exact figures from a known file, and hostile files refused in
one line, in bounded memory (depth, gzip bombs, wrong shapes)."""

from __future__ import annotations

import gzip
import json
import tracemalloc
from pathlib import Path

import pytest

from memprofiler import layout
from memprofiler.analysis.traces import memory_categories
from memprofiler.analysis.traces.memory_categories import read_category_file
from memprofiler.errors import ArtifactError

CATS = ["parameter", "gradient", "activation", "unknown"]


def _doc(rows: list[list[int]]) -> dict[str, object]:
    return {"format": layout.MEMORY_CATEGORIES_FORMAT, "categories": CATS, "devices": {"cpu": rows}}


def test_a_known_file_gives_its_peak_and_live_tensors(tmp_path):
    # GIVEN a parameter of 4 KiB before profiling, an activation of 1 MiB allocated at 10 us
    # and freed at 30 us, a gradient of 4 KiB at 20 us
    rows = [[-1, 4096, 1, 0, 0], [10, 1 << 20, 2, 0, 2], [20, 4096, 3, 0, 1], [30, -(1 << 20), 2, 0, 2]]
    path = tmp_path / "c.memory_categories.json.gz"
    path.write_bytes(gzip.compress(json.dumps(_doc(rows)).encode()))
    (tl,) = read_category_file(path)
    # THEN the peak is all three live, at 20 us (10 us after t0), each category exact
    assert tl.peak_bytes == 4096 + (1 << 20) + 4096
    assert tl.peak_ms == pytest.approx(0.01)
    assert tl.peak_by_category == {"parameter": 4096, "gradient": 4096, "activation": 1 << 20, "unknown": 0}
    assert tl.live_at_peak[0] == (2, 0, "activation", 1 << 20)


def test_a_file_nested_a_million_deep_is_one_line(tmp_path):
    path = tmp_path / "deep.memory_categories.json"
    path.write_text("[" * 1_000_000 + "]" * 1_000_000)
    with pytest.raises(ArtifactError, match=r"deep\.memory_categories\.json: nested deeper than") as err:
        read_category_file(path)
    assert "\n" not in str(err.value)


def test_a_gzip_bomb_is_refused_after_reading_the_limit_in_bounded_memory(tmp_path, monkeypatch):
    # GIVEN a limit of 1 MiB and a 64 MiB gzip'd file of spaces (about 64 KB on disk)
    monkeypatch.setattr(memory_categories, "MAX_FILE_BYTES", 1 << 20)
    path = tmp_path / "bomb.memory_categories.json.gz"
    with gzip.open(path, "wb") as f:
        for _ in range(64):
            f.write(b" " * (1 << 20))
    assert path.stat().st_size < 1 << 20
    # WHEN read THEN one line naming the limit, and memory stays near the limit, not the 64 MiB
    tracemalloc.start()
    try:
        with pytest.raises(
            ArtifactError, match=r"bomb\.memory_categories\.json\.gz: expands to more than 1 MiB"
        ):
            read_category_file(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20


@pytest.mark.parametrize(
    "doc",
    [
        {"format": layout.MEMORY_CATEGORIES_FORMAT, "categories": 7, "devices": {"cpu": [[1, 2, 3, 4, 0]]}},
        {"format": layout.MEMORY_CATEGORIES_FORMAT, "categories": CATS, "devices": {"cpu": [{"a": 1}]}},
        {
            "format": layout.MEMORY_CATEGORIES_FORMAT,
            "categories": CATS,
            "devices": {"cpu": [[1e400, 1, 1, 1, 0]]},
        },
        {"format": layout.MEMORY_CATEGORIES_FORMAT, "categories": CATS, "devices": {"cpu": 5}},
    ],
)
def test_wrong_shapes_are_one_line(tmp_path, doc):
    path = tmp_path / "odd.memory_categories.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ArtifactError, match=r"odd\.memory_categories\.json: ") as err:
        read_category_file(path)
    assert "\n" not in str(err.value)


def test_a_truncated_gzip_is_one_line(tmp_path):
    path = tmp_path / "cut.memory_categories.json.gz"
    path.write_bytes(
        gzip.compress(json.dumps(_doc([[i, i * 7919 % 10007, i, 0, 0] for i in range(5000)])).encode())[:2000]
    )
    with pytest.raises(ArtifactError, match="not a readable memory categories file"):
        read_category_file(Path(path))
