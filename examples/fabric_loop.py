"""memprofiler in a Lightning Fabric loop (no LightningModule, no callback).

python examples/fabric_loop.py [SAVE_DIR]
"""

from __future__ import annotations

import sys

import torch
from lightning.fabric import Fabric
from torch import nn

from memprofiler import MemProfiler


def main(save_dir: str = "runs/fabric/memprofiler", steps: int = 6) -> MemProfiler:
    fabric = Fabric(accelerator="cpu", devices=1)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 8))
    opt = torch.optim.AdamW(model.parameters())
    model, opt = fabric.setup(model, opt)
    cfg = {"schedule": {"warmup": 1, "active": 2}, "collect_funcs": {"default": ["train_step"]}}
    with MemProfiler(cfg, save_dir=save_dir, rank=fabric.global_rank) as prof:
        for _ in range(steps):
            x = torch.randn(32, 64)
            with prof.profile("train_step", module=model):
                loss = model(x).pow(2).mean()
            fabric.backward(loss)
            opt.step()
            opt.zero_grad()
    return prof


if __name__ == "__main__":
    main(*sys.argv[1:2])
