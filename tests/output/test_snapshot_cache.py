"""SnapshotCache: the cached YAML and plain forms equal a from-scratch conversion."""

from __future__ import annotations

import enum

import numpy as np
import yaml

from memprofiler.output.snapshot_cache import SnapshotCache
from memprofiler.output.writers import to_plain


class _Unit(enum.Enum):
    MIB = "MiB"


def _full(snapshots: dict) -> str:
    return yaml.safe_dump(to_plain(snapshots), sort_keys=False, default_flow_style=False)


def _snap(n: int) -> dict:
    return {
        "rss": n * 4096,
        "rss_peak": np.int64(n * 8192),
        "saved_tensors.by_module": {"Net.block.0": n * 100, "<outside modules>": 0},
        "units": _Unit.MIB,
        "note": "a long string " * 12,
        "dims": (n, n + 1),
        "ratio": 0.5,
    }


def test_yaml_text_equals_a_full_dump_through_new_changed_and_removed_keys():
    cache = SnapshotCache()
    snapshots: dict = {}
    # GIVEN no snapshots yet: the empty mapping
    assert cache.yaml_text(snapshots) == _full(snapshots) == "{}\n"
    # WHEN snapshots arrive one by one
    for n in range(1, 6):
        for phase in ("start", "end"):
            snapshots[f"0.training_step.{n}.{phase}"] = _snap(n)
            # THEN every text equals a from-scratch dump and loads back to the same data
            text = cache.yaml_text(snapshots)
            assert text == _full(snapshots)
            assert yaml.safe_load(text) == to_plain(snapshots)
    # WHEN an earlier snapshot changes in place (late tracker peaks) and is touched
    snapshots["0.training_step.2.end"]["fsdp.peak.Net"] = 123
    cache.touch("0.training_step.2.end")
    # THEN the text and the plain form carry the change
    assert cache.yaml_text(snapshots) == _full(snapshots)
    assert cache.plain(snapshots) == to_plain(snapshots)
    # AND a key that left the snapshots leaves the text
    del snapshots["0.training_step.1.start"]
    assert cache.yaml_text(snapshots) == _full(snapshots)
    assert list(cache.plain(snapshots)) == list(snapshots)


def test_an_untouched_in_place_change_is_not_seen():
    # The contract: the profiler touches what it changes; the cache does not rescan values.
    cache = SnapshotCache()
    snapshots = {"0.f.1.end": {"rss": 1}}
    cache.yaml_text(snapshots)
    snapshots["0.f.1.end"]["rss"] = 2
    assert yaml.safe_load(cache.yaml_text(snapshots)) == {"0.f.1.end": {"rss": 1}}
    cache.touch("0.f.1.end")
    assert yaml.safe_load(cache.yaml_text(snapshots)) == {"0.f.1.end": {"rss": 2}}


def test_a_replaced_snapshot_object_is_seen_without_touch():
    # GIVEN a cached snapshot
    cache = SnapshotCache()
    snapshots = {"0.f.1.end": {"rss": 1}}
    cache.yaml_text(snapshots)
    # WHEN the key is given a new dict (not changed in place)
    snapshots["0.f.1.end"] = {"rss": 2}
    # THEN the new value is written
    assert yaml.safe_load(cache.yaml_text(snapshots)) == {"0.f.1.end": {"rss": 2}}
