"""Open a page in real headless Chromium through Playwright, offline, and record what went wrong.

Playwright drives Debian's ``chromium`` (``.ci/run`` installs it; ``MEMPROFILER_CHROMIUM`` names
another binary); Playwright's own browser downloads are never used. Every request is routed: a
``file://`` URL loads, anything else is aborted and recorded, so a test can assert that a page
asked the network for nothing. Console errors and uncaught exceptions are recorded too.

Example::

    with open_page(html) as view:
        assert view.errors == [] and view.offsite == []
        assert "Peak" in view.page.inner_text("body")
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_browser() -> str | None:
    """The Chromium binary to drive, or None where there is none."""
    named = os.environ.get("MEMPROFILER_CHROMIUM")
    if named:
        return named if Path(named).exists() else shutil.which(named)
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    return None


def skip_reason() -> str | None:
    """Why browser tests cannot run here (None when they can)."""
    if find_browser() is None:
        return "no Chromium found (apt-get install -y chromium, or set MEMPROFILER_CHROMIUM)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright package is not installed (pip install -e '.[dev]')"
    return None


#: ``pytestmark`` for a browser test module: slow, and skipped with the reason where no browser runs.
BROWSER_MARKS = [pytest.mark.slow, pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or "")]


@dataclass
class PageView:
    """An open page and what it did: console errors, uncaught exceptions, requests."""

    page: Any
    errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    offsite: list[str] = field(default_factory=list)

    def eval(self, expression: str) -> Any:
        """Evaluate a JavaScript expression (or a function body's arrow) in the page."""
        return self.page.evaluate(expression)


@contextlib.contextmanager
def open_page(html: Path, width: int = 1400, height: int = 900, wait_ms: int = 200) -> Iterator[PageView]:
    """Open ``html`` from its ``file://`` URL in headless Chromium with the network refused."""
    from playwright.sync_api import sync_playwright

    browser_path = find_browser()
    assert browser_path is not None, skip_reason()
    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=browser_path,
            args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
        )
        try:
            page = browser.new_page(viewport={"width": width, "height": height})
            view = PageView(page)

            def route(route: Any) -> None:
                url = route.request.url
                view.requests.append(url)
                if url.startswith(("file://", "data:", "blob:")):
                    route.continue_()
                else:
                    view.offsite.append(url)
                    route.abort()

            page.route("**/*", route)
            page.on(
                "console",
                lambda msg: view.errors.append(msg.text) if msg.type in ("error", "assert") else None,
            )
            page.on("pageerror", lambda exc: view.errors.append(f"uncaught: {exc}"))
            page.goto(html.resolve().as_uri(), wait_until="load")
            if wait_ms:
                page.wait_for_timeout(wait_ms)
            yield view
        finally:
            browser.close()
