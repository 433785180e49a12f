"""The estimate's environment and target read as torch reads them: refused where torch refuses,
named where the estimate takes something else, never a smaller figure without a word."""

from __future__ import annotations

import pytest
import torch

from memprofiler.errors import ConfigError
from memprofiler.estimate.allocator import conf as alloc_conf
from memprofiler.estimate.cuda.environment import VARIABLES, allocator_note, workspace_notes
from memprofiler.estimate.cuda.margins import nccl_buffsize
from memprofiler.estimate.cuda.target import resolve_target, version_note
from memprofiler.estimate.cuda.workspaces import (
    WorkspacePlan,
    cublas_workspace_bytes,
    cublaslt_workspace_bytes,
    lt_unified,
)

KiB, MiB = 1024, 1 << 20
H200_211 = resolve_target("H200", "2.11")
H200_212 = resolve_target("H200", "2.12")
CONF = "PYTORCH_CUDA_ALLOC_CONF"


# ---- cuBLAS / cuBLASLt (CublasHandlePool.cpp) ----------------------------------------------------


def test_a_negative_cublaslt_size_is_refused_where_torch_would_fail_to_allocate_it():
    # GIVEN a cuBLASLt workspace of its own, stoi(value) x 1024 bytes as size_t, uncapped
    env = {"CUBLASLT_WORKSPACE_SIZE": "-1", "TORCH_CUBLASLT_UNIFIED_WORKSPACE": "0"}
    # THEN -1 (which torch turns into 2**64 - 1,024 bytes) is one line naming the variable
    with pytest.raises(ConfigError, match="`CUBLASLT_WORKSPACE_SIZE`: got '-1'"):
        cublaslt_workspace_bytes(H200_211, env)
    # AND where torch caps the size at the cuBLAS workspace, it is that: 32 MiB, never -1 KiB
    assert cublaslt_workspace_bytes(H200_212, {"CUBLASLT_WORKSPACE_SIZE": "-1"}) == 32 * MiB
    assert cublaslt_workspace_bytes(H200_211, {"CUBLASLT_WORKSPACE_SIZE": "-1"}) == 32 * MiB


@pytest.mark.parametrize(
    ("value", "expected"),
    [("2048", 2 * MiB), ("  512", 512 * KiB), ("12abc", 12 * KiB), ("+8", 8 * KiB), ("0", 0)],
)
def test_cublaslt_size_is_read_as_stoi_reads_it(value, expected):
    assert cublaslt_workspace_bytes(H200_211, {"CUBLASLT_WORKSPACE_SIZE": value}) == expected


@pytest.mark.parametrize("value", ["abc", "", "99999999999"])
def test_a_cublaslt_size_stoi_cannot_read_keeps_the_default_with_a_warning(value):
    with pytest.warns(UserWarning, match="CUBLASLT_WORKSPACE_SIZE"):
        assert cublaslt_workspace_bytes(H200_211, {"CUBLASLT_WORKSPACE_SIZE": value}) == MiB


def test_a_cublas_config_number_stoull_cannot_read_is_refused():
    with pytest.raises(ConfigError, match="`CUBLAS_WORKSPACE_CONFIG`: got ':99999999999999999999:8'"):
        cublas_workspace_bytes(H200_211, {"CUBLAS_WORKSPACE_CONFIG": ":99999999999999999999:8"})


def test_a_cublas_config_is_summed_in_size_t_as_torch_sums_it():
    # 2**54 KiB x 1,024 = 2**64: wraps to 0 in size_t, plus the second pair
    env = {"CUBLAS_WORKSPACE_CONFIG": f":{2**54}:1024:16:8"}
    assert cublas_workspace_bytes(H200_211, env) == 16 * KiB * 8


@pytest.mark.parametrize("value", ["true", "yes", "on", " 1"])
def test_the_unified_workspace_flag_is_exactly_0_or_1_as_check_env_reads_it(value):
    # torch's check_env takes "1" and "0" only: "true" leaves 2.11's separate workspace, and the figure
    assert not lt_unified(H200_211, {"TORCH_CUBLASLT_UNIFIED_WORKSPACE": value})
    assert lt_unified(H200_212, {"TORCH_CUBLASLT_UNIFIED_WORKSPACE": value.replace("true", "false")})


