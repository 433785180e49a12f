"""Notes an estimate adds for a model whose real step allocates what an op-level count cannot see.

The estimate counts the tensors that ops create. Two known cases make a real step differ:
scratch a kernel allocates inside itself (never an op's output), and code that takes another
path on fake tensors than on real ones.
"""

from __future__ import annotations

from torch import nn

CONV_SCRATCH = (
    "kernel-internal scratch is invisible to an op-level count: convolution_backward makes a contiguous "
    "copy of its gradient inside the kernel (about one activation of the layer), not counted here"
)


def model_notes(model: nn.Module) -> list[str]:
    """The notes that apply to ``model`` (its modules are looked at, nothing is run)."""
    notes: list[str] = []
    modules = list(model.modules())
    if any(isinstance(m, nn.modules.conv._ConvNd) for m in modules):
        notes.append(CONV_SCRATCH)
    return notes
