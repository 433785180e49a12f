"""Frozen parameters and tied weights: resident bytes equal their analytic values per strategy."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from torch.distributed._tools.mem_tracker import MemTracker

from memprofiler.estimate import estimate_memory

ADAMW = lambda ps: torch.optim.AdamW(ps, lr=1e-3)  # noqa: E731
F32 = 4


def shard_bytes(shapes: list[tuple[int, ...]], ws: int) -> tuple[int, int]:
    """(padded shard bytes, rank 0's unpadded local bytes), as FSDP2 splits dim 0."""
    padded = local = 0
    for shape in shapes:
        rows = math.ceil(shape[0] / ws)
        per_row = math.prod(shape[1:]) * F32
        padded += rows * per_row
        local += min(rows, shape[0]) * per_row
    return padded, local


class Backbone(nn.Module):
    """A frozen first layer (the fine-tuning set-up) and a trainable head, sharded apart."""

    FROZEN = [(33, 10), (33,)]
    TRAINABLE = [(7, 33), (7,)]

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(10, 33), nn.Linear(33, 7)])
        self.layers[0].requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers[1](torch.relu(self.layers[0](x)))


class TiedLM(nn.Module):
    """An embedding whose weight is also the output projection (GPT-2 style)."""

    UNIQUE = [(50, 12), (12, 12), (12,)]

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(50, 12)
        self.blocks = nn.ModuleList([nn.Linear(12, 12)])
        self.head = nn.Linear(12, 50, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.blocks[0](self.emb(ids))))


def nbytes(shapes: list[tuple[int, ...]]) -> int:
    return F32 * sum(math.prod(s) for s in shapes)


def on_meta(cls: type[nn.Module]) -> nn.Module:
    with torch.device("meta"):
        return cls()


IDS = torch.randint(0, 50, (3, 5), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("strategy,ws", [("single", 1), ("ddp", 2), ("ddp", 8)])
def test_frozen_parameters_have_no_gradient_and_no_optimizer_state(strategy, ws):
    # GIVEN a model whose first layer is frozen
    est = estimate_memory(
        on_meta(Backbone), torch.randn(4, 10), optimizer=ADAMW, strategy=strategy, world_size=ws
    )
    trainable = nbytes(Backbone.TRAINABLE)
    # THEN every parameter is held, gradients and AdamW's two moments only for the trainable
    # ones (plus one float32 step per trainable parameter)
    assert est.resident == {
        "parameters": nbytes(Backbone.FROZEN) + trainable,
        "buffers": 0,
        "gradients": trainable,
        "optimizer_state": 2 * trainable,  # step counts: on the host for a CUDA target
    }
    if strategy == "ddp":  # DDP buckets only what has a gradient
        assert est.by_category["ddp_buckets"] == trainable


@pytest.mark.parametrize("ws", [2, 8])
def test_frozen_parameters_under_fsdp_are_sharded_without_gradients(ws):
    est = estimate_memory(
        on_meta(Backbone), torch.randn(4, 10), optimizer=ADAMW, strategy="fsdp", world_size=ws
    )
    padded_all, _ = shard_bytes(Backbone.FROZEN + Backbone.TRAINABLE, ws)
    padded_trainable, local_trainable = shard_bytes(Backbone.TRAINABLE, ws)
    assert est.resident == {
        "parameters": padded_all,
        "buffers": 0,
        "gradients": padded_trainable,
        "optimizer_state": 2 * local_trainable,
    }


@pytest.mark.parametrize("strategy,ws", [("single", 1), ("ddp", 2)])
def test_a_tied_weight_is_counted_once(strategy, ws):
    est = estimate_memory(on_meta(TiedLM), IDS, optimizer=ADAMW, strategy=strategy, world_size=ws)
    total = nbytes(TiedLM.UNIQUE)
    # THEN the shared weight is one parameter: one gradient, one pair of moments, three steps
    assert est.resident == {
        "parameters": total,
        "buffers": 0,
        "gradients": total,
        "optimizer_state": 2 * total,
    }
    if strategy == "ddp":  # one gradient bucket slot for the shared weight, not two
        assert est.by_category["ddp_buckets"] == total


@pytest.mark.parametrize("ws", [2, 4])
def test_a_tied_weight_is_sharded_once_under_fsdp(ws):
    est = estimate_memory(on_meta(TiedLM), IDS, optimizer=ADAMW, strategy="fsdp", world_size=ws)
    padded, local = shard_bytes(TiedLM.UNIQUE, ws)
    assert est.resident == {
        "parameters": padded,
        "buffers": 0,
        "gradients": padded,
        "optimizer_state": 2 * local,
    }


def test_the_tied_peak_equals_torch_trackers_peak_of_real_steps():
    # GIVEN two real CPU steps of the tied model under torch's MemTracker
    torch.manual_seed(0)
    model, batch = TiedLM(), IDS
    opt = ADAMW(model.parameters())
    tracker = MemTracker()
    tracker.track_external(model, opt, batch)
    with tracker:
        for _ in range(2):
            tracker.reset_mod_stats()
            model(batch).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
    measured = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]
    # WHEN estimated on fake tensors THEN the tensor peak is the same to the byte
    est = estimate_memory(
        on_meta(TiedLM), batch, optimizer=ADAMW, loss_fn=lambda m, b: m(b).pow(2).mean(), device="cpu"
    )
    assert est.tensor_peak_bytes == measured


