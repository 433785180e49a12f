"""The report of one recorded run, rendered to text: the golden files every change must keep.

The run is the H200 demo (``fixtures/gpu_demo_run``: stats, trace, memory by category) with the
allocator histories of ``fixtures/gpu_runs/demo`` and the OOM record of ``fixtures/gpu_oom_run``
beside it, so the report, its profiler views and three explorer pages are all drawn.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import shutil
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent / "fixtures"
GOLDEN = FIXTURES / "reports"
SOURCES = (FIXTURES / "gpu_demo_run", FIXTURES / "gpu_runs" / "demo", FIXTURES / "gpu_oom_run")
PLACE = "<tmp>"


def render(tmp: Path) -> dict[str, str]:
    """Every page ``memprofiler report`` writes for the demo run, and its terminal output, by name.

    The temporary directory's path is written as ``<tmp>`` so the text is the same wherever it runs.
    """
    from memprofiler.__main__ import main

    run = tmp / "run"
    run.mkdir()
    for src in SOURCES:
        for f in sorted(src.iterdir()):
            shutil.copy(f, run / f.name)
    out = tmp / "out"
    out.mkdir()
    terminal = io.StringIO()
    with contextlib.redirect_stdout(terminal):
        assert main(["report", str(run), "-o", str(out / "report.html")]) == 0
    pages = {"terminal.txt": terminal.getvalue()}
    for page in sorted(out.rglob("*.html")):
        pages[page.relative_to(out).as_posix()] = page.read_text(encoding="utf-8")
    return {name: text.replace(str(tmp), PLACE) for name, text in pages.items()}


def golden_file(name: str) -> Path:
    return GOLDEN / (name.replace("/", "__") + ".gz")


def write(pages: dict[str, str]) -> None:
    GOLDEN.mkdir(parents=True, exist_ok=True)
    for old in GOLDEN.glob("*.gz"):
        old.unlink()
    for name, text in pages.items():
        with gzip.GzipFile(golden_file(name), "wb", mtime=0) as f:
            f.write(text.encode("utf-8"))


def read() -> dict[str, str]:
    return {
        p.name.removesuffix(".gz").replace("__", "/"): gzip.decompress(p.read_bytes()).decode("utf-8")
        for p in sorted(GOLDEN.glob("*.gz"))
    }
