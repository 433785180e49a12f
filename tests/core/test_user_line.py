"""Warnings carry the user's line, or none: never a line inside memprofiler, Lightning or torch."""

from __future__ import annotations

import subprocess
import sys
import threading
import warnings

import pytest
from torch import nn

from _env import subprocess_env
from conftest import TinyMLP, make_trainer
from memprofiler import MemProfiler, MemProfilerCallback
from memprofiler.core.method_wrap import Owner


def _typo_profiler(tmp_path):
    return MemProfiler({"collect_funcs": {"default": ["trainig_step"]}}, save_dir=tmp_path, rank=0).setup()


def _ours(caught):
    return [w for w in caught if "trainig_step" in str(w.message)]


def test_a_warning_from_a_call_in_the_users_code_points_at_that_line(tmp_path):
    prof = _typo_profiler(tmp_path)
    # WHEN the user's own line makes the profiler warn
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        line = sys._getframe().f_lineno + 1
        prof.wrap_methods([Owner("the model", nn.Linear(1, 1))])
    # THEN the warning is attributed to that line of this file
    (w,) = _ours(caught)
    assert (w.filename, w.lineno) == (__file__, line)
    prof.teardown()


def test_a_warning_from_inside_a_trainer_points_at_the_fit_call(tmp_path):
    # GIVEN the callback, whose set-up runs several frames deep in Lightning
    cb = MemProfilerCallback(
        {"collect_funcs": {"default": ["trainig_step"]}, "save_dir": str(tmp_path / "o")}
    )
    trainer = make_trainer(tmp_path, [cb], limit_train_batches=1)
    # WHEN fit warns at set-up
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        line = sys._getframe().f_lineno + 1
        trainer.fit(TinyMLP())
    # THEN the line is the user's `trainer.fit(...)`, not Lightning's nor ours
    (w,) = _ours(caught)
    assert (w.filename, w.lineno) == (__file__, line)


def test_with_no_user_frame_there_is_no_source_line(tmp_path):
    # GIVEN a warning raised on a thread that runs only library code
    prof = _typo_profiler(tmp_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t = threading.Thread(target=prof.wrap_methods, args=([Owner("the model", nn.Linear(1, 1))],))
        t.start()
        t.join()
    # THEN it names no file and no line
    (w,) = _ours(caught)
    assert (w.filename, w.lineno) == ("memprofiler", 0)
    prof.teardown()


@pytest.mark.slow
def test_a_script_prints_its_own_line_under_the_warning(tmp_path):
    # GIVEN a user's script that builds a profiler the way its docs show
    script = tmp_path / "train.py"
    script.write_text(
        "from torch import nn\n"
        "from memprofiler import MemProfiler\n"
        "from memprofiler.core.method_wrap import Owner\n"
        "prof = MemProfiler({'collect_funcs': {'default': ['trainig_step']}}, save_dir='o', rank=0).setup()\n"
        "prof.wrap_methods([Owner('the model', nn.Linear(1, 1))])  # the user's line\n"
        "prof.teardown()\n"
    )
    # WHEN it runs
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=subprocess_env(), cwd=tmp_path
    )
    # THEN the printed warning is followed by the user's line, not by one of memprofiler's
    lines = proc.stderr.splitlines()
    at = next(i for i, ln in enumerate(lines) if "names `trainig_step`" in ln)
    assert lines[at].startswith(f"{script}:5: MemProfilerWarning: memprofiler: `collect_funcs.default`")
    assert (
        lines[at + 1].strip() == "prof.wrap_methods([Owner('the model', nn.Linear(1, 1))])  # the user's line"
    )
    assert "self._collectors" not in proc.stderr
