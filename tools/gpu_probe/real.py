"""The real steps: as measured (untagged), then with the allocator's history on and every aten op
tagged (:class:`CudaBackend`); on a machine without CUDA a CPU run stands in (:class:`CpuBackend`)."""

from __future__ import annotations

import contextlib
import importlib.util
import threading
import traceback
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .history import MARK, Call, Event, rounded
from .synthetic import SyntheticHistory

PANEL_DIR = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "gpu_h200"


def _storage_ptrs(out: Any, ptr: Callable[[Any], int]) -> frozenset[int]:
    import torch
    from torch.utils._pytree import tree_flatten

    leaves, _ = tree_flatten(out)
    ptrs = set()
    for t in leaves:
        if isinstance(t, torch.Tensor):
            with contextlib.suppress(Exception):  # a tensor without storage: not an allocation
                ptrs.add(ptr(t.untyped_storage()))
    return frozenset(ptrs)


class CudaBackend:
    """The allocator's history and exact per-call peaks (peak stats reset before each op)."""

    def __init__(self, max_entries: int) -> None:
        import torch

        self.torch = torch
        self.mem = torch.cuda.memory
        self.metadata = hasattr(self.mem, "_set_memory_metadata")
        self.mem._record_memory_history(
            enabled="all", context="alloc", stacks="python", max_entries=max_entries
        )
        torch.cuda.reset_peak_memory_stats()
        self.step_max = self.step_reserved = 0
        self.device = torch.cuda.current_device()

    def _fold(self) -> None:
        cuda = self.torch.cuda
        self.step_max = max(self.step_max, cuda.max_memory_allocated())
        self.step_reserved = max(self.step_reserved, cuda.max_memory_reserved())
        cuda.reset_peak_memory_stats()

    def begin(self, idx: int) -> None:
        self._fold()  # what happened between ops counts for the step
        if self.metadata:
            self.mem._set_memory_metadata(str(idx))

    def end(self, call: Call, out: Any) -> None:
        if self.metadata:
            self.mem._set_memory_metadata("")
        cuda = self.torch.cuda
        call.peak, call.after = cuda.max_memory_allocated(), cuda.memory_allocated()
        self._fold()
        call.outs = _storage_ptrs(out, lambda st: int(st.data_ptr()))

    def setup(self, tensors: Sequence[Any]) -> None:
        return

    def mark(self, step: int) -> None:
        x = self.torch.empty(MARK + step, dtype=self.torch.uint8, device="cuda")
        del x

    def step_end(self) -> list[int]:
        self.torch.cuda.synchronize()
        self._fold()
        peaks = [self.step_max, self.step_reserved]
        self.step_max = self.step_reserved = 0
        return peaks

    def snapshot(self) -> dict[str, Any]:
        snap: dict[str, Any] = self.mem._snapshot()
        self.mem._record_memory_history(enabled=None)
        return snap

    def events(self, snap: dict[str, Any]) -> list[Event]:
        traces = snap.get("device_traces") or [[]]
        return list(traces[self.device] if len(traces) > 1 else traces[0])

    def cublas_workspace(self) -> int:
        before = self.torch.cuda.memory_allocated()
        self.torch._C._cuda_clearCublasWorkspaces()
        return before - self.torch.cuda.memory_allocated()


