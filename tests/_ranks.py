"""Start a gloo job of N CPU processes the way torchrun or SLURM would: one helper for every test."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from _env import subprocess_env

SRC = Path(__file__).resolve().parents[1] / "src"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch(
    argv: Callable[[int], Sequence[str]], world: int = 2, timeout: float = 240
) -> list[subprocess.CompletedProcess[str]]:
    """Run ``python *argv(rank)`` on ``world`` ranks with the rank environment set; wait for all.

    Every process is killed if one outlives ``timeout``. Output is stdout and stderr together.
    """
    port = free_port()
    procs = []
    for rank in range(world):
        env = subprocess_env(
            SRC,
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            WORLD_SIZE=str(world),
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            NODE_RANK="0",
            OMP_NUM_THREADS="1",
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, *argv(rank)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    results = []
    try:
        for p in procs:
            stdout, _ = p.communicate(timeout=timeout)
            results.append(subprocess.CompletedProcess(p.args, p.returncode, stdout, ""))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return results


def rank_results(module: str | Path, call: str, out: Path, world: int = 2, timeout: float = 240) -> list[Any]:
    """Run ``call`` (``_worker(...)``) of the test module ``module`` on ``world`` gloo ranks, where
    each rank writes ``out/rank<r>.json``; what they wrote, rank by rank. A rank that fails fails
    the test with the end of its output."""
    module = Path(module)
    out.mkdir(parents=True, exist_ok=True)
    code = f"import sys; sys.path.insert(0, {str(module.parent)!r}); import {module.stem} as t; t.{call}"
    for done in launch(lambda rank: ["-c", code], world, timeout):
        assert done.returncode == 0, done.stdout[-3000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]