def test_every_cublas_variable_set_gets_a_note_saying_what_it_gave():
    env = {
        "CUBLAS_WORKSPACE_CONFIG": ":16:8",
        "CUBLASLT_WORKSPACE_SIZE": "0",
        "TORCH_CUBLASLT_UNIFIED_WORKSPACE": "yes",
        "DISABLE_ADDMM_CUDA_LT": "true",
    }
    plan = WorkspacePlan.for_target(H200_211, env)
    notes = workspace_notes(H200_211, plan, env)
    assert notes == [
        "environment: CUBLAS_WORKSPACE_CONFIG=':16:8': cuBLAS workspace per thread 128.00 KiB "
        "(below the default 32.00 MiB)",
        "environment: CUBLASLT_WORKSPACE_SIZE='0': cuBLASLt workspace per thread 0 B (below the default 1.00 MiB)",
        "environment: TORCH_CUBLASLT_UNIFIED_WORKSPACE='yes' is not 0 or 1, which torch ignores (with a warning): "
        "cuBLASLt has its own workspace",
        "environment: DISABLE_ADDMM_CUDA_LT='true': not '1': the cuBLASLt path stays on",
    ]
    assert workspace_notes(H200_211, WorkspacePlan.for_target(H200_211, {}), {}) == []


# ---- PYTORCH_CUDA_ALLOC_CONF (c10/core/AllocatorConfig.cpp, c10/cuda/CUDAAllocatorConfig.cpp) -------


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("expandable_segments:maybe", "expected 'True' or 'False'"),
        ("expandable_segments:true", "expected 'True' or 'False'"),
        ("garbage", "unrecognized key 'garbage'"),
        ("max_split_size_mb:5", "max_split_size_mb must be >= 20"),
        ("max_split_size_mb:abc", "not a number"),
        ("garbage_collection_threshold:1.5", r"\(0.0, 1.0\)"),
        ("roundup_power2_divisions:3", "power of 2"),
        ("max_split_size_mb", "ends where a value should follow"),
        ("backend:cudaMalloc", "native or cudaMallocAsync"),
        ("pinned_use_host_register:True", "unrecognized key"),
    ],
)
def test_an_alloc_conf_torch_refuses_is_refused_in_one_line_naming_the_variable(text, why):
    with pytest.raises(ConfigError, match=f"`{CONF}`: got .*{why}") as err:
        alloc_conf.read({CONF: text})
    assert "\n" not in str(err.value)


def test_an_alloc_conf_torch_reads_otherwise_than_it_looks_is_named():
    # stoull negates "-5" modulo 2**64; the option clamps it: no limit, and the note says so
    conf = alloc_conf.read({CONF: "max_split_size_mb:-5, expandable_segments : True"})
    assert conf.expandable_segments and conf.max_split_size == ((1 << 64) - 1) // MiB * MiB
    note = allocator_note(conf)
    assert "max_split_size_mb:-5 reads as 17592186044415 MiB" in note
    assert note.startswith(
        "caching allocator: PYTORCH_CUDA_ALLOC_CONF='max_split_size_mb:-5, expandable_segments"
    )


def test_cuda_malloc_async_and_options_the_model_does_not_follow_are_named():
    note = allocator_note(alloc_conf.read({CONF: "backend:cudaMallocAsync"}))
    assert "backend:cudaMallocAsync hands memory to CUDA's own pool allocator" in note
    conf = alloc_conf.read(
        {
            CONF: "large_segment_size_mb:40,roundup_power2_divisions:[256:4,>:8],pinned_use_background_threads:True"
        }
    )
    assert conf.not_modelled == ("roundup_power2_divisions:[256:4,>:8]", "large_segment_size_mb:40")
    assert "no effect on device memory: pinned_use_background_threads:True" in allocator_note(conf)
    # the same division everywhere is the model's single setting
    assert alloc_conf.read({CONF: "roundup_power2_divisions:[256:4,>:4]"}).roundup_power2_divisions == 4


