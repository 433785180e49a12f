"""The plugin's hooks: check markers at collection, measure marked test bodies, write figures.

Nothing heavy is imported until a marked test runs: the measuring code (and torch with it)
loads in :meth:`MemoryBudgetPlugin.pytest_runtest_call` of the first marked test.
"""

from __future__ import annotations

import os
from collections.abc import Generator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from memprofiler.collectors.cuda_backend import CudaBackend
    from memprofiler.collectors.host import HostCollector
    from memprofiler.pytest_plugin.baseline import Baseline
    from memprofiler.pytest_plugin.markers import MarkerBudgets

#: ``workeroutput`` key under which a ``pytest-xdist`` worker hands its figures to the controller.
WORKER_KEY = "memprofiler_snapshots"
_UNSET: Any = object()


def _check_out_dir(value: str) -> None:
    """``--memprofiler-dir`` checked before any test runs: a usage error of one line."""
    from memprofiler.errors import MemProfilerError
    from memprofiler.pytest_plugin.results import check_out_dir

    try:
        check_out_dir(value)
    except MemProfilerError as err:
        raise pytest.UsageError(" ".join(str(err).split())) from None


def _load_baseline(given: str) -> Baseline:
    """``--memprofiler-baseline`` read before any test runs: a usage error of one line."""
    from memprofiler.errors import MemProfilerError
    from memprofiler.pytest_plugin.baseline import Baseline

    try:
        return Baseline.load(given)
    except MemProfilerError as err:
        raise pytest.UsageError(" ".join(str(err).split())) from None


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
        self._out_root: str | None = None
        if self.out_dir:
            from memprofiler.output.remote import is_url

            if not hasattr(config, "workerinput"):  # the controller checks, before any test runs
                _check_out_dir(self.out_dir)
            # Resolved now: a test may change the working directory before the files are written.
            local = not is_url(self.out_dir)
            self._out_root = os.path.abspath(os.path.expanduser(self.out_dir)) if local else self.out_dir
        #: ``--memprofiler-baseline``, read before any test runs.
        self.baseline: Baseline | None = None
        given = config.getoption("memprofiler_baseline", None)
        if given:
            self.baseline = _load_baseline(given)
        #: Why nothing was written at the end (the directory refused us), for the summary.
        self._write_error: str | None = None
        #: xdist: the controller's spool directory; a worker's own spool file.
        self._spool_dir: str | None = None
        self._spool: Path | None = None
        spool_dir = getattr(config, "workerinput", {}).get("memprofiler_spool")
        if spool_dir:
            from memprofiler.pytest_plugin.spool import spool_file

            self._spool = spool_file(spool_dir, str(config.workerinput["workerid"]))  # type: ignore[attr-defined]
        #: xdist: one line per worker that died, saying what was recovered and what was lost.
        self._worker_losses: list[str] = []
        #: A usage error ended the session at collection: no "nothing written" line after it.
        self._refused = False
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

        in_worker = hasattr(self.config, "workerinput")
        self._refuse_misspelt(items, in_worker)
        marked = [
            i for i in items if i.get_closest_marker(BUDGET_MARKER) or i.get_closest_marker(LEAK_MARKER)
        ]
        if not marked:
            return
        from memprofiler.errors import ConfigError
        from memprofiler.pytest_plugin.markers import budgets_of

        for item in marked:
            try:
                found = budgets_of(item)
            except ConfigError as err:
                message = f"{item.nodeid}: {err}"
                if not in_worker:
                    self._refused = True
                    raise pytest.UsageError(message) from None
                # An xdist worker cannot end the session cleanly (the controller reports an
                # internal error): the test errors at setup with the same line instead.
                self._usage_errors[item.nodeid] = message
                continue
            if found is not None:
                self.budgets[item.nodeid] = found

    def _refuse_misspelt(self, items: list[pytest.Item], in_worker: bool) -> None:
        """A marker that is not registered and reads like one of ours is a usage error: its
        budget would go unchecked, with only pytest's unknown-mark warning at the end."""
        from memprofiler.pytest_plugin.markers import misspelt_marker

        known = {line.split("(")[0].split(":")[0].strip() for line in self.config.getini("markers")}
        for item in items:
            for mark in item.iter_markers():
                if mark.name in known:
                    continue
                line = misspelt_marker(mark.name)
                if line is None:
                    continue
                message = f"{item.nodeid}: {line}"
                if not in_worker:
                    self._refused = True  # the summary says nothing of an empty directory then
                    raise pytest.UsageError(message)
                self._usage_errors[item.nodeid] = message

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
        self._spool_append({"running": item.nodeid})
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
        base, no_base = self._baseline_of(item.nodeid, n, budgets)
        lines, unchecked = check(
            budgets,
            meter.start_metrics,
            end,
            leaks,
            cuda=cuda is not None,
            baseline=base,
            no_baseline=no_base,
        )
        if lines:
            pytest.fail("\n".join(lines), pytrace=False)
        if unchecked:
            raise _skip("; ".join(unchecked) + " (all else its markers ask was checked and passed)")
        return result

    def _baseline_of(
        self, nodeid: str, n: int, budgets: MarkerBudgets
    ) -> tuple[dict[str, float] | None, str]:
        """The test's figures in ``--memprofiler-baseline``, or ``None`` and why."""
        if not budgets.growth:
            return None, ""
        if self.baseline is None:
            return None, "no --memprofiler-baseline DIR given to compare with"
        found = self.baseline.values(nodeid, n)
        if found is None:
            return None, f"the test is not in --memprofiler-baseline {self.baseline.source} (a new test?)"
        return found, ""

    def _record(self, nodeid: str, n: int, start: dict[str, Any], end: dict[str, Any]) -> None:
        from memprofiler.layout import snapshot_key

        pair = {snapshot_key(0, nodeid, n, "start"): start, snapshot_key(0, nodeid, n, "end"): end}
        self.snapshots.update(pair)
        self._spool_append({"snapshots": pair})

    def _spool_append(self, record: dict[str, Any]) -> None:
        if self._spool is None:
            return
        from memprofiler.output.writers import to_plain
        from memprofiler.pytest_plugin.spool import append

        try:
            append(self._spool, to_plain(record))
        except OSError:  # the spool is a safety net: a full disk must not fail the test
            self._spool = None

    # ----------------------------------------------------------------- output
    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        """``pytest-xdist`` controller: give each worker a spool file for its figures."""
        if self.out_dir is None:
            return
        if self._spool_dir is None:
            import tempfile

            self._spool_dir = tempfile.mkdtemp(prefix="memprofiler-xdist-")
        node.workerinput["memprofiler_spool"] = self._spool_dir

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        """``pytest-xdist`` controller: take a finished worker's figures, or a dead one's spool."""
        output = getattr(node, "workeroutput", {}).get(WORKER_KEY)
        if output is not None:
            self.snapshots.update(output)
            return
        if self._spool_dir is None:
            return
        from memprofiler.pytest_plugin.spool import recover, spool_file

        worker = str(getattr(node, "workerinput", {}).get("workerid", getattr(node.gateway, "id", "?")))
        found = recover(spool_file(self._spool_dir, worker))
        self.snapshots.update(found.snapshots)
        lost = (
            f"`{found.unfinished}` was being measured and has no figures"
            if found.unfinished
            else "no measured test was running"
        )
        self._worker_losses.append(
            f"memprofiler: xdist worker {worker} went down; the figures of the {found.tests} tests it had "
            f"measured were recovered from its spool; {lost}"
        )

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        worker_output = getattr(self.config, "workeroutput", None)
        if worker_output is not None:  # an xdist worker: the controller writes the files
            from memprofiler.output.writers import to_plain

            worker_output[WORKER_KEY] = to_plain(self.snapshots)
            return
        if self._spool_dir is not None:
            import shutil

            shutil.rmtree(self._spool_dir, ignore_errors=True)
        if self._out_root is None or not self.snapshots:
            return
        from memprofiler.errors import MemProfilerError
        from memprofiler.pytest_plugin.results import write_run

        status = "crashed" if exitstatus == pytest.ExitCode.INTERRUPTED else "finished"
        try:
            self._written = write_run(self._out_root, self.snapshots, self._started, status)
        except MemProfilerError as err:  # said in the summary, as one line; the tests' outcomes stand
            self._write_error = " ".join(str(err).split())

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.out_dir is None or hasattr(self.config, "workerinput"):
            return
        for line in self._worker_losses:
            terminalreporter.write_line(line, yellow=True)
        written = getattr(self, "_written", None)
        if self._write_error is not None:
            terminalreporter.write_line(
                f"memprofiler: figures of {len(self.snapshots) // 2} measured tests NOT written: "
                f"{self._write_error}",
                red=True,
            )
        elif written is not None:
            terminalreporter.write_line(
                f"memprofiler: figures of {len(self.snapshots) // 2} measured tests in {written} "
                "(read with `memprofiler report` / `memprofiler diff`)"
            )
        elif not self._refused:  # never silent: say why the directory stays empty
            terminalreporter.write_line(
                f"memprofiler: nothing written to {self.out_dir}: no test that ran is marked "
                "memory_budget or memory_leak"
            )