def _hf(name: str) -> tuple[nn.Module, torch.Tensor]:
    import transformers as tf

    cfgs = {
        "gpt2": lambda: tf.GPT2LMHeadModel(
            tf.GPT2Config(vocab_size=96, n_positions=32, n_embd=32, n_layer=2, n_head=2)
        ),
        "bert_mlm": lambda: tf.BertForMaskedLM(
            tf.BertConfig(
                vocab_size=96,
                hidden_size=32,
                num_hidden_layers=2,
                num_attention_heads=2,
                intermediate_size=64,
                max_position_embeddings=32,
            )
        ),
        "t5": lambda: tf.T5ForConditionalGeneration(
            tf.T5Config(
                vocab_size=96,
                d_model=32,
                d_kv=16,
                d_ff=64,
                num_layers=2,
                num_heads=2,
                decoder_start_token_id=0,
                pad_token_id=0,
            )
        ),
    }
    with torch.device("meta"):
        model = cfgs[name]()
    return model, torch.randint(0, 96, (2, 8), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("name", ["gpt2", "bert_mlm", "t5"])
def test_transformers_tied_embeddings_are_counted_once(name):
    # GIVEN a transformers model that ties its input embedding to its output projection
    model, ids = _hf(name)
    unique = F32 * sum(p.numel() for p in model.parameters())  # parameters() lists a tie once
    places = sum(p.numel() for _, p in model.named_parameters(remove_duplicate=False))
    assert F32 * places > unique  # the model really has ties
    est = estimate_memory(
        model, ids, optimizer=ADAMW, loss_fn=lambda m, b: m(input_ids=b, labels=b).loss, device="cpu", steps=1
    )
    # THEN parameters, gradients and AdamW's moments count each shared weight once
    n = len(list(model.parameters()))
    assert est.resident["parameters"] == unique
    assert est.resident["gradients"] == unique
    assert est.resident["optimizer_state"] == 2 * unique + n * F32


@pytest.mark.parametrize("strategy,ws", [("ddp", 2), ("fsdp", 2)])
def test_gpt2_tied_embedding_under_data_parallel_strategies(strategy, ws):
    # GIVEN GPT-2, whose `lm_head` shares `wte`'s weight
    model, ids = _hf("gpt2")
    shapes = [tuple(p.shape) for p in model.parameters()]  # each shared weight once
    est = estimate_memory(
        model,
        ids,
        optimizer=ADAMW,
        loss_fn=lambda m, b: m(input_ids=b, labels=b).loss,
        strategy=strategy,
        world_size=ws,
        device="cpu",
        steps=1,
    )
    if strategy == "ddp":
        # THEN DDP holds the full model once and buckets each gradient once
        unique = nbytes(shapes)
        assert est.resident["parameters"] == est.resident["gradients"] == unique
        assert est.by_category["ddp_buckets"] == unique
        assert est.resident["optimizer_state"] == 2 * unique + len(shapes) * F32
    else:
        # THEN FSDP2 shards each weight once
        padded, local = shard_bytes(shapes, ws)
        assert est.resident["parameters"] == est.resident["gradients"] == padded
        assert est.resident["optimizer_state"] == 2 * local + len(shapes) * F32
