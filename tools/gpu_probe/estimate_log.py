"""The estimate of the same steps, its dispatch and allocator replay patched to log a history
shaped like the real one (same call labels, the call's index as metadata, step markers)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from memprofiler.estimate import EstimatePlan, estimate_plan
from memprofiler.estimate.probe import Probe

from .history import MARK, Call, Event
from .real import set_attention


class EstimateLog(Probe):
    """Patches the estimate's dispatch, workspaces and allocator replay to log its allocations as
    the real history does: one event per alloc/free, the call's index as metadata; marks each step
    as the engine's probe."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.calls: list[Call] = []
        self.live: set[int] = set()
        self.step = self.depth = 0
        self.window: int | None = None
        self.kind = "out"
        self.allocated = 0
        self.step_peaks: dict[int, int] = {}
        self.slack_of: dict[int, int] = {}  # live block -> its size minus its rounded request
        self.slack = 0
        self.step_slack: dict[int, int] = {}  # the slack at each step's (first) peak

    # the outermost patched dispatch opens a call; the tracker's names it
    def open(self, named: Any, func: Any) -> None:
        from memprofiler.estimate.tracker import _deepest

        self.depth += 1
        if self.depth == 1:
            self.window = len(self.calls)
            self.calls.append(Call(self.step, "(no op)", False, "?", peak=self.allocated))
        call = self.calls[self.window] if self.window is not None else None
        if named is not None and call is not None and call.op == "(no op)":
            mt = named._mod_tracker
            call.op, call.bw, call.module = str(func), bool(mt.is_bw), _deepest(mt.parents)

    def close(self) -> None:
        self.depth -= 1
        if self.depth == 0 and self.window is not None:
            self.calls[self.window].after = self.allocated
            self.window = None

    def on_alloc(self, allocator: Any, key: int, nbytes: int) -> None:
        from memprofiler.estimate.allocator.caching import round_size

        self.allocated = allocator.allocated
        placed = allocator.block(key)
        if placed is not None:
            self.slack_of[key] = placed[1] - round_size(nbytes, allocator.config)
            self.slack += self.slack_of[key]
        meta = str(self.window) if self.window is not None else ""
        self.events.append(
            {"action": "alloc", "addr": key, "size": nbytes, "user_metadata": meta, "kind": self.kind}
        )
        self.live.add(key)
        if self.window is not None:
            call = self.calls[self.window]
            call.peak = max(call.peak, self.allocated)
        if self.allocated > self.step_peaks.get(self.step, 0):
            self.step_peaks[self.step] = self.allocated
            self.step_slack[self.step] = self.slack

    def on_free(self, allocator: Any, key: int) -> None:
        self.allocated = allocator.allocated
        self.slack -= self.slack_of.pop(key, 0)
        if key in self.live:
            self.live.discard(key)
            meta = str(self.window) if self.window is not None else ""
            self.events.append({"action": "free_requested", "addr": key, "size": 0, "user_metadata": meta})

    def step_start(self, step: int) -> None:
        self.mark(step)

    def mark(self, step: int) -> None:
        self.step = step
        addr = -3_000_000 - step
        self.events.append({"action": "alloc", "addr": addr, "size": MARK + step, "user_metadata": ""})
        self.events.append(
            {"action": "free_requested", "addr": addr, "size": MARK + step, "user_metadata": ""}
        )

    @contextlib.contextmanager
    def installed(self) -> Iterator[EstimateLog]:
        from memprofiler.estimate import tracker as trk
        from memprofiler.estimate.allocator import caching as al
        from memprofiler.estimate.cuda import ops

        log = self
        saved: list[tuple[Any, str, Any]] = []

        def patch(owner: Any, name: str, make: Callable[[Any], Any]) -> None:
            orig = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
            saved.append((owner, name, orig))
            setattr(owner, name, make(orig))

        def dispatch(named: bool) -> Callable[[Any], Any]:
            def make(orig: Any) -> Any:
                def wrapped(mode: Any, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
                    log.open(mode if named else None, func)
                    try:
                        return orig(mode, func, types, args, kwargs)
                    finally:
                        log.close()

                return wrapped

            return make

        def kind(name: str) -> Callable[[Any], Any]:
            def make(orig: Any) -> Any:
                def wrapped(tracker: Any, *args: Any) -> Any:
                    log.kind = name
                    try:
                        return orig(tracker, *args)
                    finally:
                        log.kind = "out"

                return wrapped

            return make

        def alloc(orig: Any) -> Any:
            def wrapped(replay: Any, key: int, nbytes: int, stream: int = 0) -> None:
                orig(replay, key, nbytes, stream)
                if getattr(replay, "what_if", False):  # the convolution margin's twin
                    return
                if nbytes > 0 and not getattr(replay, "probe_synthetic", False):
                    log.on_alloc(replay, key, nbytes)

            return wrapped

        def free(orig: Any) -> Any:
            def wrapped(replay: Any, key: int) -> None:
                orig(replay, key)
                if getattr(replay, "what_if", False):
                    return
                if not getattr(replay, "probe_synthetic", False):  # the dry run's real side
                    log.on_free(replay, key)

            return wrapped

        patch(trk.LedgerMixin, "__torch_dispatch__", dispatch(True))
        patch(ops.OpHooks, "__torch_dispatch__", dispatch(False))  # the workspaces are held inside it
        patch(trk.LedgerMixin, "hold", kind("workspace"))
        patch(trk.LedgerMixin, "transient", kind("scratch"))
        patch(al.AllocatorReplay, "alloc", alloc)
        patch(al.AllocatorReplay, "free", free)
        try:
            yield self
        finally:
            for owner, name, orig in reversed(saved):
                setattr(owner, name, orig)


def estimate_run(
    panel: Any,
    name: str,
    attn: str | None,
    gpu: str | None,
    device: str,
    version: str | None = None,
    precision: str = "32-true",
) -> dict[str, Any]:
    import torch

    make_model, make_batch = panel.PANEL[name]
    torch.manual_seed(0)
    with torch.device("meta"):
        model = make_model()
    set_attention(model, attn)
    model.train()
    version = version or ".".join(torch.__version__.split("+")[0].split(".")[:2])
    with EstimateLog().installed() as log:
        plan = EstimatePlan(
            optimizer=panel.OPTIMIZERS["adamw"],
            loss_fn=panel.hf_loss,
            precision=precision,
            gpu=gpu,
            torch_version=version,
            device=device,
        )
        est = estimate_plan(model, make_batch(), plan, probe=log)
    info = {
        "peak_bytes": est.peak_bytes,
        "reserved_peak_bytes": est.reserved_peak_bytes,
        "step_peaks": [log.step_peaks.get(s, 0) for s in (1, 2)],
        # live blocks' size minus their 512 B-rounded request, at each step's peak
        "slack_at_step_peaks": [log.step_slack.get(s, 0) for s in (1, 2)],
        # the log replays what the estimate replayed: its peak is the estimate's (CUDA view)
        "log_matches_estimate": max(log.step_peaks.values(), default=0) == est.peak_bytes,
        "peak_at": f"{est.peak_module} ({est.peak_phase}, step {est.peak_step})",
        "by_category": est.by_category,
        "workspace_bytes": est.workspace_bytes,
        "target": est.target,
        "device": device,
        "notes": est.notes[:8],
    }
    return {"info": info, "events": log.events, "calls": log.calls}