def test_the_cuda_variable_wins_even_empty_and_the_generic_one_is_read_without_it():
    assert alloc_conf.read({CONF: "", "PYTORCH_ALLOC_CONF": "expandable_segments:True"}).variable == CONF
    conf = alloc_conf.read({"PYTORCH_ALLOC_CONF": "expandable_segments:True"})
    assert (conf.variable, conf.expandable_segments) == ("PYTORCH_ALLOC_CONF", True)
    assert allocator_note(alloc_conf.read({})).startswith("caching allocator: defaults")


#: Settings of the device-independent keys, which a CPU build of torch parses as a CUDA one does.
COMMON = [
    "expandable_segments:True,max_split_size_mb:200",
    "max_split_size_mb: 128",
    "max_split_size_mb:-5",
    "max_split_size_mb:12abc",
    "max_split_size_mb:20",
    "max_split_size_mb:99999999999999999999999",
    "expandable_segments:maybe",
    "expandable_segments:1",
    "garbage_collection_threshold:0.5x",
    "garbage_collection_threshold:nan",
    "roundup_power2_divisions:[256:4,>:8]",
    "roundup_power2_divisions:[256:4",
    "roundup_power2_divisions:[3:4]",
    "large_segment_size_mb:40,max_split_size_mb:30",
    "max_split_size_mb:128;expandable_segments:True",
    "expandable_segments:True max_split_size_mb:128",
    "expandable_segments:True,",
]


@pytest.mark.skipif(
    not hasattr(torch._C, "_accelerator_setAllocatorSettings"),
    reason="this torch has no allocator settings parser",
)
@pytest.mark.parametrize("text", COMMON)
def test_the_parser_refuses_what_torchs_own_parser_refuses(text):
    before = torch._C._accelerator_getAllocatorSettings()
    try:
        torch._C._accelerator_setAllocatorSettings(text)
        torch_refuses = False
    except (RuntimeError, ValueError, IndexError):
        torch_refuses = True
    finally:
        torch._C._accelerator_setAllocatorSettings(before)
    try:
        alloc_conf.read({CONF: text})
        ours = False
    except ConfigError:
        ours = True
    assert ours == torch_refuses


# ---- NCCL_BUFFSIZE ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"), [("1048576", MiB), ("0x400000", 4 * MiB), ("2097152B", 2 * MiB), (None, 4 * MiB)]
)
def test_nccl_buffsize_is_read_as_strtoll_base_0(value, expected):
    env = {} if value is None else {"NCCL_BUFFSIZE": value}
    assert nccl_buffsize(env) == (expected, "")


@pytest.mark.parametrize("value", ["-1", "abc", "0"])
def test_a_nccl_buffsize_that_is_no_size_keeps_the_default_with_a_note(value):
    size, note = nccl_buffsize({"NCCL_BUFFSIZE": value})
    assert size == 4 * MiB and "keeps NCCL's default 4.00 MiB" in note


# ---- the target ---------------------------------------------------------------------------------


@pytest.mark.parametrize("gpu", ["0.0", "sm00", "99.9", "H1000", "H100X"])
def test_a_target_no_rule_knows_is_refused(gpu):
    with pytest.raises(ConfigError, match="`gpu`: got"):
        resolve_target(gpu, "2.11")


@pytest.mark.parametrize(
    ("gpu", "name"),
    [
        ("NVIDIA H100 80GB HBM3", "H100"),
        ("H100 PCIe", "H100PCIE"),
        ("NVIDIA GeForce RTX 4090", "RTX4090"),
        ("Tesla V100-SXM2-32GB", "V100"),
        ("sm_90", "sm90"),
        ("8.7", "sm87"),
    ],
)
def test_a_target_is_read_from_its_leading_words(gpu, name):
    assert resolve_target(gpu, "2.11").name == name


