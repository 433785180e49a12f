"""Another build of the compiled pack hook beside this one, for benchmarks that compare the two."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
from pathlib import Path
from typing import Any

from memprofiler.collectors import saved_tensors
from memprofiler.collectors.saved_tensors import SavedTensorsCollector


def this_build() -> str:
    """The pack hook these figures are of (``saved_tensors.packer_build``), recorded with them; a
    stale build is said on stderr, since its figures are not the figures of the source beside it."""
    build = saved_tensors.packer_build()
    if build == "compiled, stale":
        print(
            "memprofiler._packer was built from another _packer.c: these figures are not this source's"
            " (rebuild: `python setup.py build_ext --inplace`)",
            file=sys.stderr,
        )
    return build


def previous_packer(path: Path) -> type[Any]:
    """The ``Packer`` of another build of ``memprofiler._packer`` (``_packer*.so`` of an earlier
    commit), loaded beside the one in use."""
    loader = importlib.machinery.ExtensionFileLoader("memprofiler._packer", str(path))
    spec = importlib.util.spec_from_loader("memprofiler._packer", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    packer: type[Any] = module.Packer
    if packer is saved_tensors._CPacker:
        raise SystemExit(f"--previous {path}: this is the build already loaded; give another one")
    return packer


class PreviousCollector(SavedTensorsCollector):
    """The collector with the pack hook of ``packer`` (set it first: ``previous_packer``)."""

    packer: type[Any]

    def _new_packer(self) -> Any:
        current = saved_tensors._CPacker
        saved_tensors._CPacker = self.packer
        try:
            return super()._new_packer()
        finally:
            saved_tensors._CPacker = current
