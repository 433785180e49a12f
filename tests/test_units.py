from __future__ import annotations

import pytest

from memprofiler.errors import ConfigError
from memprofiler.units import format_bytes, looks_like_bytes, parse_size


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("2GiB", 2 * 1024**3),
        ("300MiB", 300 * 1024**2),
        ("1.5GB", 1.5e9),
        ("4096", 4096),
        ("12 KiB", 12288),
        ("1e3", 1000),
        ("2g", 2 * 1024**3),
        ("7B", 7),
    ],
)
def test_parse_size(text, value):
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["", "GiB", "2 parsecs", "1..5GB", "inf", "nanGB"])
def test_parse_size_rejects(text):
    with pytest.raises(ConfigError, match=r"expected a number|must be finite"):
        parse_size(text, key="--max x")


def test_format_bytes():
    assert format_bytes(512) == "512 B"
    assert format_bytes(12544) == "12.25 KiB"
    assert format_bytes(1.5 * 1024**3) == "1.50 GiB"
    assert format_bytes(-8192) == "-8.00 KiB"
    assert format_bytes(None) == "-"


def test_looks_like_bytes():
    assert looks_like_bytes("rss_peak") and looks_like_bytes("allocated_bytes.all.peak")
    assert looks_like_bytes("fsdp.Activation") and looks_like_bytes("saved_tensors.by_module.enc.1")
    assert not looks_like_bytes("saved_tensors.count") and not looks_like_bytes("num_alloc_retries")
    assert not looks_like_bytes("allocation.all.current")
