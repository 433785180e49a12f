"""``memprofiler estimate MODEL``: a Hugging Face config or module:factory in one command; the
device's memory from ``--gpu``; the largest batch in few estimates, from the command and Python.

The tiny LLaMA below has 115,008 parameters: embeddings and the untied head 256 x 64 each,
per layer q, k, v, o (4 x 64 x 64) + gate, up, down (3 x 64 x 128) + two norms (2 x 64), and
the final norm (64): 2 x 16,384 + 2 x 41,088 + 64.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml
from torch import nn

from _hf_config import config_dir
from memprofiler.__main__ import main
from memprofiler.estimate import largest_batch, workers
from memprofiler.estimate.batch_search import search, search_many
from memprofiler.estimate.cuda.devices import CUDA_CONTEXT, device_memory
from memprofiler.estimate.result import MemoryEstimate

PARAMS = 2 * 256 * 64 + 2 * (4 * 64 * 64 + 3 * 64 * 128 + 2 * 64) + 64
CONFIG = {
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "vocab_size": 256,
    "max_position_embeddings": 512,
}


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    return config_dir(tmp_path, "tiny", CONFIG)


def _estimates(out: Path) -> list[dict]:
    return yaml.safe_load((out / "memory_estimate.yaml").read_text())["estimates"]


def test_a_config_directory_in_one_command_fsdp_adamw(tiny, tmp_path, capsys):
    # WHEN a Hugging Face config directory is estimated for 2 ranks of FSDP2, AdamW, bf16-mixed
    out = tmp_path / "out"
    rc = main(
        [
            "estimate",
            str(tiny),
            "--world-size",
            "2",
            "--seq-len",
            "64",
            "--batch-size",
            "1",
            "--save-dir",
            str(out),
        ]
    )
    printed = capsys.readouterr().out
    assert rc == 0
    [est] = _estimates(out)
    # THEN each rank holds half the float32 parameters, and AdamW's two moments of them
    assert PARAMS == 115_008
    assert est["strategy"] == "fsdp" and est["precision"] == "bf16-mixed"
    assert est["resident"]["parameters"] == 4 * PARAMS // 2
    assert est["resident"]["optimizer_state"] == 2 * 4 * PARAMS // 2
    # AND the model's own loss is trained, from the ids as labels, and the peak names its op
    assert "note: loss: the model's own, from `labels` (the input ids)" in printed
    assert est["peak_op"].startswith("aten.")
    # AND the budget says which H100 and that the CUDA context is counted
    assert (
        "budget: device memory 79.11 GiB: H100 SXM 80 GB HBM3 (torch's total capacity, 79.11 GiB); "
        "another variant: --device-memory"
    ) in printed
    assert "budget: CUDA context counted: 512.00 MiB kept back" in printed
    assert yaml.safe_load((out / "memory_estimate.yaml").read_text())["reserve_bytes"] == CUDA_CONTEXT


def tiny_mlp() -> nn.Module:
    """A factory for ``module:factory``: 64 -> 256 -> 64, no vocabulary."""
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 64))


def test_module_factory_without_a_vocabulary_says_how_to_go_on(capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    assert main(["estimate", "test_one_command:tiny_mlp", "--seq-len", "8"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "test_one_command:tiny_mlp: the model names no vocabulary" in err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["nowhere"],
            "`MODEL`: 'nowhere' is neither a file or directory (a Hugging Face config.json) nor module:factory",
        ),
        (["no_such_module:f"], "`MODEL`: 'no_such_module:f': cannot import it"),
        (["TINY", "--gpu", "L4"], "`--gpu`: no memory size known for 'L4'; give it with --device-memory"),
        (["TINY", "--batch-size", "0"], "`--batch-size`: got '0'; give N, N,M,... or auto"),
    ],
)
def test_bad_input_is_one_line_exit_2(tiny, capsys, args, message):
    rc = main(["estimate", *[str(tiny) if a == "TINY" else a for a in args]])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and message in err, err


def test_the_gpu_table_names_the_variant():
    assert device_memory("NVIDIA H100 80GB HBM3").total == int(79.11 * 2**30)
    assert device_memory("H200").total == 150_109_880_320  # tests/fixtures/gpu_oom_run's record


def _linear(base: int, per_row: int, step: int = 2 * 2**20):
    """Estimates whose peak is ``base + per_row x rows``, rounded up to the allocator's ``step``."""
    calls: list[int] = []

    def one(rows: int) -> MemoryEstimate:
        calls.append(rows)
        v = -(-(base + per_row * rows) // step) * step
        return MemoryEstimate(peak_bytes=v, tensor_peak_bytes=v, batch_size=rows)

    return one, calls


def test_the_search_predicts_then_confirms_in_four_estimates():
    # GIVEN 12.31 GiB fixed and 3.44 GiB a row on 79.11 GiB less 512 MiB: (79.11 - 0.5 - 12.31) / 3.44 = 19.27
    gib = 2**30
    one, calls = _linear(int(12.31 * gib), int(3.44 * gib))
    found = search(one, int(79.11 * gib), CUDA_CONTEXT, jobs=1)
    # THEN 19 rows, from rows 1 and 2, the prediction 19 and its neighbour 20 (doubling and
    # bisecting takes 1, 2, 4, 8, 16, 32, 24, 20, 18, 19: ten)
    assert found.largest == 19 and calls == [1, 2, 19, 20]


@pytest.mark.parametrize("memory", [0, 300, 1_000, 4_096, 65_536, 1_000_003])
@pytest.mark.parametrize(("base", "per_row", "step"), [(100, 3, 1), (1000, 7, 512), (0, 1000, 64)])
def test_the_search_agrees_with_trying_every_batch(memory, base, per_row, step):
    one, _ = _linear(base, per_row, step)
    brute = 0
    while one(brute + 1).headroom(memory) >= 0:
        brute += 1
    assert search(_linear(base, per_row, step)[0], memory, jobs=1).largest == brute


def test_side_by_side_the_search_confirms_each_guess_with_its_neighbour_at_once(monkeypatch):
    # GIVEN the 7B-like line above, searched with two estimates at a time (forked processes) by a
    # process that has run an estimate before (its caches are warm: nothing runs here first)
    monkeypatch.setattr(workers, "_warm", True)
    gib = 2**30
    one, calls = _linear(int(12.31 * gib), int(3.44 * gib))
    found = search(one, int(79.11 * gib), CUDA_CONTEXT, jobs=2)
    # THEN the same answer from the same four estimates, made in two rounds by the children
    # (the parent's own list of calls stays empty: nothing was rerun in process)
    assert found.largest == 19 and sorted(found.tried) == [1, 2, 19, 20] and calls == []
    assert found.tried[19].peak_bytes == one(19).peak_bytes


#: A 7B Llama's step with checkpointing on 8 x H100 (FSDP2, AdamW, bf16-mixed, 4,096 tokens a row),
#: as `memprofiler estimate` gave it: the tensors' peak and the allocator's reserved peak by rows.
LLAMA_7B_CKPT = {
    1: (28_995_822_080, 37_434_163_200),
    2: (32_688_038_400, 40_913_338_368),
    13: (73_315_164_672, 83_164_659_712),
    14: (77_009_445_376, 84_852_867_072),
    15: (80_701_628_928, 87_237_328_896),
}


def _recorded(calls: list[int]):
    """The recorded 7B estimates; rows not recorded lie on the line through rows 1 and 2 with
    the same allocator overhead as row 2."""

    def one(rows: int) -> MemoryEstimate:
        calls.append(rows)
        peak, reserved = LLAMA_7B_CKPT.get(rows, (0, 0))
        if not peak:
            peak = 28_995_822_080 + (rows - 1) * 3_692_216_320
            reserved = peak + 8_225_300_000
        return MemoryEstimate(
            peak_bytes=peak,
            tensor_peak_bytes=peak,
            reserved_peak_bytes=reserved,
            margin_bytes=2**29,
            batch_size=rows,
        )

    return one


def test_the_prediction_follows_the_tensors_not_the_allocators_wandering_overhead():
    # GIVEN the 7B step's estimates: the reserved peak grows 3.48 GB from row 1 to 2 but 3.84 GB a
    # row from 2 to 13 (the allocator's overhead over the tensors wanders, 6.5-9.9 GB), while the
    # tensors' peak grows 3.69 GB a row throughout
    calls: list[int] = []
    found = search(_recorded(calls), device_memory("H100").total, CUDA_CONTEXT, jobs=1)
    # THEN the tensors' line less the larger overhead predicts 13 at once: 13 fits, 14 does not
    # (the reserved peaks' own line predicted 14, which does not fit: side by side, 14 and its
    # neighbour 15 were estimated, and 13 took a round of its own)
    assert found.largest == 13 and calls == [1, 2, 13, 14]


#: The demo's FSDP2 GPT on 2 ranks (configs/fsdp_cpu.yaml, H100 rules): allocated and reserved
#: peaks by rows, as the LightningCLI estimate gave them (rows 56-78 but 73 and 76 to the
#: printed 0.01 MiB).
DEMO_GPT = {
    1: (77_619_200, 81_788_928),
    2: (79_289_856, 83_886_080),
    56: (209_987_829, 228_589_568),
    57: (210_197_544, 228_589_568),
    58: (210_396_774, 228_589_568),
    59: (212_399_554, 249_561_088),
    60: (214_737_879, 249_561_088),
    61: (223_996_805, 249_561_088),
    62: (224_070_205, 249_561_088),
    63: (224_143_605, 249_561_088),
    64: (224_217_006, 249_561_088),
    65: (226_586_787, 270_532_608),
    66: (228_956_569, 270_532_608),
    67: (231_326_351, 270_532_608),
    68: (239_830_302, 270_532_608),
    69: (240_102_932, 270_532_608),
    70: (240_396_533, 270_532_608),
    71: (240_994_222, 270_532_608),
    72: (243_164_774, 289_406_976),
    73: (245_538_816, 291_504_128),
    74: (247_904_337, 291_504_128),
    75: (250_274_119, 291_504_128),
    76: (262_076_928, 291_504_128),
    77: (262_091_571, 291_504_128),
    78: (262_091_571, 291_504_128),
    79: (262_109_184, 291_504_128),
    80: (262_113_792, 291_504_128),
    81: (264_486_912, 350_224_384),
    132: (385_276_928, 480_247_808),
}


def test_inside_the_bracket_the_search_follows_the_headroom_where_the_overhead_grows():
    # GIVEN the demo GPT's steps on 800 MiB less NCCL's 512 MiB margin: the allocator's overhead
    # above the tensors grows from 4 MiB at 2 rows to 91 MiB at 132
    mib = 2**20
    calls: list[int] = []

    def one(rows: int) -> MemoryEstimate:
        calls.append(rows)
        peak, reserved = DEMO_GPT[rows]
        return MemoryEstimate(
            peak_bytes=peak, tensor_peak_bytes=peak, reserved_peak_bytes=reserved, margin_bytes=512 * mib
        )

    found = search(one, 800 * mib, 0, jobs=1)
    # THEN 80 rows in 8 estimates: once a batch that does not fit is known (132), the guesses
    # follow the headroom (holding the bracket ends' larger overhead back from the tensors' line
    # kept every guess at the bracket's floor: 56, 57, 58, ... 81, 30 estimates)
    assert found.largest == 80
    assert calls[:3] == [1, 2, 132] and sorted(calls) == [1, 2, 73, 76, 79, 80, 81, 132]


def test_searches_side_by_side_give_each_searchs_own_answer_in_shared_rounds():
    # GIVEN the step without checkpointing (one row fits) and with it (13), one estimate at a time
    gib = 2**30
    calls: list[int] = []
    without, _ = _linear(int(20 * gib), int(34 * gib))
    ones = {False: lambda b: without(b), True: _recorded(calls)}
    found = search_many(ones, device_memory("H100").total, CUDA_CONTEXT, jobs=1)
    # THEN each search's answer and estimates are those it makes alone
    assert {k: (f.largest, sorted(f.tried)) for k, f in found.items()} == {
        False: (1, [1, 2]),
        True: (13, [1, 2, 13, 14]),
    }
    alone = search(_recorded([]), device_memory("H100").total, CUDA_CONTEXT, jobs=1)
    assert found[True].tried[13] == alone.tried[13]


def test_two_searches_on_two_cores_take_three_rounds(monkeypatch):
    # GIVEN the same two searches with two estimates at a time, each round counted
    rounds: list[int] = []
    prefetch = workers.prefetch

    def counted(tasks, jobs=None):  # type: ignore[no-untyped-def]
        rounds.append(len(tasks))
        return prefetch(tasks, jobs)

    monkeypatch.setattr(workers, "_warm", True)
    monkeypatch.setattr(workers, "prefetch", counted)
    gib = 2**30
    without, _ = _linear(int(20 * gib), int(34 * gib))
    ones = {False: without, True: _recorded([])}
    found = search_many(ones, device_memory("H100").total, CUDA_CONTEXT, jobs=2)
    # THEN rows 1 of both, rows 2 of both, then 13 with its neighbour 14: three rounds of two,
    # where one search after the other takes four (the first search's second round runs alone)
    assert rounds == [2, 2, 2]
    assert (found[False].largest, found[True].largest) == (1, 13)


def test_largest_batch_from_python_agrees_with_each_estimate():
    # GIVEN a small MLP estimated as tensor bytes (device cpu), with room for a few rows
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(512, 2048), nn.ReLU(), nn.Linear(2048, 512))
    opts = {"optimizer": lambda ps: torch.optim.SGD(ps, lr=0.1), "device": "cpu"}
    found = largest_batch(model, lambda n: torch.randn(n, 512), device_memory=22 * 2**20, reserve=0, **opts)
    # THEN the answer fits and one more row does not, by the estimates the search made
    assert found.largest > 1
    assert found.tried[found.largest].fits(22 * 2**20)
    assert not found.tried[found.largest + 1].fits(22 * 2**20)
    assert len(found.tried) <= 8  # doubling to 512 then bisecting to 393 takes 18


