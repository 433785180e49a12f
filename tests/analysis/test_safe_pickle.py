"""The restricted unpickler: plain data loads, code never runs, broken files are one-line errors."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from _env import subprocess_env
from memprofiler.analysis.files import safe_pickle
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


@pytest.mark.slow
def test_cli_on_a_malicious_pickle_exits_2_without_traceback_or_side_effect(tmp_path):
    # GIVEN the malicious pickle handed to the command-line tool in a fresh process
    marker = tmp_path / "pwned_cli"
    p = _write(tmp_path, "evil.pickle", pickle.dumps({"segments": [], "x": _Exploit(marker)}, protocol=4))
    env = subprocess_env(Path(__file__).parents[2] / "src")
    # WHEN memprofiler snapshot reads it
    res = subprocess.run(
        [sys.executable, "-m", "memprofiler", "snapshot", str(p)], capture_output=True, text=True, env=env
    )
    # THEN exit 2, one stderr line, no traceback, no marker
    assert res.returncode == 2
    assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr
    assert "refused to load" in res.stderr
    assert not marker.exists()


@pytest.mark.parametrize(
    ("payload", "target"),
    [
        # protocol 2 spells bytearray(1_500_000_000) in 33 bytes: a 1.5 GB allocation
        (b"\x80\x02c__builtin__\nbytearray\nq\x00J\x00/\x68Y\x85q\x01Rq\x02.", "__builtin__.bytearray"),
        (b"\x80\x02c__builtin__\ncomplex\nK\x01K\x02\x86R.", "__builtin__.complex"),
        # _codecs.encode is only allowed as protocol 2 spells bytes: (text, "latin1")
        (
            b"\x80\x02c_codecs\nencode\nX\x01\x00\x00\x00aX\x04\x00\x00\x00nope\x86R.",
            "_codecs.encode(..., 'nope')",
        ),
    ],
)
def test_data_building_calls_that_can_blow_up_are_refused(tmp_path, payload, target):
    # GIVEN a tiny pickle calling bytearray/complex, or _codecs.encode with a foreign codec
    p = _write(tmp_path, "bomb.pickle", payload)
    assert p.stat().st_size < 60
    # THEN it is refused before the call, naming it, in one line
    with pytest.raises(ArtifactError) as info:
        safe_pickle.load(p)
    assert str(info.value) == (
        f"{p}: refused to load: the pickle wants to import or call `{target}`; only plain data (dicts, "
        "lists, strings, numbers) is allowed, so this is not a memprofiler or torch allocator snapshot "
        "(or it was tampered with)"
    )


def test_protocol_2_bytes_still_load():
    data = {"b": b"\x00\xffabc", "s": {1, 2}}
    assert safe_pickle.loads(pickle.dumps(data, protocol=2)) == data


def test_a_corrupted_frame_length_is_a_one_line_error(tmp_path):
    # GIVEN a protocol-4 pickle whose FRAME length byte was flipped (length > sys.maxsize)
    good = bytearray(pickle.dumps({"segments": list(range(100))}, protocol=4))
    assert good[2] == pickle.FRAME[0]
    good[3 + 7] = 0xFF  # most significant byte of the 8-byte frame length
    p = _write(tmp_path, "corrupt.pickle", bytes(good))
    # THEN an ArtifactError naming the file, not an OverflowError traceback
    with pytest.raises(ArtifactError) as info:
        safe_pickle.load(p)
    assert str(info.value) == f"{p}: not a pickle file, or corrupted (OverflowError)"
