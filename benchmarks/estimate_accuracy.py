"""The estimate against real CPU training steps, on real architectures; prints JSON.

For every (architecture, optimizer) pair, a fresh child process:

1. estimates two training steps with ``estimate_memory(device="cpu")`` on a model built on
   the meta device;
2. runs the same two steps for real on CPU (the same loss, ``zero_grad`` after each step)
   under ``LiveBytes`` (``tests/census.py``), a ``TorchDispatchMode`` that knows nothing of the
   estimate's tracker: it counts every storage an op returns once, from the op until the
   storage is freed (a weakref callback), plus the parameters, buffers and batch alive
   before the steps. Its peak is the measured peak of live tensor bytes.
3. samples the process's resident set (``/proc/self/statm``) after every op, so the RSS
   column includes what no op returns (kernel-internal scratch, allocator slack) but not
   what is freed inside a single op.

``ratio`` is estimate / measured tensor peak; ``rss_ratio`` compares the growth over the
steps: (estimate peak - bytes alive at the start) / (RSS peak - RSS at the start).
Models are built from transformers config objects (no download). The first pair runs twice
(an A/A pair: the figures are deterministic, the RSS pair shows its noise).

Run (a 2-CPU VM, no GPU):
``PYTHONPATH=src:tests python benchmarks/estimate_accuracy.py --out benchmarks/results``
``python benchmarks/estimate_accuracy.py --markdown benchmarks/results/estimate_accuracy_cpu_20261126.json``
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _emit import emit, read_result

ROOT = Path(__file__).resolve().parents[1]
PAGE = os.sysconf("SC_PAGE_SIZE")
V, SEQ, BATCH = 2048, 64, 4
#: One arena, and every block over 64 KiB its own mapping, returned to the system when freed:
#: so the RSS follows the live bytes instead of glibc's retained heap.
MALLOC = {"MALLOC_ARENA_MAX": "1", "MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "65536"}


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


# ---------------------------------------------------------------- the architectures


def _xent(model: Any, batch: Any) -> Any:
    import torch.nn.functional as F

    x, y = batch
    return F.cross_entropy(model(x), y)


def _hf_lm(model: Any, batch: Any) -> Any:
    return model(input_ids=batch, labels=batch).loss


def _vit_loss(model: Any, batch: Any) -> Any:
    x, y = batch
    return model(pixel_values=x, labels=y).loss


def _mlp() -> Any:
    from torch import nn

    return nn.Sequential(
        nn.Linear(512, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, 10)
    )


def _resnet() -> Any:
    from torch import nn

    class Res(nn.Module):
        def __init__(self, c: int) -> None:
            super().__init__()
            self.body = nn.Sequential(
                nn.Conv2d(c, c, 3, padding=1, bias=False),
                nn.BatchNorm2d(c),
                nn.ReLU(),
                nn.Conv2d(c, c, 3, padding=1, bias=False),
                nn.BatchNorm2d(c),
            )

        def forward(self, x: Any) -> Any:
            return (x + self.body(x)).relu()

    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1, bias=False),
        nn.BatchNorm2d(32),
        nn.ReLU(),
        Res(32),
        nn.Conv2d(32, 64, 3, stride=2, padding=1, bias=False),
        Res(64),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(64, 10),
    )


def _gpt2() -> Any:
    import transformers as tf

    return tf.GPT2LMHeadModel(tf.GPT2Config(vocab_size=V, n_positions=SEQ, n_embd=128, n_layer=2, n_head=4))


def _bert() -> Any:
    import transformers as tf

    cfg = tf.BertConfig(
        vocab_size=V,
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=256,
        max_position_embeddings=SEQ,
    )
    return tf.BertForMaskedLM(cfg)


def _t5() -> Any:
    import transformers as tf

    cfg = tf.T5Config(
        vocab_size=V,
        d_model=128,
        d_kv=32,
        d_ff=256,
        num_layers=2,
        num_heads=4,
        decoder_start_token_id=0,
        pad_token_id=0,
    )
    return tf.T5ForConditionalGeneration(cfg)


def _llama(checkpointing: bool = False) -> Any:
    import transformers as tf

    cfg = tf.LlamaConfig(
        vocab_size=V,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=SEQ,
        attn_implementation="sdpa",
    )
    model = tf.LlamaForCausalLM(cfg)
    if checkpointing:
        model.gradient_checkpointing_enable()
    return model


def _vit() -> Any:
    import transformers as tf

    cfg = tf.ViTConfig(
        image_size=32,
        patch_size=4,
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=256,
        num_labels=10,
    )
    return tf.ViTForImageClassification(cfg)


def _ids() -> Any:
    import torch

    return torch.randint(0, V, (BATCH, SEQ), generator=torch.Generator().manual_seed(0))


def _images(c: int, side: int, n: int) -> Any:
    import torch

    g = torch.Generator().manual_seed(0)
    return torch.randn(n, c, side, side, generator=g), torch.randint(0, 10, (n,), generator=g)


ARCHS: dict[str, tuple[Callable[[], Any], Callable[[], Any], Callable[[Any, Any], Any], bool]] = {
    # name: (build, batch, loss, tied weights)
    "mlp": (
        _mlp,
        lambda: (__import__("torch").randn(64, 512), __import__("torch").randint(0, 10, (64,))),
        _xent,
        False,
    ),
    "resnet": (_resnet, lambda: _images(3, 32, 8), _xent, False),
    "gpt2": (_gpt2, _ids, _hf_lm, True),
    "bert_mlm": (_bert, _ids, _hf_lm, True),
    "t5": (_t5, _ids, _hf_lm, True),
    "llama": (_llama, _ids, _hf_lm, False),
    "llama_checkpointed": (lambda: _llama(True), _ids, _hf_lm, False),
    "vit": (_vit, lambda: _images(3, 32, 8), _vit_loss, False),
}
OPTIMIZERS = {
    "sgd": lambda ps: __import__("torch").optim.SGD(ps, lr=0.01, momentum=0.9),
    "adamw": lambda ps: __import__("torch").optim.AdamW(ps, lr=1e-4),
}


def one(arch: str, opt_name: str) -> dict[str, Any]:
    """In the child: the estimate, then the real steps under the census."""
    import gc

    import torch
    from torch.utils._pytree import tree_leaves

    from memprofiler.estimate import estimate_memory

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from census import LiveBytes

    torch.set_num_threads(1)
    build, make_batch, loss_fn, tied = ARCHS[arch]
    make_opt = OPTIMIZERS[opt_name]
    batch = make_batch()
    with torch.device("meta"):
        meta = build()
    est = estimate_memory(meta, batch, optimizer=make_opt, loss_fn=loss_fn, device="cpu", steps=2)
    del meta
    # Warm-up on a throw-away copy: lazy imports, thread pools and kernel caches fill the RSS
    # once, before the measured steps (large blocks are mmap-ed, so what it frees goes back).
    warm = build()
    warm_opt = make_opt(warm.parameters())
    loss_fn(warm, batch).backward()
    warm_opt.step()
    del warm, warm_opt
    torch.manual_seed(0)
    model = build()
    opt = make_opt(model.parameters())
    gc.collect()
    census = LiveBytes()
    for t in [*model.parameters(), *model.buffers(), *tree_leaves(batch)]:
        if isinstance(t, torch.Tensor):
            census.add(t)
    start_bytes, start_rss = census.total, rss()
    census.peak = census.total
    rss_peak = [start_rss]
    with census.mode(after_op=lambda: rss_peak.append(max(rss_peak.pop(), rss()))):
        for _ in range(2):  # a training loop's order: the loss is alive until the step ends
            loss = loss_fn(model, batch)
            loss.backward()
            opt.step()
            opt.zero_grad()
            del loss
    est_growth = est.tensor_peak_bytes - start_bytes
    rss_growth = rss_peak[0] - start_rss
    return {
        "arch": arch,
        "optimizer": opt_name,
        "tied_weights": tied,
        "params": sum(p.numel() for p in model.parameters()),
        "estimated_peak_bytes": est.tensor_peak_bytes,
        "measured_peak_bytes": census.peak,
        "ratio": round(est.tensor_peak_bytes / census.peak, 4),
        "start_bytes": start_bytes,
        "estimated_growth_bytes": est_growth,
        "rss_growth_bytes": rss_growth,
        "rss_ratio": round(est_growth / rss_growth, 4) if rss_growth > 0 else None,
        "peak_phase": est.peak_phase,
        "peak_module": est.peak_module,
        "notes": est.notes,
    }


def markdown(result: dict[str, Any]) -> str:
    """The table of docs/guides/estimate-accuracy.md."""
    mib = 1 << 20
    lines = [
        "| architecture | optimizer | tied | estimate (MiB) | measured (MiB) | ratio | RSS growth ratio |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: |",
    ]
    seen: set[tuple[str, str]] = set()
    for r in result["runs"]:
        key = (r["arch"], r["optimizer"])
        arch = f"{r['arch']} (A/A repeat)" if key in seen else r["arch"]
        seen.add(key)
        lines.append(
            f"| {arch} | {r['optimizer']} | {'yes' if r['tied_weights'] else 'no'} | "
            f"{r['estimated_peak_bytes'] / mib:.2f} | {r['measured_peak_bytes'] / mib:.2f} | "
            f"{r['ratio']:.4f} | {r['rss_ratio']:.4f} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--one", nargs=2, metavar=("ARCH", "OPT"))
    ap.add_argument("--out", type=Path)
    ap.add_argument("--markdown", type=Path, help="print the markdown table of a result file")
    ap.add_argument("--archs", default=",".join(ARCHS))
    ap.add_argument(
        "--src", type=Path, default=ROOT / "src", help="memprofiler to estimate with (before/after)"
    )
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(*args.one)))
        return
    if args.markdown:
        print(markdown(read_result(args.markdown)))
        return
    pairs = [(a, o) for a in args.archs.split(",") for o in OPTIMIZERS]
    pairs.append((pairs[0][0], pairs[0][1]))  # A/A
    random.Random(0).shuffle(pairs)
    env = {**os.environ, **MALLOC, "PYTHONPATH": f"{args.src}{os.pathsep}{ROOT / 'tests'}"}
    runs = []
    for arch, opt in pairs:
        proc = subprocess.run(
            [sys.executable, __file__, "--one", arch, opt], env=env, capture_output=True, text=True
        )
        if proc.returncode != 0:
            runs.append({"arch": arch, "optimizer": opt, "error": proc.stderr.strip().splitlines()[-1:]})
            continue
        runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    runs.sort(key=lambda r: (list(ARCHS).index(r["arch"]), r["optimizer"]))
    emit(
        {
            "machine_note": "2-CPU VM shared with other jobs, no GPU; torch threads 1, MALLOC_ARENA_MAX=1",
            "steps": 2,
            "estimated_with": str(args.src),
            "runs": runs,
        },
        args.out,
    )


if __name__ == "__main__":
    main()