class CpuBackend:
    """``--cpu-dry-run``: a history like the allocator's, of the storages CPU ops create, with the
    blocks and segments the estimate's allocator model gives them (:class:`SyntheticHistory`);
    the step peaks are of 512 B-rounded requests, as the CPU estimate counts them."""

    def __init__(self) -> None:
        from torch.utils.weak import WeakIdKeyDictionary

        self.history = SyntheticHistory()
        self.addr: Any = WeakIdKeyDictionary()
        self.local = threading.local()
        self.allocated = self.peak_since = self.step_max = 0
        self.metadata = True
        self.device = 0

    def _meta(self) -> str:
        return str(getattr(self.local, "meta", ""))

    def _alloc(self, size: int, frames: bool = True) -> tuple[int, int]:
        stack = traceback.extract_stack(limit=40)[::-1] if frames else []
        fr = [{"filename": f.filename, "line": f.lineno, "name": f.name} for f in stack]
        key, addr = self.history.alloc(size, self._meta(), fr)
        self.allocated += rounded(size)
        self.peak_since = max(self.peak_since, self.allocated)
        return key, addr

    def _free(self, key: int, size: int) -> None:
        self.history.free(key, self._meta())
        self.allocated -= rounded(size)

    def _track(self, st: Any) -> int:
        if st not in self.addr:
            nbytes = int(st.nbytes())
            if nbytes == 0:  # the CUDA allocator makes no block (and no entry) for 0 bytes
                return 0
            key, addr = self._alloc(nbytes)
            self.addr[st] = addr
            weakref.finalize(st, self._free, key, nbytes)
        return int(self.addr[st])

    def begin(self, idx: int) -> None:
        self.step_max = max(self.step_max, self.peak_since)
        self.peak_since = self.allocated
        self.local.meta = str(idx)

    def end(self, call: Call, out: Any) -> None:
        call.outs = _storage_ptrs(out, self._track)
        self.local.meta = ""
        call.peak, call.after = self.peak_since, self.allocated
        self.step_max = max(self.step_max, self.peak_since)
        self.peak_since = self.allocated

    def setup(self, tensors: Sequence[Any]) -> None:
        for t in tensors:
            self._track(t.untyped_storage())

    def mark(self, step: int) -> None:
        self._free(self._alloc(MARK + step, frames=False)[0], MARK + step)

    def step_end(self) -> list[int]:
        peaks = [max(self.step_max, self.peak_since), 0]
        self.step_max, self.peak_since = 0, self.allocated
        return peaks

    def snapshot(self) -> dict[str, Any]:
        return self.history.snapshot()

    def events(self, snap: dict[str, Any]) -> list[Event]:
        return list(snap["device_traces"][0])

    def cublas_workspace(self) -> int:
        return 0


def _tagger(backend: Any, mt: Any) -> Any:
    from torch.utils._python_dispatch import TorchDispatchMode

    from memprofiler.estimate.tracker import _deepest

    class OpTagger(TorchDispatchMode):
        """Every aten op: a :class:`Call` (op, module, forward/backward) and the backend's figures."""

        def __init__(self) -> None:
            super().__init__()
            self.calls: list[Call] = []
            self.step = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            call = Call(self.step, str(func), bool(mt.is_bw), _deepest(mt.parents))
            self.calls.append(call)
            backend.begin(len(self.calls) - 1)
            out = None
            try:
                out = func(*args, **(kwargs or {}))
                return out
            finally:
                backend.end(call, out)

    return OpTagger()


