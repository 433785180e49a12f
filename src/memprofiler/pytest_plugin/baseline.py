"""``--memprofiler-baseline DIR``: the figures of a stored test run (``--memprofiler-dir`` on the
baseline commit), which ``memory_budget(rss_peak="+5%")`` compares each test with. Torch-free."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from memprofiler import layout
from memprofiler.pytest_plugin.verdict import budget_values

#: The option a message names.
OPTION = "--memprofiler-baseline"


@dataclass(frozen=True)
class Baseline:
    """The figures of each measured test of a stored run, as budgets are checked against them."""

    source: str
    """The directory as given."""
    tests: dict[str, dict[int, dict[str, float]]]
    """Test node id -> call number -> its budget values (:func:`verdict.budget_values`)."""

    @classmethod
    def load(cls, given: str) -> Baseline:
        """Read the run under ``given`` (its newest when it holds several).

        Raises:
            ArtifactError: one line naming ``--memprofiler-baseline``: no such directory, no
                run in it, a cut or malformed file, or a run that measured no test.
        """
        from memprofiler.analysis.files.fs import localize, named_as_given
        from memprofiler.analysis.runs.artifacts import load_run
        from memprofiler.errors import ArtifactError

        try:
            with named_as_given():
                run = load_run(localize(given))
        except ArtifactError as err:
            raise ArtifactError(f"`{OPTION}` {given!r}: {' '.join(str(err).split())}") from None
        pairs: dict[tuple[str, int], dict[str, Mapping[str, Any]]] = {}
        for key, metrics in run.snapshots().items():
            _, nodeid, call, phase = layout.parse_snapshot_key(key)
            pairs.setdefault((nodeid, call), {})[phase] = metrics
        tests: dict[str, dict[int, dict[str, float]]] = {}
        for (nodeid, call), phases in pairs.items():
            if "start" in phases and "end" in phases:
                tests.setdefault(nodeid, {})[call] = budget_values(phases["start"], phases["end"])
        if not tests:
            raise ArtifactError(
                f"`{OPTION}` {given!r}: {run.root} holds no measured test; write one with "
                "`pytest --memprofiler-dir DIR` on the baseline commit"
            )
        return cls(given, tests)

    def values(self, nodeid: str, call: int) -> dict[str, float] | None:
        """The test's figures for that call (its last when the baseline ran it fewer times)."""
        calls = self.tests.get(nodeid)
        if not calls:
            return None
        return calls.get(call) or calls[max(calls)]
