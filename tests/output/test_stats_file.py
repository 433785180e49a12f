"""The stats file's direct YAML writer reads back exactly as PyYAML's own output does."""

from __future__ import annotations

import math

import yaml

from memprofiler.output.stats_file import entry_yaml

TRICKY = {
    "rss": 123,
    "f": 1.5,
    "tiny": 1e-05,
    "big": 1e20,
    "neg_zero": -0.0,
    "inf": math.inf,
    "ninf": -math.inf,
    "nan": math.nan,
    "flag": True,
    "none": None,
    "s": "hello",
    "yes": "no",
    "null": "1e3",
    "quoted": 'a "quoted": #x',
    "unicode": "é日本",
    "1.0": 3,
    "12": 1,
    "0x1f": 6,
    "0o17": 2,
    "1_000": 3,
    "1:20": 5,
    "2026-01-01": 7,
    "(outside)": 5,
    "blocks.0.fc1": 7,
    "x: y": 1,
    "- dash": 2,
    "#c": 3,
    "~": 4,
    "on": 5,
    "a b": 8,
    "": 9,
    "nested": {"a": {"b": 1, "c": {}}, "x.y": 2.25},
    "empty": {},
    "a_list": [1, 2],
}


def _same(a, b):
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a):
        return math.isnan(b)
    if isinstance(a, dict):
        return isinstance(b, dict) and list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    return a == b and type(a) is type(b)


def test_tricky_keys_and_values_read_back_as_pyyaml_writes_them():
    # GIVEN keys and values YAML would misread unquoted (booleans, numbers, dates, indicators)
    # WHEN one entry is written directly
    text = entry_yaml("0.f.1.end", TRICKY)
    # THEN yaml.safe_load reads what it reads from yaml.safe_dump of the same data
    expected = yaml.safe_load(yaml.safe_dump({"0.f.1.end": TRICKY}, sort_keys=False))
    assert _same(yaml.safe_load(text), expected)


def test_a_typical_snapshot_is_byte_for_byte_what_safe_dump_writes():
    snap = {
        "rss": 1_234_567,
        "rss_peak": 2_345_678,
        "saved_tensors.unique_bytes": 196_608,
        "saved_tensors.by_module": {"net.0": 65_536, "(outside)": 0},
        "allocated_bytes.all.peak": 3.5,
        "failed": True,
    }
    expected = yaml.safe_dump({"0.training_step.2.end": snap}, sort_keys=False, default_flow_style=False)
    assert entry_yaml("0.training_step.2.end", snap) == expected