@pytest.mark.parametrize(("context", "counted"), [(None, "512.00 MiB"), ("1GiB", "1.00 GiB"), ("0", None)])
def test_not_modelled_says_whether_the_budget_counted_the_cuda_context(
    tiny, tmp_path, capsys, context, counted
):
    # GIVEN the CUDA context kept back by default, a bigger one, or left out with --context 0
    out = tmp_path / "out"
    args = ["estimate", str(tiny), "--seq-len", "8", "--batch-size", "1", "--save-dir", str(out)]
    assert main(args + (["--context", context] if context is not None else [])) == 0
    printed = capsys.readouterr().out
    [line] = [ln for ln in printed.splitlines() if ln.startswith("not modelled: ")]
    [est] = _estimates(out)
    if counted is None:
        # THEN left out, the context is not modelled and nothing keeps it back: the line says to
        assert "CUDA context counted" not in printed
        assert line.startswith("not modelled: CUDA context and NCCL buffers (use `reserve`")
    else:
        # THEN counted, the budget line and "not modelled" say the same bytes, and neither
        # asks for a reserve the budget already holds
        assert f"budget: CUDA context counted: {counted} kept back" in printed
        assert "use `reserve`" not in line
        assert f"the CUDA context is not modelled but kept back in the budget ({counted})" in line
        assert line.startswith("not modelled: NCCL buffers (a distributed run adds a stated margin); ")
    # AND the estimate's YAML holds the line as printed
    assert line == "not modelled: " + "; ".join(est["not_modelled"])


