"""Window-close cost with a remote ``save_dir`` (S3 on a local moto server) against a local one.

Three profilers on one shared tiny model, stepped in random interleaved order: two local ones
(the A/A pair: the noise floor) and one writing to ``s3://`` on moto's standalone server,
started in its own process on 127.0.0.1. A window closes every other call. Reported per
variant: the time ``finish()`` takes on the calls that close a window (what training waits
for), over the first and the last 200 windows; for S3 also how long the store takes to hold a
window once closed (a synchronous upload of what changed, measured after the interleaved run,
at the run's final file sizes), and the size of what each window close uploads.

Prints one JSON object. Usage:
``MALLOC_ARENA_MAX=1 python benchmarks/remote_window_close.py [--windows 1000] [--out FILE]``.
"""

from __future__ import annotations

import argparse
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from _emit import emit
from torch import nn

from memprofiler import MemProfiler

CONFIG = {"schedule": {"wait": 1, "warmup": 0, "active": 1, "repeat": 0}}


def _start_moto() -> tuple[subprocess.Popen[bytes], str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
            break
        except OSError:
            time.sleep(0.05)
    return proc, endpoint


def _close_ms(prof: MemProfiler, model: nn.Module, x: torch.Tensor) -> float | None:
    """One call; the milliseconds ``finish()`` took when it closed a window, else ``None``."""
    run = prof.begin("training_step", model)
    loss = model(x).sum()
    t0 = time.perf_counter()
    if run is not None:
        prof.finish(run, True)
    spent = (time.perf_counter() - t0) * 1e3
    loss.backward()
    prof.step_end()
    return spent if run is not None else None


def _summary(closes: list[float]) -> dict[str, float]:
    return {
        "close_ms_first_200": round(statistics.mean(closes[:200]), 3),
        "close_ms_last_200": round(statistics.mean(closes[-200:]), 3),
        "close_ms_median": round(statistics.median(closes), 3),
    }


def run(windows: int) -> dict[str, Any]:
    import s3fs

    bucket = f"bench-{windows}"
    s3fs.S3FileSystem(skip_instance_cache=True).mkdir(bucket)
    model = nn.Linear(64, 64)
    x = torch.randn(8, 64)
    with tempfile.TemporaryDirectory() as tmp:
        profs = {
            "local_a": MemProfiler(CONFIG, save_dir=Path(tmp) / "a", rank=0).setup(model),
            "local_b": MemProfiler(CONFIG, save_dir=Path(tmp) / "b", rank=0).setup(model),
            "s3": MemProfiler(CONFIG, save_dir=f"s3://{bucket}/run", rank=0).setup(model),
        }
        closes: dict[str, list[float]] = {k: [] for k in profs}
        rng = random.Random(0)
        for _ in range(2 * windows):
            order = list(profs)
            rng.shuffle(order)
            for name in order:
                spent = _close_ms(profs[name], model, x)
                if spent is not None:
                    closes[name].append(spent)
        mirror = profs["s3"]._mirror
        assert mirror is not None
        mirror.sync(wait=True)
        # What the store costs per window when waited for: upload what one more window changed.
        sync_ms, sizes = [], []
        for _ in range(50):
            for _ in range(2):
                _close_ms(profs["s3"], model, x)
            changed = mirror._changed()
            sizes.append(sum(len(d) for d, _ in changed.values()))
            t0 = time.perf_counter()
            mirror.sync(wait=True)
            sync_ms.append((time.perf_counter() - t0) * 1e3)
        stats_bytes = (profs["s3"].save_dir / "rank_0_memory_stats.yaml").stat().st_size
        for prof in profs.values():
            prof.teardown()
    result: dict[str, Any] = {"windows": windows, "calls": 2 * windows}
    for name, values in closes.items():
        result[name] = _summary(values)
    result["s3_over_local_median"] = round(
        result["s3"]["close_ms_median"] / result["local_a"]["close_ms_median"], 2
    )
    result["aa_ratio_median"] = round(
        result["local_b"]["close_ms_median"] / result["local_a"]["close_ms_median"], 2
    )
    result["s3_upload_per_window_ms_median"] = round(statistics.median(sync_ms), 2)
    result["s3_upload_bytes_per_window_at_end"] = int(statistics.median(sizes))
    result["stats_yaml_bytes_at_end"] = stats_bytes
    result["s3_failures"] = mirror.failures
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--windows", type=int, nargs="+", default=[1000])
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    # One server for every run: s3fs caches its filesystem object, endpoint included.
    proc, endpoint = _start_moto()
    os.environ.update(
        AWS_ACCESS_KEY_ID="bench",
        AWS_SECRET_ACCESS_KEY="bench",
        AWS_DEFAULT_REGION="us-east-1",
        AWS_ENDPOINT_URL=endpoint,
    )
    try:
        emit({"runs": [run(w) for w in args.windows]}, args.out)
    finally:
        proc.terminate()
        proc.wait()


if __name__ == "__main__":
    main()
