"""The plugin's hooks: check markers at collection, measure marked test bodies, write figures.

Nothing heavy is imported until a marked test runs: the measuring code (and torch with it)
loads in :meth:`MemoryBudgetPlugin.pytest_runtest_call` of the first marked test.
"""

from __future__ import annotations

import os
from collections.abc import Generator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from memprofiler.collectors.cuda_backend import CudaBackend
    from memprofiler.collectors.host import HostCollector
    from memprofiler.pytest_plugin.markers import MarkerBudgets

#: ``workeroutput`` key under which a ``pytest-xdist`` worker hands its figures to the controller.
WORKER_KEY = "memprofiler_snapshots"
_UNSET: Any = object()


def _skip(reason: str) -> BaseException:
    """A skip that ``-rs`` reports at the test's location rather than this module's."""
    try:
        return pytest.skip.Exception(reason, _use_item_location=True)  # private, pytest >= 7
    except TypeError:
        return pytest.skip.Exception(reason)


class MemoryBudgetPlugin:
    """Per-session state: the parsed budgets, the measured figures, the collectors.

    Args:
        config: the pytest config.
    """

    def __init__(self, config: pytest.Config) -> None:
        from memprofiler.pytest_plugin.results import now

        self.config = config
        self.out_dir: str | None = config.getoption("memprofiler_dir")
        # Resolved now: a test may change the working directory before the files are written.
        self._out_root = os.path.abspath(os.path.expanduser(self.out_dir)) if self.out_dir else None
        self.budgets: dict[str, MarkerBudgets] = {}
        self._usage_errors: dict[str, str] = {}
        #: Snapshot key -> metrics of every measured test body (and, on the xdist controller,
        #: of every worker's).
        self.snapshots: dict[str, dict[str, Any]] = {}
        self._calls: dict[str, int] = {}
        self._started = now()
        #: The CUDA seam; ``None`` means no usable GPU. A conftest may set a fake here.
        self.cuda_backend: CudaBackend | None = _UNSET
        self._host: HostCollector | None = None

    # ----------------------------------------------------------------- collection
    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        from memprofiler.pytest_plugin.markers import BUDGET_MARKER, LEAK_MARKER

        marked = [
            i for i in items if i.get_closest_marker(BUDGET_MARKER) or i.get_closest_marker(LEAK_MARKER)
        ]
        if not marked:
            return
        from memprofiler.errors import ConfigError
        from memprofiler.pytest_plugin.markers import budgets_of

        in_worker = hasattr(self.config, "workerinput")
        for item in marked:
            try:
                found = budgets_of(item)
            except ConfigError as err:
                message = f"{item.nodeid}: {err}"
                if not in_worker:
                    raise pytest.UsageError(message) from None
                # An xdist worker cannot end the session cleanly (the controller reports an
                # internal error): the test errors at setup with the same line instead.
                self._usage_errors[item.nodeid] = message
                continue
            if found is not None:
                self.budgets[item.nodeid] = found

    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        message = self._usage_errors.get(item.nodeid)
        if message is not None:
            pytest.fail(f"usage error: {message}", pytrace=False)

    # ----------------------------------------------------------------- measuring
    def cuda(self) -> CudaBackend | None:
        """The CUDA backend when a GPU is usable, else ``None`` (probed once)."""
        if self.cuda_backend is _UNSET:
            from memprofiler.collectors.cuda_backend import default_backend

            backend = default_backend()
            self.cuda_backend = backend if backend.is_available() else None
        return self.cuda_backend if self.cuda_backend is None or self.cuda_backend.is_available() else None

    def host(self) -> HostCollector:
        if self._host is None:
            from memprofiler.collectors.host import HostCollector

            self._host = HostCollector()  # probes the exact clear_refs peak once per session
        return self._host

    # trylast: the innermost wrapper, so other plugins' call-phase work is not measured.
    @pytest.hookimpl(wrapper=True, trylast=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None, None, None]:
        budgets = self.budgets.get(item.nodeid)
        if budgets is None:
            return (yield)
        from memprofiler.pytest_plugin.measure import BodyMeter
        from memprofiler.pytest_plugin.verdict import check

        cuda = self.cuda()
        meter = BodyMeter(self.host(), cuda, leak=budgets.leak is not None)
        n = self._calls[item.nodeid] = self._calls.get(item.nodeid, 0) + 1
        try:
            meter.start(item.nodeid, n)
            try:
                result = yield
            except BaseException as exc:
                end = meter.end(ok=False)
                if not isinstance(exc, pytest.skip.Exception):  # a skipped body measured nothing useful
                    self._record(item.nodeid, n, meter.start_metrics, end)
                raise
            end = meter.end(ok=True)
            leaks = meter.leaks() if budgets.leak is not None else None
        finally:
            meter.close()
        if leaks is not None:
            end.update(
                {"leak.saved_bytes": leaks.saved_bytes, "leak.saved_count": leaks.saved_count}
                | ({"leak.cuda_bytes": leaks.cuda_bytes} if leaks.cuda_bytes is not None else {})
            )
        self._record(item.nodeid, n, meter.start_metrics, end)
        lines, unchecked = check(budgets, meter.start_metrics, end, leaks, cuda=cuda is not None)
        if lines:
            pytest.fail("\n".join(lines), pytrace=False)
        if unchecked:
            raise _skip("; ".join(unchecked) + " (all else its markers ask was checked and passed)")
        return result

    def _record(self, nodeid: str, n: int, start: dict[str, Any], end: dict[str, Any]) -> None:
        from memprofiler.layout import snapshot_key

        self.snapshots[snapshot_key(0, nodeid, n, "start")] = start
        self.snapshots[snapshot_key(0, nodeid, n, "end")] = end

    # ----------------------------------------------------------------- output
    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        """``pytest-xdist`` controller: take a finished worker's figures."""
        self.snapshots.update(getattr(node, "workeroutput", {}).get(WORKER_KEY, {}))

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        worker_output = getattr(self.config, "workeroutput", None)
        if worker_output is not None:  # an xdist worker: the controller writes the files
            from memprofiler.output.writers import to_plain

            worker_output[WORKER_KEY] = to_plain(self.snapshots)
            return
        if self._out_root is None or not self.snapshots:
            return
        from memprofiler.pytest_plugin.results import write_run

        status = "crashed" if exitstatus == pytest.ExitCode.INTERRUPTED else "finished"
        self._written = write_run(self._out_root, self.snapshots, self._started, status)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.out_dir is None or hasattr(self.config, "workerinput"):
            return
        written = getattr(self, "_written", None)
        if written is not None:
            terminalreporter.write_line(
                f"memprofiler: figures of {len(self.snapshots) // 2} measured tests in {written} "
                "(read with `memprofiler report` / `memprofiler diff`)"
            )
        else:  # never silent: say why the directory stays empty
            terminalreporter.write_line(
                f"memprofiler: nothing written to {self.out_dir}: no test that ran is marked "
                "memory_budget or memory_leak"
            )
