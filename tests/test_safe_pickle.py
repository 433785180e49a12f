"""The restricted unpickler: plain data loads, code never runs, broken files are one-line errors."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from _env import subprocess_env
from memprofiler import safe_pickle
from memprofiler.errors import ArtifactError


class _Exploit:
    """Unpickling this with ``pickle.load`` creates the marker file via ``os.system``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


class _ExploitEval:
    def __reduce__(self):
        return (eval, ("__import__('os').getpid()",))


def _write(tmp_path: Path, name: str, data: bytes) -> Path:
    p = tmp_path / name
    p.write_bytes(data)
    return p


def test_plain_data_round_trips_for_every_protocol(tmp_path):
    data = {
        "segments": [{"address": 1, "frames": [{"line": 3}]}],
        "t": (1, 2.5, None, True),
        "s": {1},
        "b": b"x",
    }
    for proto in range(pickle.HIGHEST_PROTOCOL + 1):
        p = _write(tmp_path, f"p{proto}.pickle", pickle.dumps(data, protocol=proto))
        assert safe_pickle.load(p) == data


def test_the_malicious_pickle_really_is_malicious(tmp_path):
    # GIVEN a pickle whose payload runs a shell command: plain pickle.load does create the marker
    marker = tmp_path / "pwned_by_plain_pickle"
    payload = pickle.dumps({"segments": [], "x": _Exploit(marker)}, protocol=4)
    pickle.loads(payload)
    assert marker.exists()


def test_malicious_pickle_is_refused_and_its_code_never_runs(tmp_path):
    # GIVEN the same kind of payload, pointing at a fresh marker
    marker = tmp_path / "pwned"
    p = _write(tmp_path, "evil.pickle", pickle.dumps({"segments": [], "x": _Exploit(marker)}, protocol=4))
    # WHEN it is loaded through the restricted unpickler
    with pytest.raises(ArtifactError) as info:
        safe_pickle.load(p)
    # THEN it is refused with one line naming the file and the callable, and nothing ran
    msg = str(info.value)
    assert str(p) in msg and "system" in msg and "\n" not in msg
    assert not marker.exists()


@pytest.mark.parametrize("proto", [0, 2, 4, 5])
def test_eval_payload_refused_in_every_protocol(tmp_path, proto):
    p = _write(tmp_path, "evil.pickle", pickle.dumps([_ExploitEval()], protocol=proto))
    with pytest.raises(ArtifactError, match="eval"):
        safe_pickle.load(p)


def test_classes_are_refused_even_harmless_ones(tmp_path):
    import collections

    p = _write(tmp_path, "od.pickle", pickle.dumps(collections.OrderedDict(a=1), protocol=4))
    with pytest.raises(ArtifactError, match=r"collections\.OrderedDict"):
        safe_pickle.load(p)


def test_missing_empty_truncated_and_foreign_files(tmp_path):
    good = pickle.dumps({"segments": list(range(1000))}, protocol=4)
    cases = {
        tmp_path / "missing.pickle": "no such file",
        _write(tmp_path, "empty.pickle", b""): "empty",
        _write(tmp_path, "trunc.pickle", good[: len(good) // 2]): "truncated",
        _write(tmp_path, "text.pickle", b"hello: yaml\n"): "not a pickle",
        tmp_path: "is a directory",
    }
    for path, expected in cases.items():
        with pytest.raises(ArtifactError, match=expected) as info:
            safe_pickle.load(path)
        assert str(path) in str(info.value) and "\n" not in str(info.value)


def test_cli_on_a_malicious_pickle_exits_2_without_traceback_or_side_effect(tmp_path):
    # GIVEN the malicious pickle handed to the command-line tool in a fresh process
    marker = tmp_path / "pwned_cli"
    p = _write(tmp_path, "evil.pickle", pickle.dumps({"segments": [], "x": _Exploit(marker)}, protocol=4))
    env = subprocess_env(Path(__file__).parents[1] / "src")
    # WHEN memprofiler snapshot reads it
    res = subprocess.run(
        [sys.executable, "-m", "memprofiler", "snapshot", str(p)], capture_output=True, text=True, env=env
    )
    # THEN exit 2, one stderr line, no traceback, no marker
    assert res.returncode == 2
    assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr
    assert "refused to load" in res.stderr
    assert not marker.exists()
