"""A small GPT-style LightningModule on random tokens, profiled by memprofiler.

Run it with ``make demo`` or::

    python examples/demo.py fit --config configs/demo.yaml

It trains on CPU in well under two minutes, then prints where the artifacts are and a table
of the collected snapshots.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import lightning.pytorch as pl
import torch
import yaml
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset

from memprofiler import memprofilable
from memprofiler.lightning.cli import MemProfilerCLI


class RandomTokens(Dataset[torch.Tensor]):
    """Deterministic random token sequences (offline: no dataset download)."""

    def __init__(self, n: int, seq_len: int, vocab_size: int, seed: int = 0) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.data = torch.randint(0, vocab_size, (n, seq_len + 1), generator=gen)

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.data[i]


class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention and an MLP."""

    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        shape = (b, t, self.n_heads, d // self.n_heads)
        q, k, v = (z.view(shape).transpose(1, 2) for z in (q, k, v))
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab_size: int, seq_len: int, d_model: int, n_layers: int, n_heads: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab_size, d_model)
        self.pos = nn.Embedding(seq_len, d_model)
        self.blocks = nn.ModuleList(Block(d_model, n_heads) for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.tok(idx) + self.pos(pos)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


class DemoGPT(pl.LightningModule):
    """GPT-style language model whose steps memprofiler may collect.

    Args:
        vocab_size: token vocabulary size.
        seq_len: tokens per sample.
        d_model: embedding width.
        n_layers: transformer blocks.
        n_heads: attention heads per block.
        batch_size: samples per batch.
        num_samples: training samples per epoch (validation uses a quarter).
        lr: AdamW learning rate.
    """

    def __init__(
        self,
        vocab_size: int = 256,
        seq_len: int = 64,
        d_model: int = 128,
        n_layers: int = 4,
        n_heads: int = 4,
        batch_size: int = 16,
        num_samples: int = 256,
        lr: float = 3e-4,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.model = GPT(vocab_size, seq_len, d_model, n_layers, n_heads)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.model(idx)

    def configure_model(self) -> None:
        """Shard with FSDP2 when a device mesh is set (``ModelParallelStrategy``): each block, then the root."""
        if self.device_mesh is None:
            return
        from torch.distributed.fsdp import FSDPModule, fully_shard

        if isinstance(self.model, FSDPModule):  # configure_model runs again for validate/test
            return
        mesh = self.device_mesh["data_parallel"]
        for block in self.model.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(self.model, mesh=mesh)

    def _loss(self, batch: torch.Tensor) -> torch.Tensor:
        logits = self(batch[:, :-1])
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))

    @memprofilable
    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        loss = self._loss(batch)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    @memprofilable
    def validation_step(self, batch: torch.Tensor, batch_idx: int) -> None:
        self.log("val_loss", self._loss(batch), prog_bar=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)

    def _loader(self, n: int, seed: int) -> DataLoader[torch.Tensor]:
        hp = self.hparams
        return DataLoader(RandomTokens(n, hp.seq_len, hp.vocab_size, seed), batch_size=hp.batch_size)

    def train_dataloader(self) -> DataLoader[torch.Tensor]:
        return self._loader(self.hparams.num_samples, seed=0)

    def val_dataloader(self) -> DataLoader[torch.Tensor]:
        return self._loader(max(self.hparams.num_samples // 4, self.hparams.batch_size), seed=1)


def _mib(n: object) -> str:
    return f"{n / 2**20:,.1f}" if isinstance(n, (int, float)) else "-"


def print_summary(save_dir: Path) -> None:
    """Print where the artifacts are and one row per snapshot."""
    from rich.console import Console
    from rich.table import Table

    console = Console(width=120)
    files = sorted(p for p in save_dir.rglob("*") if p.is_file())
    console.print(f"\n[bold]memprofiler artifacts[/bold] in {save_dir}:")
    for p in files:
        console.print(f"  {p.relative_to(save_dir)}  ({p.stat().st_size:,} bytes)")
    for stats in sorted(save_dir.glob("rank_*_memory_stats.yaml")):
        snapshots = yaml.safe_load(stats.read_text()) or {}
        table = Table(title=stats.name)
        for col in ("key", "rss MiB", "rss_peak MiB", "saved unique MiB", "saved packed MiB"):
            table.add_column(col, justify="left" if col == "key" else "right", no_wrap=True)
        for key, m in snapshots.items():
            table.add_row(
                key,
                _mib(m.get("rss")),
                _mib(m.get("rss_peak")),
                _mib(m.get("saved_tensors.unique_bytes")),
                _mib(m.get("saved_tensors.packed_bytes")),
            )
        console.print(table)
    console.print(
        f"\nNext: [bold]{memprofiler_command()} report {save_dir} -o report.html[/bold] "
        "(terminal summary and an offline HTML report)"
    )


def memprofiler_command() -> str:
    """How to run the ``memprofiler`` command from here: ``make demo`` does not put .venv/bin on PATH."""
    script = Path(sys.executable).parent / "memprofiler"
    if not script.exists():
        return f"{sys.executable} -m memprofiler"
    on_path = shutil.which("memprofiler")
    if on_path is not None and Path(on_path).resolve() == script.resolve():
        return "memprofiler"
    try:
        return str(script.relative_to(Path.cwd()))
    except ValueError:
        return str(script)


def main() -> None:
    cli = MemProfilerCLI(DemoGPT, run=True, save_config_kwargs={"overwrite": True})
    trainer = cli.trainer
    if trainer is None:  # `estimate` builds no Trainer; it printed its table
        return
    save_dirs = {Path(cb.profiler.save_dir) for cb in trainer.callbacks if getattr(cb, "profiler", None)}
    if trainer.is_global_zero:
        for save_dir in sorted(save_dirs):
            print_summary(save_dir)
    # Multi-process runs (make demo-fsdp): end the process group before interpreter exit, so
    # its threads are not left to static destructors.
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    torch.manual_seed(0)
    main()
