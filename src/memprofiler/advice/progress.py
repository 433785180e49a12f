"""Progress on the terminal while candidates are estimated (each estimate takes seconds)."""

from __future__ import annotations

import sys
from types import TracebackType
from typing import Any

from memprofiler.advice.result import Row


class Progress:
    """A rich status line on stderr: the change being estimated, and how many are done."""

    def __init__(self, enabled: bool | None = None) -> None:
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self.done = 0
        self._progress: Any = None
        self._task: Any = None

    def __enter__(self) -> Progress:
        if self.enabled:
            from rich.console import Console
            from rich.progress import Progress as RichProgress
            from rich.progress import SpinnerColumn, TextColumn, TimeElapsedColumn

            self._progress = RichProgress(
                SpinnerColumn(),
                TextColumn("[bold]advise[/] {task.completed} estimated"),
                TextColumn("{task.description}"),
                TimeElapsedColumn(),
                console=Console(stderr=True),
                transient=True,
            )
            self._progress.start()
            self._task = self._progress.add_task("the plan as given", total=None)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._progress is not None:
            self._progress.stop()

    def __call__(self, change: str, row: Row | None) -> None:
        if row is not None:
            self.done += 1
        if self._progress is None or self._task is None:
            return
        words = change if len(change) <= 70 else change[:67] + "..."
        self._progress.update(self._task, completed=self.done, description=words if row is None else "")
