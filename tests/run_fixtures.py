"""Run directories written by real CPU training runs with ``MemProfilerCallback`` (session fixtures)."""

from __future__ import annotations

import pickle
import shutil
from pathlib import Path

import pytest
import yaml

from snapshot_fixtures import known_snapshot

BATCH = 8
IN_FEATURES = 64


def _fit(root: Path, hidden: int) -> Path:
    """Train a tiny MLP 4 steps on CPU, collecting calls 2 and 3; return its ``save_dir``.

    The run is that of a machine without a GPU on every machine: the callback's CUDA seam has
    no device, so a GPU node (where another test of the process may have initialised CUDA)
    writes no CUDA columns into the figures the report tests read.
    """
    import lightning.pytorch as pl
    import torch
    from torch import nn

    from fake_cuda import no_gpu
    from memprofiler import MemProfilerCallback, memprofilable

    class Tiny(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.enc = nn.Sequential(
                nn.Linear(IN_FEATURES, hidden), nn.ReLU(), nn.Linear(hidden, IN_FEATURES)
            )
            self.head = nn.Linear(IN_FEATURES, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.enc(x))

        @memprofilable
        def training_step(self, batch: list[torch.Tensor], idx: int) -> torch.Tensor:
            return self(batch[0]).square().mean()

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

        def train_dataloader(self) -> torch.utils.data.DataLoader:
            data = torch.utils.data.TensorDataset(torch.randn(4 * BATCH, IN_FEATURES))
            return torch.utils.data.DataLoader(data, batch_size=BATCH)

    trainer = pl.Trainer(
        default_root_dir=root,
        max_steps=4,
        accelerator="cpu",
        devices=1,
        logger=pl.loggers.CSVLogger(root),
        callbacks=[MemProfilerCallback({"schedule": {"warmup": 1, "active": 2}}, cuda=no_gpu())],
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
    )
    trainer.fit(Tiny())
    return root / "lightning_logs" / "version_0" / "memprofiler"


def expected_saved_bytes(hidden: int) -> int:
    """Unique bytes autograd saves in the Tiny step (float32): Linear inputs and ReLU output.

    enc.0 saves x (B x 64), ReLU saves its output (B x hidden), which enc.2 saves again (same
    storage, counted once), head saves enc's output (B x 64), square saves head's output (B x 8).
    """
    return 4 * BATCH * (IN_FEATURES + hidden + IN_FEATURES + 8)


@pytest.fixture(scope="session")
def real_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two real runs that differ only in the hidden width: ``a`` (256) and ``b`` (512)."""
    base = tmp_path_factory.mktemp("runs")
    return {"a": _fit(base / "a", 256), "b": _fit(base / "b", 512)}


@pytest.fixture(scope="session")
def full_run(real_runs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Run ``a`` plus every other artifact kind the report reads.

    The per-rank stats are the real run's. A second rank, the cross-rank summary and the
    FSDP report are added in the layout issue 4 specifies (no multi-process run here), and
    the allocator-history and OOM pickles are the hand-built snapshot with known answers
    (no GPU here).
    """
    root = tmp_path_factory.mktemp("full") / "lightning_logs" / "version_0" / "memprofiler"
    shutil.copytree(real_runs["a"], root)
    rank0 = yaml.safe_load((root / "rank_0_memory_stats.yaml").read_text())
    for key, m in rank0.items():
        if key.endswith(".end"):  # the FSDP tracker merges its per-category peaks like this
            m.update({"fsdp.peak.sharded_param": 4096, "fsdp.peak.activation": 65536})
    (root / "rank_0_memory_stats.yaml").write_text(yaml.safe_dump(rank0, sort_keys=False))
    rank1 = {}
    for key, m in rank0.items():
        m1 = dict(m)
        for k in ("rss", "rss_peak"):
            if k in m1:
                m1[k] = m1[k] + 64 * 1024**2  # rank 1 peaks 64 MiB higher
        rank1["1" + key[1:]] = m1
    (root / "rank_1_memory_stats.yaml").write_text(yaml.safe_dump(rank1, sort_keys=False))
    from memprofiler.core.summary import write_summary

    write_summary(root, {0: rank0, 1: rank1}, world_size=2)  # what rank 0 writes after a gather
    fsdp = {
        "peak": {"Parameter": 4096, "Gradient": 4096, "Activation": 65536, "Optstate": 0},
        "modules": {
            "Tiny": {"Parameter": 4096, "Gradient": 4096, "Activation": 65536},
            "Tiny.enc": {"Parameter": 3072, "Gradient": 3072, "Activation": 49152},
        },
    }
    (root / "fsdp_mem_rank_0_training_step_2.yaml").write_text(yaml.safe_dump(fsdp, sort_keys=False))
    (root / "fsdp_mem_rank_0_training_step_2.log").write_text("Peak Memory Snapshot\nActivation: 64.00 KiB\n")
    snap = pickle.dumps(known_snapshot(), protocol=4)
    (root / "cuda_alloc_rank_0.training_step.2.end.pickle").write_bytes(snap)
    (root / "oom_rank_0_0.pickle").write_bytes(snap)
    oom_info = {"step": 3, "alloc_size": 8 * 1024**3, "device_free": 1000, "device_total": 80 * 1024**3}
    (root / "oom_rank_0_0.yaml").write_text(yaml.safe_dump(oom_info))
    return root.parents[2]  # the top of the tree: the report must search down to save_dir


#: The start of a real ``fsdp_mem_rank_0_training_step_2.yaml`` (2-rank CPU FSDP2 run of a small
#: GPT, ``runs/fsdp_cpu``): the scalars, ``peak``, ``final`` and the first module's first two
#: phases, verbatim.
REAL_FSDP_REPORT_YAML = """\
tracker: FSDPMemTracker
rank: 0
fn: training_step
call: 2
window: from the start of `training_step` to the end of its step (backward and optimizer
  step included, when they run before the step ends)
units: B
module_depth: 4
notes: []
peak:
  cpu:
    Sharded Param: 1734144
    Unsharded Param: 1089024
    Buffer: 0
    Sharded Grad: 1734144
    Unsharded Grad: 0
    Activation: 17371712
    Temp: 0
    All Gather: 793088
    Reduce Scatter: 0
    OptState: 3468500
    Inputs: 0
    Total: 26190612
final:
  cpu:
    Sharded Param: 1734144
    Unsharded Param: 0
    Buffer: 0
    Sharded Grad: 1734144
    Unsharded Grad: 0
    Activation: 4168
    Temp: 0
    All Gather: 0
    Reduce Scatter: 0
    OptState: 3468500
    Inputs: 0
    Total: 6940956
modules:
  DemoGPT.model:
    Peak Forward:
    - cpu:
        Sharded Param: 1734144
        Unsharded Param: 1089024
        Buffer: 0
        Sharded Grad: 1734144
        Unsharded Grad: 0
        Activation: 17371712
        Temp: 0
        All Gather: 793088
        Reduce Scatter: 0
        OptState: 3468500
        Inputs: 0
        Total: 26190612
    Before Pre-Forward:
    - cpu:
        Sharded Param: 1734144
        Unsharded Param: 0
        Buffer: 0
        Sharded Grad: 1734144
        Unsharded Grad: 0
        Activation: 4160
        Temp: 0
        All Gather: 0
        Reduce Scatter: 0
        OptState: 3468500
        Inputs: 0
        Total: 6940948
"""
