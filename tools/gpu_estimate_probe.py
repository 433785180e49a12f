"""What the FSDP estimate depends on in this process: run it on a GPU node and on a laptop.

Prints torch's version and accelerator, the optimizer path Adam takes on the estimate's
sharded parameters, FSDP's device handle, how many times DTensor inferred an output shape on
fake tensors of its own during the tracked steps (cache misses; torch 2.11 missed at each new
step), and the estimate's figures: the first in this process, then the same again. Both must
be equal (issue 34: the first FSDP estimate on the GPU node peaked in the optimizer).

    PYTHONPATH=src python tools/gpu_estimate_probe.py
"""

from __future__ import annotations

import json
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor._sharding_prop import ShardingPropagator

from memprofiler.estimate import EstimatePlan, estimate_plan
from memprofiler.estimate.probe import Probe


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(10, 33), nn.Linear(33, 7)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers[1](torch.relu(self.layers[0](x)))


def main() -> None:
    seen: dict[str, Any] = {"inferred_in_steps": 0, "in_steps": False}
    infer = ShardingPropagator._propagate_tensor_meta_non_cached

    def counting(self: Any, schema: Any) -> Any:
        if seen["in_steps"]:
            seen["inferred_in_steps"] += 1
        return infer(self, schema)

    ShardingPropagator._propagate_tensor_meta_non_cached = counting  # type: ignore[method-assign,assignment]

    class Watch(Probe):
        def steps_start(self, model: nn.Module, optimizer: torch.optim.Optimizer, tracker: Any) -> None:
            from torch.distributed.fsdp import FSDPModule
            from torch.optim.optimizer import _default_to_fused_or_foreach

            params: list[torch.Tensor] = list(model.parameters())
            seen["fused_foreach"] = _default_to_fused_or_foreach(params, False)
            seen["param_device"] = str(params[0].device)
            state = model._get_fsdp_state() if isinstance(model, FSDPModule) else None
            seen["fsdp_device"] = str(getattr(state, "_device", None))
            seen["in_steps"] = True

    def once() -> dict[str, Any]:
        with torch.device("meta"):
            net = Net()
        plan = EstimatePlan(
            optimizer=lambda ps: torch.optim.Adam(ps, lr=1e-3),
            strategy="fsdp",
            world_size=1,
            device="cuda",
            steps=2,
        )
        est = estimate_plan(net, torch.randn(4, 10), plan, probe=Watch())
        d = est.to_dict()
        return {
            k: d[k] for k in ("peak_bytes", "tensor_peak_bytes", "peak_phase", "peak_module", "by_category")
        }

    first = once()
    seen["in_steps"] = False
    inferred_first, seen["inferred_in_steps"] = seen["inferred_in_steps"], 0
    second = once()
    print(
        json.dumps(
            {
                "torch": torch.__version__,
                "cuda_available": torch.cuda.is_available(),
                "device_count": torch.cuda.device_count(),
                "accelerator": str(torch._C._get_accelerator()),
                "adam_fused_foreach": seen.get("fused_foreach"),
                "param_device": seen.get("param_device"),
                "fsdp_device": seen.get("fsdp_device"),
                "inferred_in_tracked_steps": [inferred_first, seen["inferred_in_steps"]],
                "first": first,
                "second": second,
                "equal": first == second,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
