"""The user's line: where a memprofiler warning is attributed, instead of a line of our own.

A fixed ``stacklevel`` lands inside memprofiler, Lightning or torch (a hook is called from
a hook): a warning then printed an internal source line such as
``self._collectors = CollectorSet(...)``. :func:`warn_at_user` walks out to the first frame of
the user's own code (their script, their test) and warns there; where there is none (a
background thread, ``python -m memprofiler.lightning``) it warns with no source line at all.
"""

from __future__ import annotations

import sys
import sysconfig
import warnings
from types import FrameType

from memprofiler.errors import MemProfilerWarning

#: Top-level packages whose frames are never the user's line: ours, and the frameworks that
#: call into us (LightningCLI instantiates through jsonargparse).
_INTERNAL = frozenset(
    {
        "memprofiler",
        "lightning",
        "pytorch_lightning",
        "lightning_fabric",
        "lightning_utilities",
        "torch",
        "jsonargparse",
        "typing_extensions",
    }
)
_STDLIB = sysconfig.get_paths()["stdlib"]


def _internal(frame: FrameType) -> bool:
    g = frame.f_globals
    spec = g.get("__spec__")
    # `python -m memprofiler.lightning` runs our module as `__main__`; its spec has the real name
    name = str(getattr(spec, "name", None) or g.get("__name__", ""))
    if name.partition(".")[0] in _INTERNAL:
        return True
    path = frame.f_code.co_filename
    # contextlib, threading, runpy and friends: the standard library calling on our behalf
    return path.startswith("<frozen") or (path.startswith(_STDLIB) and "-packages" not in path)


def user_frame(depth: int = 1) -> FrameType | None:
    """The innermost frame, ``depth`` frames out from the caller or further, of code that is
    neither memprofiler's, a framework's nor the standard library's; ``None`` if none is."""
    try:
        frame: FrameType | None = sys._getframe(depth + 1)
    except ValueError:
        return None
    while frame is not None and _internal(frame):
        frame = frame.f_back
    return frame


def warn_at_user(message: str, category: type[Warning] = MemProfilerWarning) -> None:
    """``warnings.warn`` attributed to the user's line (see :func:`user_frame`), or to no line.

    Example:
        >>> warn_at_user("memprofiler: `x` is deprecated", FutureWarning)  # doctest: +SKIP
    """
    frame = user_frame(2)
    if frame is None:
        # Lineno 0: the formatter finds no source line to print.
        warnings.warn_explicit(message, category, "memprofiler", 0, module="memprofiler", registry={})
        return
    g = frame.f_globals
    warnings.warn_explicit(
        message,
        category,
        frame.f_code.co_filename,
        frame.f_lineno,
        module=str(g.get("__name__", "")),
        registry=g.setdefault("__warningregistry__", {}),
    )
