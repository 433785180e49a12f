"""The explorer of an OOM record opens on the failure: banner figures from the recorded GPU run."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from memprofiler.__main__ import main
from memprofiler.reporters.explorer.oom import MIN_WINDOW, opening_window, user_frame

RUN = Path(__file__).parents[1] / "fixtures" / "gpu_oom_run"
PICKLE = RUN / "oom_rank_0_0.pickle"
GIB = 1024**3

# What the allocator wrote in the trace's last entry (the ``oom`` action) of the real H200 run.
REQUESTED = 429_496_729_600  # 400 GiB exactly
FREE = 149_121_204_224
# What only the record's YAML holds.
TOTAL = 150_109_880_320
STEP = 3


def _meta(html: str) -> dict:
    return json.loads(
        re.search(r"<script type='application/json' id='mp-meta'>(.*?)</script>", html).group(1)
    )


def test_the_banner_states_the_pickles_and_the_records_figures(tmp_path, capsys):
    # GIVEN the recorded OOM pickle with its record's YAML beside it
    out = tmp_path / "oom.html"
    # WHEN its explorer is written
    assert main(["snapshot", str(PICKLE), "--html", str(out)]) == 0
    html = out.read_text()
    banner = re.search(r"<div id='mp-oom'.*?</div>", html).group(0)
    text = re.sub(r"<[^>]+>", "", banner)
    # THEN the banner gives the failed size, free and total memory, the step and the user's frame
    assert REQUESTED == 400 * GIB
    assert f"data-requested='{REQUESTED}' data-free='{FREE}' data-total='{TOTAL}' data-index='261'" in banner
    assert "Out of memory on device 0 at entry 261" in text
    assert "400.00 GiB requested, 138.88 GiB free of 139.80 GiB total" in text
    # the failing call as the explorer numbers calls (from 1), the Trainer's step (from 0) beside it
    assert (
        f"in training_step call 4 (calls are numbered from 1, as the explorer marks them; Trainer step {STEP}, "
        "counted from 0)"
    ) in text
    assert "at training_step (gpu_oom.py:12)" in text and "/home/user/checks/gpu_oom.py:12" in banner
    # what was live when it failed is the trace's end state (the OOM is its last entry)
    assert "193.11 MiB active (requested), 194.00 MiB reserved" in text
    # and the page opens on the last entries before it, with the failing entry selected
    assert _meta(html)["initial"] == {"device": 0, "t0": 197, "t1": 262, "sel": 261}
    # the banner comes before the peaks line and the explorer, not in the folded tables
    assert html.index("id='mp-oom'") < html.index("id='mp-peaks'") < html.index("<details")


def test_without_its_yaml_the_banner_says_what_the_pickle_lacks(tmp_path):
    # GIVEN the pickle alone, renamed so no record sits beside it
    lone = tmp_path / "failure.pickle"
    shutil.copy(PICKLE, lone)
    out = tmp_path / "oom.html"
    assert main(["snapshot", str(lone), "--html", str(out)]) == 0
    text = re.sub(r"<[^>]+>", "", re.search(r"<div id='mp-oom'.*?</div>", out.read_text()).group(0))
    # THEN the pickle's own figures are there and the missing ones are named, not guessed
    assert "400.00 GiB requested, 138.88 GiB free (total: not in the pickle" in text
    assert "step not recorded (the OOM record's YAML has it)" in text


def test_a_history_without_an_oom_opens_on_the_whole_trace(tmp_path):
    out = tmp_path / "plain.html"
    real = Path(__file__).parents[1] / "fixtures" / "gpu_transformer_forward_mixed.pickle"
    assert main(["snapshot", str(real), "--html", str(out)]) == 0
    html = out.read_text()
    assert "id='mp-oom'" not in html and _meta(html)["initial"] is None


def test_the_opening_window_ends_just_past_the_failure():
    # a short trace: at least MIN_WINDOW entries, ending at the trace's end
    assert opening_window(261, 262) == (262 - MIN_WINDOW - 1, 262)
    # a long one: the last quarter of the entries up to it, a little past the failure
    assert opening_window(39_999, 100_000) == (40_000 + 312 - 10_000, 40_000 + 312)
    assert opening_window(99_999, 100_000) == (75_000, 100_000)
    # at the trace's start it cannot go below 0
    assert opening_window(3, 1_000)[0] == 0


def test_the_users_frame_is_the_first_of_their_own_code():
    frames = [
        {"name": "linear", "filename": "/usr/lib/python3.12/site-packages/torch/nn/functional.py", "line": 5},
        {"name": "forward", "filename": "/home/me/model.py", "line": 42},
    ]
    assert user_frame(frames) == ("forward (model.py:42)", "/home/me/model.py:42")
    assert user_frame(frames[:1]) == (
        "linear (functional.py:5)",
        "/usr/lib/python3.12/site-packages/torch/nn/functional.py:5",
    )
    assert user_frame([{"name": "at::empty", "filename": "??", "line": 0}]) is None


def test_the_run_reports_explorer_of_an_oom_pickle_has_the_banner(tmp_path):
    # GIVEN a run directory holding the OOM record (pickle and YAML)
    run = tmp_path / "run"
    shutil.copytree(RUN, run)
    # WHEN the run is reported
    assert main(["report", str(run), "-o", str(tmp_path / "r.html")]) == 0
    # THEN the OOM pickle's explorer opens on the failure with the record's figures
    html = (tmp_path / "allocator-explorer" / "0-oom_rank_0_0.html").read_text()
    text = re.sub(r"<[^>]+>", "", re.search(r"<div id='mp-oom'.*?</div>", html).group(0))
    assert "400.00 GiB requested, 138.88 GiB free of 139.80 GiB total; in training_step call 4 (" in text
    assert _meta(html)["initial"]["sel"] == 261
    # AND the report itself says so at its top, linking that explorer
    report = (tmp_path / "r.html").read_text()
    line = re.search(r"<p class='oom mp-oom-line'>.*?</p>", report).group(0)
    assert report.index("mp-oom-line") < report.index("<h2")
    assert "Out of memory (rank 0, record 0, cuda_oom): 400.00 GiB requested" in re.sub(r"<[^>]+>", "", line)
    assert "href='allocator-explorer/0-oom_rank_0_0.html'" in line


def test_an_unreadable_record_beside_the_pickle_is_a_warning_not_a_failure(tmp_path, capsys):
    # GIVEN the pickle with a cut, foreign YAML of the record's name beside it
    shutil.copy(PICKLE, tmp_path / "oom_rank_0_0.pickle")
    (tmp_path / "oom_rank_0_0.yaml").write_text("reason: [unclosed\n")
    out = tmp_path / "oom.html"
    # WHEN the explorer is written
    assert main(["snapshot", str(tmp_path / "oom_rank_0_0.pickle"), "--html", str(out)]) == 0
    # THEN one warning names the file, and the banner keeps the pickle's own figures
    assert "oom_rank_0_0.yaml" in capsys.readouterr().out
    text = re.sub(r"<[^>]+>", "", re.search(r"<div id='mp-oom'.*?</div>", out.read_text()).group(0))
    assert "400.00 GiB requested, 138.88 GiB free (total: not in the pickle" in text
