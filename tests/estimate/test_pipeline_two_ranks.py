"""A 2-rank pipeline (torch.distributed.pipelining: GPipe, 1F1B, interleaved 1F1B) estimated per
stage equals a real 2-process gloo run's live tensor bytes on each rank (``tests/census.py``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from _ranks import rank_results

HERE = Path(__file__).resolve()
STEPS = 2
IN, D, OUT, B = 24, 64, 10, 128
VOCAB, SEQ, TOKEN_ROWS = 128, 16, 8
MICROBATCHES = 4
LAYERS = 4


class Block(nn.Module):
    """An MLP block with a residual connection (its backward merges two gradients)."""

    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(D, 3 * D)
        self.down = nn.Linear(3 * D, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.gelu(self.up(x)))


class Net(nn.Module):
    """An input projection, blocks in a ``ModuleDict`` (a stage deletes the others, names kept), a head."""

    def __init__(self) -> None:
        super().__init__()
        self.inp: nn.Module | None = nn.Linear(IN, D)
        self.layers = nn.ModuleDict({str(i): Block() for i in range(LAYERS)})
        self.head: nn.Module | None = nn.Linear(D, OUT)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.inp is not None:
            x = self.inp(x)
        for layer in self.layers.values():
            x = layer(x)
        return self.head(x) if self.head is not None else x


class TokenNet(Net):
    """A language model's shape: token embeddings (int64 into the first stage), the blocks, a norm and
    the vocabulary projection (cross entropy on the last stage)."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Embedding(VOCAB, D)
        self.head = nn.Sequential(nn.LayerNorm(D), nn.Linear(D, VOCAB, bias=False))


def split(model: nn.Module, stage: int, stages: int) -> nn.Module:
    """Stage ``stage`` of ``stages``: its share of the blocks; the input layer on the first, the
    head on the last (the model is a copy of its own: trimmed in place)."""
    assert isinstance(model, Net)
    per = LAYERS // stages
    for name in list(model.layers):
        if not stage * per <= int(name) < (stage + 1) * per:
            del model.layers[name]
    if stage > 0:
        model.inp = None
    if stage < stages - 1:
        model.head = None
    return model