@pytest.mark.parametrize("version", ["99.1", "1.0", "3.0", "2.x", "latest"])
def test_a_torch_version_outside_torch_2_is_refused(version):
    with pytest.raises(ConfigError, match="`torch_version`: got"):
        resolve_target("H100", version)


def test_a_torch_2_release_outside_the_rules_is_named():
    assert version_note((2, 11)) is None
    assert version_note((2, 5)) == (
        "torch 2.5 is outside the releases the rules know (2.9 to 2.13): its workspaces, kernel scratch and "
        "allocator settings are estimated by torch 2.9's rules"
    )
    assert "by torch 2.13's rules" in (version_note((2, 14)) or "")


def test_every_variable_the_estimate_reads_is_in_the_reliability_guide():
    from pathlib import Path

    guide = (Path(__file__).resolve().parents[2] / "docs" / "guides" / "reliability.md").read_text()
    missing = [name for name in VARIABLES if f"`{name}`" not in guide]
    assert not missing


# ---- in an estimate -----------------------------------------------------------------------------


def _mlp() -> torch.nn.Module:
    with torch.device("meta"):
        return torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 8))


def _estimate(**kwargs):
    from memprofiler.estimate import estimate_memory

    kwargs.setdefault("gpu", "H100")
    batch = kwargs.pop("batch", torch.randn(4, 64))
    return estimate_memory(_mlp(), batch, optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1), **kwargs)


def test_a_smaller_workspace_from_the_environment_is_said_in_the_estimate(monkeypatch):
    base = _estimate(torch_version="2.11")
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")
    small = _estimate(torch_version="2.11")
    # two cuBLAS workspaces of 128 KiB instead of 32 MiB, the cuBLASLt one capped at 128 KiB (not 1 MiB)
    assert base.peak_bytes - small.peak_bytes == 2 * (32 * MiB - 128 * KiB) + (MiB - 128 * KiB)
    assert any(
        n.startswith("environment: CUBLAS_WORKSPACE_CONFIG=':16:8'") and "below the default" in n
        for n in small.notes
    )
    assert not any(n.startswith("environment:") for n in base.notes)


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("CUBLAS_WORKSPACE_CONFIG", ":99999999999999999999:8"),
        ("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:maybe"),
        ("PYTORCH_ALLOC_CONF", "garbage"),
    ],
)
def test_an_environment_torch_refuses_is_refused_before_the_steps(monkeypatch, variable, value):
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError, match=f"`{variable}`: got"):
        _estimate()


def test_the_allocator_settings_are_one_line_with_what_the_model_does_not_follow(monkeypatch):
    monkeypatch.setenv(CONF, "backend:cudaMallocAsync")
    (line,) = [n for n in _estimate().notes if n.startswith("caching allocator")]
    assert "backend:cudaMallocAsync hands memory to CUDA's own pool allocator" in line


def test_a_batch_of_size_0_is_refused():
    with pytest.raises(ConfigError, match="`batch`: the batch has 0 rows"):
        _estimate(batch=torch.randn(0, 64))
    with pytest.raises(ConfigError, match=r"`batch`: batch\['x'\] has 0 rows"):
        _estimate(batch={"x": torch.randn(0, 64)}, loss_fn=lambda m, b: m(b["x"]).sum())


def test_the_result_says_which_torch_each_part_followed():
    from memprofiler.estimate.cuda.target import installed_version

    est = _estimate(torch_version="2.5")
    installed = "{}.{} (installed)".format(*installed_version())
    assert est.torch_rules["cuBLAS and cuBLASLt workspaces"] == "2.9 (target 2.5)"
    assert est.torch_rules["FSDP2"] == est.torch_rules["activation checkpointing"] == installed
    assert est.torch_rules["autograd"] == installed
    assert any(n.startswith("torch 2.5 is outside the releases the rules know") for n in est.notes)
    assert any(
        n.startswith("torch 2.5 (the target) decides: cuBLAS and cuBLASLt workspaces") for n in est.notes
    )
    same = _estimate(torch_version="{}.{}".format(*installed_version()))
    assert not any("(the target) decides" in n for n in same.notes)
    assert _estimate(device="cpu").torch_rules == {}
