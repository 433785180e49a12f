"""Every writer and reader of snapshot metrics spells their names through ``memprofiler.metrics``."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from memprofiler import metrics

SRC = Path(__file__).resolve().parents[1] / "src" / "memprofiler"
#: The modules that write or read metrics by name.
CONSUMERS = [
    "collectors/host.py",
    "collectors/saved_tensors.py",
    "lightning/metrics_logger.py",
    "output/timeline.py",
    "analysis/estimate.py",
    "analysis/diff.py",
    "reporters/model/figures.py",
    "reporters/model/call_rows.py",
    "pytest_plugin/markers.py",
    "pytest_plugin/measure.py",
    "pytest_plugin/verdict.py",
]
NAMES = frozenset(metrics.ALL) | {p.rstrip(".") for p in metrics.TRACKER_PEAK_PREFIXES}
#: The step timeline's host sampler and its config, with the host metric names besides. Their
#: groups (``cpu``, ``memory``) are ordinary words elsewhere (a collection type, a device), so
#: only these modules are held to them.
HOST_CONSUMERS = ["config/timeline.py", "core/host_sampler.py"]
HOST_NAMES = NAMES | frozenset(metrics.HOST_GROUPS) | frozenset(metrics.HOST_TRACKS)


def _not_metric_names(tree: ast.AST) -> set[int]:
    """Docstrings, and a report figure's own name and attributes (``Figure("rss_peak", ...)``
    names a ``CallRow`` attribute; only its ``metric=`` is a metric name)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                out.add(id(body[0].value))
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Figure":
            parts = [*node.args, *(kw.value for kw in node.keywords if kw.arg != "metric")]
            out.update(id(sub) for part in parts for sub in ast.walk(part))
    return out


def _spelled_out(path: Path, names: frozenset[str] = NAMES) -> list[str]:
    tree = ast.parse(path.read_text())
    skip = _not_metric_names(tree)
    return [
        f"{path.relative_to(SRC)}:{node.lineno}: {node.value!r}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and id(node) not in skip and node.value in names
    ]


def _imports_the_vocabulary(path: Path) -> bool:
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module == "memprofiler.metrics":
            return True
        if (
            isinstance(node, ast.ImportFrom)
            and node.module == "memprofiler"
            and any(a.name == "metrics" for a in node.names)
        ):
            return True
    return False


@pytest.mark.parametrize("module", CONSUMERS)
def test_the_module_names_metrics_only_through_the_vocabulary(module):
    # GIVEN a module that writes or reads snapshot metrics by name
    path = SRC / module
    # THEN it spells no metric name of its own, and it uses the vocabulary
    assert _spelled_out(path) == []
    assert _imports_the_vocabulary(path)


@pytest.mark.parametrize("module", HOST_CONSUMERS)
def test_the_host_sampler_names_its_metrics_only_through_the_vocabulary(module):
    # GIVEN the step timeline's host sampler or its config
    path = SRC / module
    # THEN it spells no host group or track name of its own, and it uses the vocabulary
    assert _spelled_out(path, HOST_NAMES) == []
    assert _imports_the_vocabulary(path)


def test_the_sampler_draws_every_host_track_of_the_vocabulary_once():
    from memprofiler.config.timeline import HOST_METRICS
    from memprofiler.core.host_sampler import TRACKS

    assert tuple(TRACKS) == HOST_METRICS == metrics.HOST_GROUPS
    drawn = [track for group in TRACKS.values() for track in group]
    assert sorted(drawn) == sorted(metrics.HOST_TRACKS)


def test_the_trackers_write_the_vocabularys_prefixes():
    from memprofiler.collectors.fsdp import FSDPMemCollector
    from memprofiler.collectors.module_mem import ModuleMemCollector

    assert f"{FSDPMemCollector.prefix}.peak." == metrics.FSDP_PEAK_PREFIX
    assert f"{ModuleMemCollector.prefix}.peak." == metrics.MODULE_MEM_PEAK_PREFIX