def load_panel() -> Any:
    spec = importlib.util.spec_from_file_location("gpu_probe_panel", PANEL_DIR / "panel.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def set_attention(model: Any, attn: str | None) -> None:
    """As benchmarks/estimate_gpu.py does: every config the model holds."""
    if attn is None:
        return
    for m in model.modules():
        if hasattr(m, "config"):
            m.config._attn_implementation = attn


def prepare(model: Any, batch: Any, precision: str) -> tuple[Any, Any, Any]:
    """The model, the batch and the forward's context for a Lightning precision: ``bf16-mixed``
    runs forward and loss under autocast (backward outside it, as Lightning does), ``bf16-true``
    casts the model and the batch's floating tensors."""
    import contextlib

    import torch
    from torch.utils._pytree import tree_map_only

    if precision == "bf16-true":
        model = model.to(torch.bfloat16)
        batch = tree_map_only(
            torch.Tensor, lambda t: t.to(torch.bfloat16) if t.is_floating_point() else t, batch
        )
    if precision == "bf16-mixed":
        device = next(iter(model.parameters())).device.type
        return model, batch, lambda: torch.autocast(device, dtype=torch.bfloat16)
    return model, batch, contextlib.nullcontext


def plain_run(panel: Any, name: str, attn: str | None, precision: str = "32-true") -> dict[str, Any]:
    """The two steps as measured, nothing recorded or tagged (max allocated / reserved per step),
    then everything freed, the cuBLAS workspaces and the cache too: the tagged run starts fresh."""
    import gc

    import torch
    from torch.utils._pytree import tree_map_only

    make_model, make_batch = panel.PANEL[name]
    torch.cuda.reset_peak_memory_stats()
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = make_model()
    set_attention(model, attn)
    model.train()
    batch = tree_map_only(torch.Tensor, lambda t: t.to("cuda"), make_batch())
    model, batch, forward_ctx = prepare(model, batch, precision)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    peaks = []
    for _ in (1, 2):
        with forward_ctx():
            loss = model(**batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        torch.cuda.synchronize()
        peaks.append([torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()])
        torch.cuda.reset_peak_memory_stats()
    del model, batch, opt, loss
    gc.collect()
    torch.cuda.synchronize()
    torch._C._cuda_clearCublasWorkspaces()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    return {"plain_step_peaks": peaks, "allocated_after_plain_run": torch.cuda.memory_allocated()}


def real_run(
    panel: Any, name: str, attn: str | None, cuda: bool, max_entries: int, precision: str = "32-true"
) -> dict[str, Any]:
    import torch
    from torch.distributed._tools.mod_tracker import ModTracker
    from torch.utils._pytree import tree_map_only

    make_model, make_batch = panel.PANEL[name]
    device = "cuda" if cuda else "cpu"
    plain: dict[str, Any] = {}
    if cuda:
        try:
            plain = plain_run(panel, name, attn, precision)
        except Exception as err:  # the tagged run still goes
            plain = {"plain_error": f"{type(err).__name__}: {err}"}
    backend: Any = CudaBackend(max_entries) if cuda else CpuBackend()
    torch.manual_seed(0)
    with torch.device(device):
        model = make_model()
    set_attention(model, attn)
    model.train()
    batch = tree_map_only(torch.Tensor, lambda t: t.to(device), make_batch())
    model, batch, forward_ctx = prepare(model, batch, precision)
    backend.setup([*model.parameters(), *model.buffers(), *batch.values()])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    mt = ModTracker()
    tagger = _tagger(backend, mt)
    peaks = []
    with mt:
        for step in (1, 2):
            backend.mark(step)
            tagger.step = step
            with tagger:
                with forward_ctx():
                    loss = model(**batch).loss
                loss.backward()
                opt.step()
                opt.zero_grad()
            peaks.append(backend.step_end())
    snap = backend.snapshot()
    calls: list[Call] = tagger.calls
    ops: dict[str, int] = {}
    for c in calls:
        if "attention" in c.op or "softmax" in c.op or "sdp" in c.op:
            ops[c.op] = ops.get(c.op, 0) + 1
    info: dict[str, Any] = {
        **plain,
        "step_peaks": peaks,
        "attn_impl": getattr(getattr(model, "config", None), "_attn_implementation", None),
        "attention_ops": ops,
        "metadata_supported": backend.metadata,
        "calls": len(calls),
        "cublas_workspace_bytes": backend.cublas_workspace(),
    }
    if cuda:
        b = torch.backends
        info["sdp_flags"] = {
            k: getattr(b.cuda, f"{k}_sdp_enabled")() for k in ("flash", "mem_efficient", "math", "cudnn")
        }
        info["cudnn"] = b.cudnn.version()
        info["allocator_settings"] = snap.get("allocator_settings")
    events = backend.events(snap)
    info["events"] = len(events)
    info["events_with_metadata"] = sum(1 for ev in events if ev.get("user_metadata"))
    device_index = backend.device if len(snap.get("device_traces") or []) > 1 else 0
    return {"info": info, "events": events, "calls": calls, "snapshot": snap, "device": device_index}
