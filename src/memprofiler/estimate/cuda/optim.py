"""Step the optimizer as it steps on CUDA: torch's foreach implementation by default.

``torch.optim`` picks the implementation per step when the user left ``foreach`` and ``fused``
unset (``_default_to_fused_or_foreach`` in ``torch/optim/optimizer.py``): the foreach kernels
when every parameter is a CUDA tensor of a supported type and the optimizer is not
``differentiable``, else the per-tensor loop. On the CPU, where the estimate runs, that rule
picks the loop. The two keep the same state but not the same temporaries: AdamW's foreach step
makes ``exp_avg_sq.sqrt()`` for every parameter at once (one parameter-sized set, alive with the
gradients and both moments), the loop one parameter at a time. A CUDA target gets CUDA's choice;
an explicit ``foreach=`` or ``fused=`` is left as the user set it.
"""

from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.optim.optimizer import _foreach_supported_types


def foreach_as_on_cuda(opt: torch.optim.Optimizer) -> int:
    """Set ``foreach=True`` where torch would choose it on CUDA; returns the groups changed."""
    if "foreach" not in opt.defaults:  # no foreach implementation (LBFGS, custom optimizers)
        return 0
    changed = 0
    for group in opt.param_groups:
        if group.get("foreach") is not None or group.get("fused") or group.get("differentiable"):
            continue
        # the estimate's parameters are fake tensors standing for CUDA parameters
        if all(type(p) in _foreach_supported_types or type(p) is FakeTensor for p in group["params"]):
            group["foreach"] = True
            changed += 1
    return changed
