"""A tiny Chrome DevTools Protocol client over ``--remote-debugging-pipe`` (no websocket library).

Chromium reads NUL-terminated JSON commands on fd 3 and writes replies and events on fd 4.
Used by the browser test to open a report offline and read back console errors and layout.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import select
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")

#: Every switch that keeps Chromium off the network and quiet; requests that slip through go
#: to a dead proxy and to a resolver that knows no host.
OFFLINE_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-default-apps",
    "--disable-extensions",
    "--disable-sync",
    "--disable-features=Translate,OptimizationHints,MediaRouter",
    "--no-first-run",
    "--no-default-browser-check",
    "--metrics-recording-only",
    "--proxy-server=http://127.0.0.1:9",
    "--host-resolver-rules=MAP * ~NOTFOUND",
)


def _high(fd: int) -> int:
    new = fcntl.fcntl(fd, fcntl.F_DUPFD, 10)
    os.close(fd)
    return new


def find_browser() -> str | None:
    """``$MEMPROFILER_CHROMIUM``, else the first Chromium-family binary on ``PATH``."""
    env = os.environ.get("MEMPROFILER_CHROMIUM")
    if env:
        return env
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    return None


class CdpPipe:
    """Start a headless browser and talk CDP to it; use as a context manager."""

    def __init__(self, binary: str, profile_dir: Path, timeout: float = 60.0) -> None:
        self.timeout = timeout
        cmd_r, self._cmd_w = os.pipe()
        self._out_r, out_w = os.pipe()
        # Move the child's ends above 4 so the shell's `3<&N 4>&M` never clobbers one with the other.
        cmd_r, out_w = _high(cmd_r), _high(out_w)
        args = [*OFFLINE_FLAGS, "--remote-debugging-pipe", f"--user-data-dir={profile_dir}", "about:blank"]
        # A Python trampoline puts our pipe ends on the fd numbers Chromium expects (3 and 4);
        # dash's redirections cannot name fds above 9.
        trampoline = (
            "import os, sys; os.dup2(int(sys.argv[1]), 3); os.dup2(int(sys.argv[2]), 4); "
            "os.execv(sys.argv[3], sys.argv[3:])"
        )
        self.proc = subprocess.Popen(
            [sys.executable, "-c", trampoline, str(cmd_r), str(out_w), binary, *args],
            pass_fds=(cmd_r, out_w),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(cmd_r)
        os.close(out_w)
        self._buf = b""
        self._next_id = 0
        self.events: list[dict[str, Any]] = []

    def __enter__(self) -> CdpPipe:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.send("Browser.close")
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in (self._cmd_w, self._out_r):
            with contextlib.suppress(OSError):
                os.close(fd)

    def _read_message(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no reply from the browser")
            ready, _, _ = select.select([self._out_r], [], [], left)
            if ready:
                chunk = os.read(self._out_r, 1 << 16)
                if not chunk:
                    raise RuntimeError(f"browser exited (code {self.proc.poll()})")
                self._buf += chunk
        raw, self._buf = self._buf.split(b"\0", 1)
        return json.loads(raw)

    def send(
        self, method: str, params: dict[str, Any] | None = None, session: str | None = None
    ) -> dict[str, Any]:
        """Send a command and return its ``result``; events seen meanwhile go to :attr:`events`."""
        self._next_id += 1
        msg: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._cmd_w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + self.timeout
        while True:
            reply = self._read_message(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_event(self, method: str, session: str | None = None) -> dict[str, Any]:
        """Wait until ``method`` arrives (it may already be in :attr:`events`)."""
        for ev in self.events:
            if ev.get("method") == method and (session is None or ev.get("sessionId") == session):
                return ev
        deadline = time.monotonic() + self.timeout
        while True:
            ev = self._read_message(deadline)
            self.events.append(ev)
            if ev.get("method") == method and (session is None or ev.get("sessionId") == session):
                return ev
