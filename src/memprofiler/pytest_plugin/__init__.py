"""pytest plugin (``pytest11`` entry point): memory budgets and leak checks in a test suite.

Markers::

    @pytest.mark.memory_budget(rss_peak="1GiB", saved_tensors="300MiB", cuda_peak="2GiB")
    @pytest.mark.memory_leak(cuda="1MiB")

the option ``--memprofiler-dir DIR``, and the ``memprofiler`` fixture. Importing this module
costs nothing: no torch, no collectors. The measuring code loads when a marked test runs or
the fixture is used.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from memprofiler.core.profiler import MemProfiler

PLUGIN_NAME = "memprofiler-budgets"

_MARKERS = (
    "memory_budget(*limits, **budgets): fail when the test body exceeds a memory budget; "
    "budgets: rss_peak, saved_tensors, cuda_peak or any `memprofiler check --max` metric, "
    "e.g. memory_budget(rss_peak='1GiB', saved_tensors='300MiB'), or a rise over "
    "--memprofiler-baseline, saved_tensors='+5%' (memprofiler)",
    "memory_leak(cuda='0B', saved_tensors='0B'): fail when the test body leaves CUDA memory "
    "allocated or saved-for-backward graphs alive (memprofiler)",
)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("memprofiler", "memory budgets (memprofiler)")
    group.addoption(
        "--memprofiler-dir",
        dest="memprofiler_dir",
        default=None,
        metavar="DIR",
        help="write every measured test's figures to DIR, for `memprofiler report` / `memprofiler diff`",
    )
    group.addoption(
        "--memprofiler-baseline",
        dest="memprofiler_baseline",
        default=None,
        metavar="DIR",
        help="figures of a stored test run (--memprofiler-dir on the baseline commit): budgets "
        "written as a rise, memory_budget(rss_peak='+5%%'), compare each test with its own there",
    )


def pytest_configure(config: pytest.Config) -> None:
    for line in _MARKERS:
        config.addinivalue_line("markers", line)
    if not config.pluginmanager.has_plugin(PLUGIN_NAME):
        from memprofiler.pytest_plugin.plugin import MemoryBudgetPlugin

        config.pluginmanager.register(MemoryBudgetPlugin(config), PLUGIN_NAME)


@pytest.fixture(name="memprofiler")
def memprofiler_fixture(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[MemProfiler]:
    """A set-up :class:`~memprofiler.MemProfiler` that collects every ``training_step`` call.

    Its files go to ``tmp_path / "memprofiler"``; its snapshots are in ``.snapshots``.

    Example:
        >>> def test_step(memprofiler):  # doctest: +SKIP
        ...     with memprofiler.profile("training_step", module=model):
        ...         model(x).sum().backward()
        ...     assert memprofiler.snapshots["0.training_step.1.end"]["saved_tensors.unique_bytes"] < 2**20
    """
    from memprofiler.core.profiler import MemProfiler

    plugin = request.config.pluginmanager.get_plugin(PLUGIN_NAME)
    cuda = plugin.cuda() if plugin is not None else None  # the same CUDA seam as the markers
    config = {"schedule": {"warmup": 0, "active": 1, "repeat": 0}}
    with MemProfiler(config, save_dir=tmp_path / "memprofiler", cuda=cuda) as prof:
        yield prof