def loss_fn(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    # not F.mse_loss: its real kernel returns the loss in a storage of the input's size
    # (1,280 B here), its fake kernel in 4 B
    return (out - target).pow(2).mean()


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(B, IN, generator=g), torch.randn(B, OUT, generator=g)


def token_loss(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(out.flatten(0, 1), target.flatten())


def token_batch() -> tuple[torch.Tensor, torch.Tensor]:
    tokens = torch.randint(0, VOCAB, (TOKEN_ROWS, SEQ + 1), generator=torch.Generator().manual_seed(0))
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


#: schedule name -> stages per rank
SCHEDULES = {"GPipe": 1, "1F1B": 1, "Interleaved1F1B": 2}


def _stage_shapes(stage: int, stages: int, kind: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The micro-batch a stage takes and gives, as a training script states them (static shapes; an
    input that gets a gradient says so, or torch's stage sends none back)."""
    if kind == "tokens":
        mb, last = (TOKEN_ROWS // MICROBATCHES, SEQ), VOCAB
        first = torch.empty(*mb, dtype=torch.long)
    else:
        mb, last = (B // MICROBATCHES,), OUT
        first = torch.empty(*mb, IN)
    inp = first if stage == 0 else torch.empty(*mb, D, requires_grad=True)
    out = torch.empty(*mb, last if stage == stages - 1 else D, requires_grad=True)
    return inp, out


#: kind -> the model, its loss, its batch
MODELS: dict[str, tuple[Any, Any, Any]] = {
    "mlp": (Net, loss_fn, batch),
    "tokens": (TokenNet, token_loss, token_batch),
}


def _worker(out: str, schedule: str, kind: str) -> None:  # pragma: no cover - runs in the subprocesses
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining.schedules import get_schedule_class

    from census import LiveBytes

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    per_rank = SCHEDULES[schedule]
    stages = world * per_rank
    mine = [rank + k * world for k in range(per_rank)]
    make, loss, make_batch = MODELS[kind]
    torch.manual_seed(0)
    modules = [split(make(), s, stages) for s in mine]
    pipeline_stages = [
        PipelineStage(m, s, stages, torch.device("cpu"), *_stage_shapes(s, stages, kind))
        for m, s in zip(modules, mine, strict=True)
    ]
    cls = get_schedule_class(schedule)
    sched = cls(pipeline_stages if per_rank > 1 else pipeline_stages[0], MICROBATCHES, loss_fn=loss)
    params = [p for m in modules for p in m.parameters()]
    opt = torch.optim.AdamW(params, lr=1e-3)
    x, y = make_batch()
    census = LiveBytes()
    for t in [*params, x, y]:
        census.add(t)
    census.peak = census.total
    with census.mode():
        for _ in range(STEPS):
            if 0 in mine:
                sched.step(x)
            else:
                sched.step(target=y, losses=[])
            opt.step()
            opt.zero_grad()
    Path(out, f"rank{rank}.json").write_text(json.dumps({"peak": census.peak}))
    dist.barrier()
    dist.destroy_process_group()


def _real_peaks(tmp_path: Path, schedule: str, kind: str = "mlp") -> list[int]:
    done = rank_results(HERE, f"_worker({str(tmp_path)!r}, {schedule!r}, {kind!r})", tmp_path)
    return [int(rank["peak"]) for rank in done]


#: Live tensor bytes per rank of the real 2-process gloo runs (``_real_peaks``, torch 2.13); the
#: slow test below measures them again.
MEASURED = {
    ("mlp", "GPipe"): [1_321_256, 1_289_180],
    ("mlp", "1F1B"): [1_198_376, 1_057_244],
    ("mlp", "Interleaved1F1B"): [1_362_216, 1_229_276],
    ("tokens", "GPipe"): [1_411_364, 1_504_072],
    ("tokens", "1F1B"): [1_288_484, 1_225_024],
}


def _plan(schedule: str, device: str = "cpu", kind: str = "mlp", **options: Any) -> Any:
    from memprofiler.estimate import EstimatePlan, PipelinePlan

    return EstimatePlan(
        optimizer=lambda ps: torch.optim.AdamW(ps, lr=1e-3),
        world_size=2,
        device=device,
        steps=STEPS,
        pipeline=PipelinePlan(
            **{"split": split, "microbatches": MICROBATCHES, "loss_fn": MODELS[kind][1], "schedule": schedule}
            | options
        ),
    )


def _estimate(schedule: str, device: str = "cpu", kind: str = "mlp", **options: Any) -> Any:
    from memprofiler.estimate import estimate_plan

    make, _, make_batch = MODELS[kind]
    with torch.device("meta"):
        model = make()
    return estimate_plan(model, make_batch(), _plan(schedule, device, kind, **options))


@pytest.mark.parametrize(("kind", "schedule"), sorted(MEASURED))
def test_each_rank_equals_its_measured_peak(kind, schedule):
    # GIVEN a 2-rank pipeline of 4 micro-batches, estimated rank by rank on the fake process group
    est = _estimate(schedule, kind=kind)
    # THEN each rank's tensor view is the real gloo run's live tensor bytes on that rank, to the byte
    assert [s.tensor_peak_bytes for s in est.stages] == MEASURED[kind, schedule]
    # AND the headline is the rank with the highest peak
    assert est.tensor_peak_bytes == max(MEASURED[kind, schedule])
    assert est.stages[0].stages == ([0, 2] if schedule == "Interleaved1F1B" else [0])
    assert est.pipeline == f"{schedule}, {2 * SCHEDULES[schedule]} stages on 2 ranks, 4 micro-batches"


def test_the_first_rank_holds_its_stage_and_the_one_f_one_b_schedule_peaks_lower():
    gpipe, one_f_one_b = _estimate("GPipe"), _estimate("1F1B")
    # rank 0 (the headline): the input projection and blocks 0 and 1, AdamW's two moments and steps
    params = (IN * D + D + 2 * (D * 3 * D + 3 * D + 3 * D * D + D)) * 4
    assert one_f_one_b.resident == {
        "parameters": params,
        "buffers": 0,
        "gradients": params,
        "optimizer_state": 2 * params + 10 * 4,  # ten parameters, a step count each
    }
    # GPipe runs every forward before the first backward; 1F1B starts backward after two
    assert gpipe.stages[0].tensor_peak_bytes - one_f_one_b.stages[0].tensor_peak_bytes == 122_880
    assert one_f_one_b.peak_phase == "backward"


def test_on_real_cpu_tensors_the_figures_are_the_same():
    from dataclasses import replace

    from memprofiler.estimate import estimate_plan

    # GIVEN the pipeline run on real CPU tensors (fake=False: the memory is allocated)
    est = estimate_plan(Net(), batch(), replace(_plan("1F1B"), fake=False))
    # THEN fake tensors allocated what real ones do
    assert [s.tensor_peak_bytes for s in est.stages] == MEASURED["mlp", "1F1B"]


def test_the_results_plain_data_holds_every_rank():
    import yaml

    est = _estimate("Interleaved1F1B")
    data = yaml.safe_load(yaml.safe_dump(est.to_dict()))
    assert data["pipeline"] == "Interleaved1F1B, 4 stages on 2 ranks, 4 micro-batches"
    assert [(r["rank"], r["stages"], r["tensor_peak_bytes"]) for r in data["stages"]] == [
        (0, [0, 2], 1_362_216),
        (1, [1, 3], 1_229_276),
    ]
    assert any(n.startswith("pipeline (Interleaved1F1B, 4 stages on 2 ranks") for n in data["notes"])


def test_without_the_outputs_the_last_rank_keeps_none():
    kept, dropped = _estimate("GPipe"), _estimate("GPipe", return_outputs=False)
    # the stage keeps each micro-batch's output (32 x 10 float32) for its backward anyway; at the peak,
    # in the first backward, only micro-batch 0's has left that cache and is kept for the merge alone
    assert kept.stages[1].tensor_peak_bytes - dropped.stages[1].tensor_peak_bytes == 32 * OUT * 4
    assert kept.stages[0].tensor_peak_bytes == dropped.stages[0].tensor_peak_bytes


def test_gradients_merged_in_a_stages_backward_are_counted_in_place():
    from memprofiler.estimate import estimate_plan
    from memprofiler.estimate.probe import Probe

    class Merges(Probe):
        """Each rank's count of gradient merges the estimate took in place (accumulation.py)."""

        def __init__(self) -> None:
            self.trackers: list[Any] = []

        def steps_start(self, model: nn.Module, optimizer: torch.optim.Optimizer, tracker: Any) -> None:
            self.trackers.append(tracker)

    # GIVEN the residual blocks: each block's input gets two gradients (the skip and the MLP)
    probe = Merges()
    with torch.device("meta"):
        model = Net()
    est = estimate_plan(model, batch(), _plan("1F1B"), probe=probe)
    # THEN each rank's backward merged some in place, as torch does without a dispatch mode, and
    # none of those merges is at a peak: the figures stay the measured ones (the census, itself a
    # dispatch mode, sums them out of place)
    assert [t.ledger.merged_in_place > 0 for t in probe.trackers] == [True, True]
    assert [s.tensor_peak_bytes for s in est.stages] == MEASURED["mlp", "1F1B"]


def test_a_cuda_estimate_of_a_pipeline_gets_the_nccl_margin():
    from memprofiler.estimate.cuda.margins import NCCL_CHANNELS, NCCL_DEFAULT_BUFFSIZE

    est = _estimate("1F1B", device="cuda")
    assert est.margin_bytes == NCCL_DEFAULT_BUFFSIZE * 2 * NCCL_CHANNELS * 2
    assert all(s.peak_bytes >= s.tensor_peak_bytes for s in est.stages)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"schedule": "ZeroBubble"}, r"^`pipeline.schedule`: got 'ZeroBubble'; use one of GPipe, 1F1B"),
        ({"microbatches": 0}, r"^`pipeline.microbatches`: got 0; use an integer >= 1$"),
        ({"stages_per_rank": 2}, r"^`pipeline.stages_per_rank`: got 2 with 1F1B, which runs one stage"),
    ],
)
def test_a_bad_pipeline_plan_is_one_line_naming_its_field(options, message):
    from memprofiler.errors import ConfigError
    from memprofiler.estimate import PipelinePlan

    fields = {"split": split, "microbatches": MICROBATCHES, "loss_fn": loss_fn, "schedule": "1F1B", **options}
    with pytest.raises(ConfigError, match=message):
        PipelinePlan(**fields)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"strategy": "fsdp"}, r"^`pipeline`: got strategy 'fsdp'; a pipeline is modelled alone"),
        ({"world_size": 1}, r"^`world_size`: got 1; a pipeline needs its ranks: 2 or more$"),
        ({"loss_fn": lambda m, b: m(b).sum()}, r"^`loss_fn`: does not apply with a pipeline"),
    ],
)
def test_a_plan_at_odds_with_its_pipeline_is_one_line(fields, message):
    from dataclasses import asdict

    from memprofiler.errors import ConfigError
    from memprofiler.estimate import EstimatePlan

    base = _plan("1F1B")
    given = {k: getattr(base, k) for k in asdict(base)} | fields
    with pytest.raises(ConfigError, match=message):
        EstimatePlan(**given)


