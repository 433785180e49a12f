"""Regenerate docs/img/report.png: the HTML report of a demo run, shot in headless Chromium.

Run from the repository root (about a minute on CPU)::

    python tools/report_screenshot.py            # demo run in a temporary directory
    python tools/report_screenshot.py --out docs/img/report.png

It runs ``make demo``'s own command (``examples/demo.py fit --config configs/demo.yaml``, no
override: the picture shows the calls the demo collects), writes ``memprofiler report``'s HTML
as the README's caption says, and photographs its first screen through Playwright driving
Debian's ``chromium`` with every non-file request aborted. ``make screenshot`` runs it.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "img" / "report.png")
    parser.add_argument("--browser", default=os.environ.get("MEMPROFILER_CHROMIUM", "/usr/bin/chromium"))
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [sys.executable, str(ROOT / "examples" / "demo.py"), "fit",
             "--config", str(ROOT / "configs" / "demo.yaml")],
            cwd=tmp, env=env, check=True, capture_output=True,
        )  # fmt: skip
        html = Path(tmp) / "report.html"
        subprocess.run(
            [sys.executable, "-m", "memprofiler", "report", "runs/demo", "-o", str(html)],
            cwd=tmp, env=env, check=True, capture_output=True,
        )  # fmt: skip
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=args.browser, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1200, "height": 900})
            page.route("**/*", lambda r: r.continue_() if r.request.url.startswith("file://") else r.abort())
            page.goto(html.as_uri())
            page.screenshot(path=str(args.out))
            browser.close()
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
