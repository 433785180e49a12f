"""compressed: profiler output read alike whether gzipped or not, by content rather than name."""

from __future__ import annotations

import gzip

import pytest

from memprofiler.analysis.files.compressed import open_maybe_gzip, read_maybe_gzip


@pytest.mark.parametrize("name", ["t.json", "t.json.gz"])
@pytest.mark.parametrize("packed", [False, True])
def test_plain_and_gzip_read_alike_whatever_the_name(tmp_path, name, packed):
    # GIVEN the same bytes written plain or gzipped, under a name that may say otherwise
    data = b'{"traceEvents": [1, 2]}'
    path = tmp_path / name
    path.write_bytes(gzip.compress(data) if packed else data)
    # WHEN read whole and streamed THEN both give the original bytes
    assert read_maybe_gzip(path) == data
    with open_maybe_gzip(path) as f:
        assert f.read() == data


def test_a_cut_gzip_raises_an_os_or_eof_error(tmp_path):
    # GIVEN a gzip file cut short
    path = tmp_path / "t.json.gz"
    path.write_bytes(gzip.compress(b"x" * 1000)[:12])
    # WHEN read THEN the error is one the readers turn into an ArtifactError
    with pytest.raises((OSError, EOFError)):
        read_maybe_gzip(path)