def test_both_checkpointing_rows_in_one_command_equal_each_alone(tiny, tmp_path, capsys):
    # WHEN the tiny LLaMA is estimated without and with checkpointing in one command
    common = ["estimate", str(tiny), "--world-size", "2", "--seq-len", "64", "--batch-size", "1,2"]
    assert main([*common, "--checkpointing", "both", "--save-dir", str(tmp_path / "both")]) == 0
    printed = capsys.readouterr().out
    both = _estimates(tmp_path / "both")
    # THEN four rows, without then with, each equal to the same row estimated on its own
    assert [(e["checkpointing"], e["batch_size"]) for e in both] == [
        (False, 1),
        (False, 2),
        (True, 1),
        (True, 2),
    ]
    assert "┃ checkpointing ┃" in printed
    assert main([*common, "--checkpointing", "--jobs", "1", "--save-dir", str(tmp_path / "on")]) == 0
    on = _estimates(tmp_path / "on")
    fields = ("peak_bytes", "reserved_peak_bytes", "by_category", "peak_op", "notes")
    assert [[e[f] for f in fields] for e in both[2:]] == [[e[f] for f in fields] for e in on]
    # AND checkpointing keeps less: the blocks' activations are recomputed in backward
    assert both[2]["by_category"]["activations"] < both[0]["by_category"]["activations"]


