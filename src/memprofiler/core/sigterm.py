"""Write what was collected when a plain loop is sent SIGTERM (schedulers' polite kill).

Lightning turns SIGTERM into an exception that reaches ``on_exception``; a plain loop gets no
such chance, so the ``with MemProfiler(...)`` block installs a handler for its duration. It
is only installed where SIGTERM still has its default action (never over Lightning's, a
launcher's or the user's own handler), and in the main thread. The handler writes the files,
puts the default action back and re-sends the signal, so the process still ends by SIGTERM
with the exit status a scheduler expects.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from types import FrameType


class SigtermDump:
    """Installs, while entered, a SIGTERM handler that calls ``on_signal`` then dies as before."""

    def __init__(self, on_signal: Callable[[], object]) -> None:
        self._on_signal = on_signal
        self._installed = False

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
            return
        signal.signal(signal.SIGTERM, self._handle)
        self._installed = True

    def remove(self) -> None:
        if self._installed and signal.getsignal(signal.SIGTERM) == self._handle:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        self._installed = False

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        try:
            self._on_signal()
        finally:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            self._installed = False
            os.kill(os.getpid(), signal.SIGTERM)
