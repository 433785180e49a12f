"""The stats file's direct writer: what ``yaml.safe_load`` reads back is what was recorded."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
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


def test_tricky_keys_and_values_on_the_json_line_read_back_alike():
    # GIVEN the tricky mapping without what JSON cannot write (nan, inf) and with a nested level
    finite = {k: v for k, v in TRICKY.items() if k not in ("inf", "ninf", "nan", "a_list")}
    finite["nested"] = {"a b": 1, "1e5": 2.5e-12, "yes": "1e5: x"}
    # WHEN it is written
    text = entry_yaml("0.f.1.end", finite)
    # THEN it is one line, and YAML reads exactly what safe_dump's output reads as
    assert text.count("\n") == 1 and text.startswith('0.f.1.end: {"rss": 123,')
    expected = yaml.safe_load(yaml.safe_dump({"0.f.1.end": finite}, sort_keys=False))
    assert _same(yaml.safe_load(text), expected)


def test_a_typical_snapshot_is_one_json_line():
    snap = {
        "rss": 1_234_567,
        "rss_peak": 2_345_678,
        "saved_tensors.unique_bytes": 196_608,
        "saved_tensors.by_module": {"net.0": 65_536, "(outside)": 0},
        "allocated_bytes.all.peak": 3.5,
        "t": 2e-05,
        "failed": True,
    }
    text = entry_yaml("0.training_step.2.end", snap)
    assert text == (
        '0.training_step.2.end: {"rss": 1234567, "rss_peak": 2345678, "saved_tensors.unique_bytes": 196608, '
        '"saved_tensors.by_module": {"net.0": 65536, "(outside)": 0}, "allocated_bytes.all.peak": 3.5, '
        '"t": 2.0e-05, "failed": true}\n'
    )
    assert _same(yaml.safe_load(text)["0.training_step.2.end"], snap)


@pytest.mark.parametrize(
    ("metrics", "block"),
    [
        ({"rss": 1, "x": math.nan}, True),  # JSON has no nan: YAML's .nan in block style
        ({"rss": 1, "x": -math.inf}, True),
        ({"name": "\U0001f600"}, True),  # beyond U+FFFF: JSON's surrogate pair, YAML's halves
        ({"\U0001f600": 1}, True),
        ({"l": [1, 2]}, True),  # lists: block style, as safe_dump writes them
        ({"rss": np.int64(5), "f": np.float32(0.5)}, False),  # numpy scalars: plain numbers
        ({"deep": {"a": {"b": 1}}}, True),
        ({}, True),
    ],
)
def test_what_json_cannot_write_alike_falls_back_to_block_yaml(metrics, block):
    text = entry_yaml("0.f.1.end", metrics)
    assert (text.count("\n") > 1 or text.endswith(": {}\n")) is block
    expected = yaml.safe_load(
        yaml.safe_dump({"0.f.1.end": {k: _py(v) for k, v in metrics.items()}}, sort_keys=False)
    )
    assert _same(yaml.safe_load(text), expected)


def _py(v):
    return v.item() if isinstance(v, np.generic) else v


class _Count(int):
    """An ``int`` subclass: not the all-``int`` template's case."""


@pytest.mark.parametrize(
    "metrics",
    [
        {"allocated_bytes.all.current": 0, "rss": 123, "big": 2**70, "neg": -5},
        {"100%": 1, "a%d": 2, "%s%%": 3},  # the template's own escapes
        {"unicode é日本": 1, 'quo"te': 2, "back\\slash": 3},
        {"flag": True, "n": 1},  # bool is no int here
        {"f": 1.0, "n": 1},
        {"f": 1e-05, "n": 1},
        {"c": _Count(4), "n": 1},
        {"s": "x", "n": 1},
        {"surrogate \U0001f600": 1},  # JSON's escaped surrogate: block YAML
    ],
)
def test_an_all_int_snapshot_is_one_json_line_as_json_dumps_writes_it(metrics):
    # GIVEN a snapshot, recorded twice (the second time from the cached template)
    for _ in range(2):
        text = entry_yaml("0.training_step.1.end", metrics)
        # THEN it reads back equal
        plain = {k: int(v) if type(v) is _Count else v for k, v in metrics.items()}
        assert _same(yaml.safe_load(text)["0.training_step.1.end"], plain)
    # AND a mapping of plain ints is exactly json.dumps's line
    if all(type(v) is int for v in metrics.values()) and "\U0001f600" not in "".join(metrics):
        assert text == f"0.training_step.1.end: {json.dumps(metrics)}\n"