def test_fsdp2_mixed_precision_from_the_command_line_equals_the_plan(tiny, tmp_path, capsys):
    from memprofiler.estimate import EstimatePlan, estimate_plan
    from memprofiler.estimate.command import OPTIMIZERS
    from memprofiler.estimate.named import load_model

    # WHEN FSDP2 gathers bf16 and reduces fp32, said on the command line
    args = ["estimate", str(tiny), "--world-size", "2", "--seq-len", "64", "--precision", "32-true"]
    mp = ["--param-dtype", "bf16", "--reduce-dtype", "fp32", "--no-reshard-after-forward"]
    assert main([*args, *mp, "--save-dir", str(tmp_path)]) == 0
    [est] = _estimates(tmp_path)
    # THEN it is the plan written in Python, and the shards stay float32
    named = load_model(str(tiny))
    plan = EstimatePlan(
        optimizer=OPTIMIZERS["adamw"], loss_fn=named.loss_fn(), strategy="fsdp", world_size=2,
        precision="32-true", param_dtype=torch.bfloat16, reduce_dtype=torch.float32,
        reshard_after_forward=False, gpu="H100", device_memory=device_memory("H100").total,
    )  # fmt: skip
    by_hand = estimate_plan(named.model, named.batch(1, 64), plan)
    assert (est["peak_bytes"], est["reserved_peak_bytes"]) == (
        by_hand.peak_bytes,
        by_hand.reserved_peak_bytes,
    )
    assert est["resident"]["parameters"] == 4 * PARAMS // 2


def test_fsdp2_mixed_precision_without_fsdp_is_one_line(tiny, capsys):
    assert main(["estimate", str(tiny), "--param-dtype", "bf16"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "`--param-dtype`: FSDP2's mixed precision needs --strategy fsdp" in err


def test_checkpointing_a_transformers_model_turns_its_cache_off_as_training_would(tiny):
    # GIVEN the tiny LLaMA, whose config keeps a cache in forward by default
    from memprofiler.estimate.named import load_model

    named = load_model(str(tiny))
    assert named.model.config.use_cache is True
    # WHEN checkpointing is turned on THEN no config of the model keeps a cache (transformers would
    # turn it off in the first checkpointed forward, with a warning in every estimate's process)
    named.checkpoint()
    assert not [m for m in named.model.modules() if getattr(getattr(m, "config", None), "use_cache", False)]
