"""What every benchmark ends with: one record in one schema, printed and saved.

A record names what ran and where, beside the figures::

    {"benchmark": "scaling", "hardware": "cpu", "date": "2026-11-28", "commit": "1a2b3c4",
     "command": "python benchmarks/scaling.py --out benchmarks/results", "machine": {...},
     "result": {...the benchmark's own figures...}}

and is saved as ``<benchmark>_<hardware>_<yyyymmdd>.json``: ``--out DIR`` names the file so,
``--out FILE`` takes the name given. ``hardware`` is ``cpu``, or the GPU the benchmark ran on
(``h200`` for an NVIDIA H200).
"""

from __future__ import annotations

import datetime as dt
import json
import platform
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
#: The keys of a record, in order (``tests/test_benchmark_results.py`` holds every file to it).
KEYS = ("benchmark", "hardware", "date", "commit", "command", "machine", "result")
#: How a result file is named.
NAME = re.compile(r"^(?P<benchmark>[A-Za-z0-9_-]+?)_(?P<hardware>cpu|[a-z]+[0-9]+[a-z0-9]*)_(?P<date>\d{8})$")


def machine_info() -> dict[str, str]:
    """Versions and machine, for the record beside the figures."""
    info = {"python": platform.python_version(), "machine": platform.machine()}
    try:
        import torch

        info["torch"] = torch.__version__
    except ImportError:
        pass
    return info


def hardware() -> str:
    """``cpu``, or the short name of the first GPU (``NVIDIA H200`` -> ``h200``)."""
    try:
        import torch

        if torch.cuda.is_available():
            name = torch.cuda.get_device_name(0).lower().replace("nvidia", "")
            return re.sub(r"[^a-z0-9]", "", name.split("-")[0]) or "gpu"
    except ImportError:
        pass
    return "cpu"


def commit() -> str:
    """The checkout's commit (``+`` when it has changes not committed), or ``unknown``."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True).stdout.strip()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+" if dirty else "")


def record(benchmark: str, result: dict[str, Any], hw: str | None = None) -> dict[str, Any]:
    """``result`` in the one schema, stamped with today's date (UTC), the commit and the command."""
    return {
        "benchmark": benchmark,
        "hardware": hw or hardware(),
        "date": dt.datetime.now(dt.timezone.utc).date().isoformat(),
        "commit": commit(),
        "command": " ".join(["python", *sys.argv]),
        "machine": machine_info(),
        "result": result,
    }


def result_path(rec: dict[str, Any], out: Path) -> Path:
    """Where ``rec`` is saved: ``out`` itself, or ``out/<benchmark>_<hardware>_<yyyymmdd>.json``."""
    if out.suffix == ".json":
        return out
    return out / f"{rec['benchmark']}_{rec['hardware']}_{rec['date'].replace('-', '')}.json"


def emit(result: dict[str, Any], out: Path | None, benchmark: str | None = None) -> None:
    """Print ``result`` as a record (see the module); also save it under ``out``.

    ``benchmark``: the name of the benchmark, by default the script's (``scaling`` for
    ``benchmarks/scaling.py``); a variant of it gets its own (``scaling-compiled``).
    """
    rec = record(benchmark or Path(sys.argv[0]).stem, result)
    text = json.dumps(rec, indent=2)
    print(text)
    if out is not None:
        path = result_path(rec, out)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")


def read_result(path: Path) -> dict[str, Any]:
    """The figures of a result file (its ``result``)."""
    return json.loads(path.read_text())["result"]
