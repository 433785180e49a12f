"""The pages' scripts and styles: files in ``reporters/assets/`` shipped with the package, read once.

A script gets its data from a ``<script type='application/json'>`` element of the page, never by
text put into the script, so each file is the script the browser runs, byte for byte.
"""

from __future__ import annotations

from functools import cache
from importlib.resources import files


@cache
def asset(name: str) -> str:
    """The text of ``reporters/assets/<name>``, a ``.js`` or ``.css`` file of the package.

    Raises:
        FileNotFoundError: no such file (an install without the package data).
    """
    return files("memprofiler.reporters").joinpath("assets", name).read_text(encoding="utf-8")
