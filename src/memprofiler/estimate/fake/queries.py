"""Answers to a fake tensor's device query above the modes that do not need to see it.

A fake tensor asks its mode for its device: torch's C++ code that reads a tensor's device (the
autograd engine on each gradient, each view op) dispatches ``prim.device`` through every dispatch
mode on the stack down to the fake mode. Two 7B FSDP2 steps ask 46,613 times, as many as they run
ops, and each trip through this package's modes and torch's memory tracker costs about as much
as an op. None of those modes counts a device: the first one the query reaches answers it as the
fake mode would (``meta`` inside a fake kernel, else the tensor's fake device).
"""

from __future__ import annotations

from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor

DEVICE = torch.ops.prim.device.default
"""The op a device query dispatches."""


def device_of(args: tuple[Any, ...]) -> torch.device | None:
    """The device a ``prim.device`` query on ``args`` answers, or ``None`` when only the modes
    below can answer it (not one fake tensor)."""
    if len(args) == 1 and isinstance(args[0], FakeTensor):
        return args[0].device  # the fake mode's answer: meta inside a kernel, else the fake device
    return None
