"""Progress on the terminal while candidates are estimated (each estimate takes seconds)."""

from __future__ import annotations

import sys
import time
from types import TracebackType
from typing import Any

from memprofiler.advice.result import Row


class Progress:
    """A rich status line on stderr: the change being estimated, and how many are done.

    ``enabled=None`` shows it only where stderr is a terminal, so logs and pipes stay quiet.
    Asked for (``True``) where stderr is no terminal (a CI log), it writes one plain line per
    estimate instead of redrawing one.
    """

    def __init__(self, enabled: bool | None = None) -> None:
        tty = sys.stderr.isatty()
        self.enabled = tty if enabled is None else enabled
        self.lines = self.enabled and not tty
        """One line per estimate (stderr is no terminal)."""
        self.done = 0
        self._progress: Any = None
        self._task: Any = None
        self._started = time.monotonic()

    def __enter__(self) -> Progress:
        self._started = time.monotonic()
        if self.enabled and not self.lines:
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
        words = change if len(change) <= 70 else change[:67] + "..."
        if self.lines and row is not None:
            took = time.monotonic() - self._started
            print(f"advise: {self.done} estimated ({took:.0f} s): {words}", file=sys.stderr, flush=True)
        if self._progress is None or self._task is None:
            return
        # the last change estimated stays named (side by side, rows come in faster than redraws),
        # cut short enough that the count beside it is never cut on an 80-column terminal
        short = change if len(change) <= 40 else change[:37] + "..."
        self._progress.update(self._task, completed=self.done, description=short)
