"""Environment for test subprocesses: our sources first, no inherited launcher variables."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

# Set by launchers (torchrun, SLURM, Lightning's own) or left behind by in-process runs: a child
# that inherits them believes it was launched as one rank of a job and waits for its peers.
_LAUNCHER_VARS = (
    "RANK",
    "LOCAL_RANK",
    "GROUP_RANK",
    "NODE_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
    "SLURM_JOB_ID",
    "SLURM_NTASKS",
    "SLURM_PROCID",
)


_TESTS = Path(__file__).resolve().parent
_SRC = _TESTS.parent / "src"


def subprocess_env(*paths: Path | str, **extra: str) -> dict[str, str]:
    """``os.environ`` minus launcher variables, with ``paths`` and the tests' helper folder
    prepended to ``PYTHONPATH`` (scripts under ``tests/*/`` import ``conftest``, ``fake_cuda``)."""
    env = {k: v for k, v in os.environ.items() if k not in _LAUNCHER_VARS and not k.startswith("PL_")}
    parts = [str(p) for p in paths] + [str(_TESTS)]
    if env.get("PYTHONPATH"):
        parts.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(parts)
    env.update(extra)
    return env


def run_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """The real ``memprofiler`` command in a fresh process, on our sources (the caller's other
    environment, AWS variables included, inherited)."""
    return subprocess.run(
        [sys.executable, "-m", "memprofiler", *args],
        env=subprocess_env(_SRC),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
