"""The `memprofiler` console script: one BLAS thread for numpy unless the user chose otherwise."""

from __future__ import annotations

import os
import subprocess
import sys

from memprofiler import __main__ as entry


def test_the_console_script_gives_numpy_one_blas_thread_unless_told_otherwise(monkeypatch, capsys):
    # GIVEN no BLAS thread count in the environment
    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    # WHEN the console script runs (no command: it prints its help)
    assert entry.console([]) == 2
    # THEN numpy's OpenBLAS will start one thread, not one per core
    assert os.environ["OPENBLAS_NUM_THREADS"] == "1"
    # AND a count the user set is left alone
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "8")
    entry.console([])
    assert os.environ["OPENBLAS_NUM_THREADS"] == "8"
    capsys.readouterr()


def test_main_called_from_python_leaves_the_environment_alone(monkeypatch, capsys):
    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    entry.main([])
    assert "OPENBLAS_NUM_THREADS" not in os.environ
    capsys.readouterr()


def test_python_dash_m_runs_the_console_script():
    # GIVEN `python -m memprofiler`, with no BLAS thread count set
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    code = "import runpy, os, sys; sys.argv = ['memprofiler', '--version']\n"
    code += "try:\n    runpy.run_module('memprofiler', run_name='__main__')\nexcept SystemExit:\n    pass\n"
    code += "print(os.environ.get('OPENBLAS_NUM_THREADS'))"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    # THEN it prints its version and numpy would get one BLAS thread
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[-1] == "1"