def test_a_batch_that_is_no_input_and_target_pair_is_one_line():
    from memprofiler.errors import ConfigError
    from memprofiler.estimate import estimate_plan

    with torch.device("meta"):
        model = Net()
    with pytest.raises(ConfigError, match=r"^`batch`: with a pipeline the batch is `\(inputs, target\)`"):
        estimate_plan(model, batch()[0], _plan("1F1B"))
    with pytest.raises(
        ConfigError, match=r"^`pipeline.microbatches`: the batch's tensor of shape \(130, 24\)"
    ):
        estimate_plan(model, (torch.randn(130, IN), torch.randn(130, OUT)), _plan("1F1B"))


def test_a_plan_torch_or_the_stages_refuse_is_one_line():
    from memprofiler.errors import ConfigError
    from memprofiler.estimate import estimate_plan

    with torch.device("meta"):
        model = Net()
    # torch's 1F1B needs a micro-batch per stage at least
    with pytest.raises(
        ConfigError, match=r"^`pipeline.microbatches`: 1F1B refuses the plan: Number of micro"
    ):
        estimate_plan(model, batch(), _plan("1F1B", microbatches=1))
    # a split that hands every stage the whole model: the second stage gets the first one's output
    whole = {"split": lambda m, s, n: m}
    with pytest.raises(
        ConfigError, match=r"^`pipeline.split`: stage 1 of 2 failed on its micro-batch input \(\(32, 10\)\): "
    ):
        estimate_plan(model, batch(), _plan("1F1B", **whole))


@pytest.mark.slow
@pytest.mark.parametrize(("kind", "schedule"), sorted(MEASURED))
def test_the_estimate_equals_a_real_two_process_gloo_pipeline(tmp_path, kind, schedule):
    # GIVEN the estimate of each rank of a 2-rank pipeline (4 micro-batches): an MLP, or a token model
    # (int64 tokens into the first stage, cross entropy on the last)
    est = _estimate(schedule, kind=kind)
    # WHEN a real 2-process gloo run of the same schedule is measured on each rank by the census
    measured = _real_peaks(tmp_path, schedule, kind)
    # THEN every rank's estimate is its measured peak, to the byte (and the committed figures hold)
    assert [s.tensor_peak_bytes for s in est.stages] == measured == MEASURED[kind, schedule]
