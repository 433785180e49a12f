from __future__ import annotations

import pytest

from memprofiler.errors import ConfigError
from memprofiler.units import format_bytes, format_value, looks_like_bytes, parse_size


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


@pytest.mark.parametrize(
    ("metric", "is_bytes"),
    [
        # module and category names inside byte families never make them counts ...
        ("saved_tensors.by_module.unet.time_embed.0", True),
        ("saved_tensors.by_module.block.num_heads_proj", True),
        ("fsdp.peak.Activation", True),
        ("module_mem.peak.total", True),
        # ... and CUDA count families stay counts even when their name says "size"
        ("oversize_allocations.current", False),
        ("oversize_segments.peak", False),
        ("active.all.current", False),
        ("segment.large_pool.peak", False),
        ("inactive_split.all.current", False),
        ("num_device_alloc", False),
        # while their *_bytes siblings are bytes
        ("active_bytes.all.current", True),
        ("inactive_split_bytes.all.peak", True),
        ("requested_bytes.all.peak", True),
    ],
)
def test_byte_families_and_cuda_count_families(metric, is_bytes):
    assert looks_like_bytes(metric) is is_bytes


def test_format_value_shows_counts_and_non_finite_values():
    assert format_value("oversize_allocations.current", 3) == "3"
    assert format_value("saved_tensors.by_module.unet.time_embed.0", 2048) == "2.00 KiB"
    assert format_value(5, 7) == "7"  # an integer key from a hand-edited YAML
    assert format_bytes(float("nan")) == "nan" and format_value("rss_peak", float("inf")) == "inf"


@pytest.mark.parametrize("text", ["-1", "-2GiB", "-0.5 MiB"])
def test_parse_size_rejects_negative_sizes(text):
    with pytest.raises(ConfigError) as info:
        parse_size(text, key="--max rss_peak")
    assert str(info.value) == f"`--max rss_peak`: got {text!r}; must not be negative"
