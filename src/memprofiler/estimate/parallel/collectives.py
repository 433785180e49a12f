"""Functional collectives on fake tensors, waited on as a real run waits on them.

DTensor (tensor and sequence parallelism) communicates through torch's functional collectives
(``_c10d_functional.all_gather_into_tensor``, ``reduce_scatter_tensor``, ``all_reduce``, ...).
In a real run each returns an ``AsyncCollectiveTensor`` whose ``wait_tensor`` runs lazily, at
the output's first use (``torch/distributed/_functional_collectives.py``, ``_maybe_wrap_tensor``),
so the collective's tensors live until then. On fake tensors torch takes itself to be tracing
(``_are_we_tracing``: a fake mode is active) and waits at once, which frees them sooner than the
job will. :func:`lazy_collectives` drops that one clause for the block: under a compile or a
proxy trace it still waits at once.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


@contextlib.contextmanager
def lazy_collectives() -> Iterator[None]:
    """Within the block, functional collectives on fake tensors wait as in a real run."""
    import torch.distributed._functional_collectives as fc

    tracing = fc._are_we_tracing
    fc._are_we_tracing = _compiling_or_proxy  # type: ignore[assignment]
    try:
        yield
    finally:
        fc._are_we_tracing = tracing  # type: ignore[assignment]


def _compiling_or_proxy() -> bool:
    """``_are_we_tracing`` without its fake-mode clause."""
    import torch
    from torch.compiler import is_dynamo_compiling
    from torch.fx.experimental.proxy_tensor import get_proxy_mode

    if is_dynamo_compiling():
        return True
    if torch._C._dispatch_tls_is_dispatch_key_included(torch._C.DispatchKey.PythonDispatcher):
        return True
    return get_proxy_mode() is not None
