"""Another build of the compiled pack hook beside this one, for benchmarks that compare the two."""

from __future__ import annotations

import importlib.machinery
import importlib.util
from pathlib import Path
from typing import Any

from memprofiler.collectors import saved_tensors
from memprofiler.collectors.saved_tensors import SavedTensorsCollector


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
