"""Module-wise tracking without FSDP (``track_module_mem``, PyTorch's ``MemTracker``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
import yaml
from torch import nn
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

from conftest import make_trainer
from memprofiler import ConfigError, MemProfiler, MemProfilerCallback, MemProfilerConfig, memprofilable
from memprofiler.collectors.mem_report import fmt_value, parse_log_values, render_log

MIB = 2**20


class TinyLM(pl.LightningModule):
    def __init__(self, twice: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8))
        self.twice = twice
        self.modes: list[int] = []

    @memprofilable
    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        self.modes.append(len(_get_current_dispatch_mode_stack()))
        scratch = torch.ones(MIB // 4)  # a known 1 MiB allocation inside the step
        loss = self.net(batch).pow(2).mean() + scratch.sum() * 0
        if self.twice:
            loss = loss + self.net(batch).mean()
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters())

    def train_dataloader(self) -> Any:
        return torch.utils.data.DataLoader(torch.randn(40, 32), batch_size=8)


def _fit(tmp_path: Path, model: TinyLM | None = None, **cfg: Any) -> tuple[MemProfilerCallback, TinyLM]:
    cfg = {"track_module_mem": True, "save_dir": str(tmp_path), "enable_saved_tensors_hooks": False, **cfg}
    cb = MemProfilerCallback(cfg)
    model = model or TinyLM()
    make_trainer(tmp_path, [cb], limit_train_batches=5).fit(model)
    return cb, model


def _pb(m: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in m.parameters())


def _report(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())


def test_window_includes_backward_and_optimizer_step(tmp_path):
    # GIVEN call 1 collected: no gradient and no optimizer state exist when it starts
    cb, model = _fit(tmp_path, schedule={"warmup": 0, "active": 1})
    pb = _pb(model)
    end = cb.profiler.snapshots["0.training_step.1.end"]
    assert end["module_mem.peak.parameter"] == pb
    # AND the known 1 MiB allocation of the step is counted as activation
    assert end["module_mem.peak.activation"] >= MIB
    # THEN backward ran inside the window (under automatic optimization it runs after
    # training_step returns): the network has a post-backward snapshot with every gradient
    report = _report(tmp_path / "module_mem_rank_0_training_step_1.yaml")
    post_bw = report["modules"]["TinyLM.net"]["Post-Backward"][0]["cpu"]
    assert post_bw["Gradient"] == pb
    assert post_bw["Optstate"] == 0
    # AND so did the optimizer step: when the window closes, the Adam state it created
    # (two moments and a 4-byte step per parameter) is there, labelled Optstate
    n_params = len(list(model.parameters()))
    assert report["final"]["cpu"]["Optstate"] == 2 * pb + 4 * n_params


def test_analytic_breakdown_per_module_and_only_in_the_window(tmp_path):
    # GIVEN calls 2 and 3 collected
    cb, model = _fit(tmp_path, schedule={"warmup": 1, "active": 2}, module_mem_units="KiB")
    pb = _pb(model)
    n_params = len(list(model.parameters()))
    # THEN the tracker's mode is active inside collected calls only
    assert model.modes == [0, 1, 1, 0, 0]
    for call in (2, 3):
        report = _report(tmp_path / f"module_mem_rank_0_training_step_{call}.yaml")
        assert report["tracker"] == "MemTracker"
        assert (report["fn"], report["call"], report["rank"]) == ("training_step", call, 0)
        # AND when the network's forward starts, the breakdown is the analytic one:
        # parameters; the previous step's gradients (Lightning zeroes them after
        # training_step); Adam's two moments plus one 4-byte step per parameter
        pre = report["modules"]["TinyLM.net"]["Pre-Forward"][0]["cpu"]
        assert pre["Parameter"] == pb
        assert pre["Gradient"] == pb
        assert pre["Optstate"] == 2 * pb + 4 * n_params
        assert pre["Buffer"] == 0
        # AND the snapshot keys carry the peak per category in bytes
        end = cb.profiler.snapshots[f"0.training_step.{call}.end"]
        assert end["module_mem.peak.total"] == report["peak"]["cpu"]["Total"]
        assert end["module_mem.peak.optstate"] >= 2 * pb + 4 * n_params
        assert end["module_mem.peak_device"] == "cpu"
        # AND the .log shows the same numbers as the .yaml, in KiB
        log = (tmp_path / f"module_mem_rank_0_training_step_{call}.log").read_text()
        peak_lines = parse_log_values(log)[: len(report["peak"]["cpu"])]
        assert [(c, f"{v:g}") for c, v, _ in peak_lines] == [
            (c, f"{float(fmt_value(v, 'KiB').split()[0]):g}") for c, v in report["peak"]["cpu"].items()
        ]
    for call in (1, 4, 5):
        assert not (tmp_path / f"module_mem_rank_0_training_step_{call}.yaml").exists()
    # AND the consolidated file holds the keys too
    stats = _report(tmp_path / "rank_0_memory_stats.yaml")
    assert stats["0.training_step.2.end"]["module_mem.peak.parameter"] == pb


def test_depth_limits_the_modules_reported(tmp_path):
    _fit(tmp_path, module_mem_depth=3)
    report = _report(tmp_path / "module_mem_rank_0_training_step_2.yaml")
    assert list(report["modules"]) == ["TinyLM.net", "TinyLM.net.0", "TinyLM.net.1", "TinyLM.net.2"]
    # snapshots are of the whole tracked memory at each module's boundaries, not per module
    assert report["modules"]["TinyLM.net.0"]["Pre-Forward"][0]["cpu"]["Parameter"] == _pb(TinyLM())


def test_repeated_root_forward_is_survived_and_noted(tmp_path):
    with pytest.warns(UserWarning, match="root module ran forward more than once"):
        cb, model = _fit(tmp_path, model=TinyLM(twice=True))
    report = _report(tmp_path / "module_mem_rank_0_training_step_2.yaml")
    assert any("more than once" in n for n in report["notes"])
    assert cb.profiler.snapshots["0.training_step.2.end"]["module_mem.peak.parameter"] == _pb(model)


def test_plain_loop_without_step_end_closes_at_the_next_call(tmp_path):
    # GIVEN a plain loop that never calls step_end()
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 4))
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    prof = MemProfiler({"track_module_mem": True, "enable_saved_tensors_hooks": False}, save_dir=tmp_path)
    prof.setup(net)
    prof.bind(net, [opt])
    x = torch.randn(4, 16)
    for _ in range(3):
        with prof.profile("training_step", module=net):
            loss = net(x).sum()
        loss.backward()
        opt.step()
        opt.zero_grad()
    # THEN the window of call 2 ran until call 3 began, so it holds backward and the step
    assert _get_current_dispatch_mode_stack() == []
    prof.teardown()
    pb = _pb(net)
    report = _report(tmp_path / "module_mem_rank_0_training_step_2.yaml")
    assert report["modules"]["Sequential"]["Post-Backward"][0]["cpu"]["Gradient"] == pb
    # SGD's momentum buffers: one per parameter, of the parameter's size
    assert report["modules"]["Sequential"]["Pre-Forward"][0]["cpu"]["Optstate"] == pb
    # zero_grad(set_to_none) freed the gradients before the window closed
    assert report["final"]["cpu"]["Gradient"] == 0
    assert prof.snapshots["0.training_step.2.end"]["module_mem.peak.optstate"] >= pb


def test_a_raising_call_closes_the_tracker_and_keeps_its_report(tmp_path):
    net = nn.Linear(8, 8)
    prof = MemProfiler({"track_module_mem": True, "enable_saved_tensors_hooks": False}, save_dir=tmp_path)
    prof.setup(net)
    prof.bind(net, [])
    with prof.profile("training_step", module=net):
        net(torch.randn(2, 8))
    with pytest.raises(RuntimeError, match="boom"), prof.profile("training_step", module=net):
        net(torch.randn(2, 8))
        raise RuntimeError("boom")
    assert _get_current_dispatch_mode_stack() == []
    prof.dump()
    report = _report(tmp_path / "module_mem_rank_0_training_step_2.yaml")
    assert report["notes"] == ["`training_step` raised; the report covers the call up to the error"]
    assert report["peak"]["cpu"]["Parameter"] == _pb(net)
    assert prof.snapshots["0.training_step.2.end"]["failed"] is True


@pytest.mark.parametrize(
    ("cfg", "key"),
    [
        ({"track_module_mem": True, "track_fsdp_mem": True}, "track_module_mem"),
        ({"module_mem_units": "MB"}, "module_mem_units"),
        ({"module_mem_depth": -1}, "module_mem_depth"),
    ],
)
def test_bad_tracker_options_name_the_key(cfg, key):
    with pytest.raises(ConfigError, match=f"^`{key}`: "):
        MemProfilerConfig.from_any(cfg)


# ----------------------------------------------------------------------------- the reporter
REPORT = {
    "tracker": "MemTracker",
    "rank": 1,
    "fn": "training_step",
    "call": 2,
    "window": "W",
    "units": "B",
    "module_depth": 2,
    "notes": [],
    "peak": {"cpu": {"Parameter": 3 * MIB, "Gradient": MIB // 2, "Total": 3 * MIB + MIB // 2}},
    "final": {"cpu": {"Parameter": 3 * MIB, "Gradient": 0, "Total": 3 * MIB}},
    "modules": {"Net.a": {"Pre-Forward": [{"cpu": {"Parameter": 3 * MIB, "Gradient": 0, "Total": 3 * MIB}}]}},
}


def test_log_layout_is_peak_then_modules():
    assert render_log(REPORT, "MiB").splitlines() == [
        "MemTracker report: rank 1, `training_step` call 2",
        "Window: W",
        "Units: MiB",
        "",
        "Peak snapshot",
        "Device: cpu",
        "\tParameter: 3.0 MiB",
        "\tGradient: 0.5 MiB",
        "\tTotal: 3.5 MiB",
        "",
        "Snapshot at the end of the window",
        "Device: cpu",
        "\tParameter: 3.0 MiB",
        "\tGradient: 0.0 MiB",
        "\tTotal: 3.0 MiB",
        "",
        "Module-wise snapshots (depth <= 2)",
        "",
        "Module:  Net.a",
        "Pre-Forward # 0:",
        "Device: cpu",
        "\tParameter: 3.0 MiB",
        "\tGradient: 0.0 MiB",
        "\tTotal: 3.0 MiB",
    ]


def test_log_tables():
    assert render_log(REPORT, "KiB", tabulate=True).splitlines()[4:] == [
        "Peak snapshot",
        "======  ==========  =========  ==========",
        "Device  Parameter   Gradient   Total",
        "======  ==========  =========  ==========",
        "cpu     3072.0 KiB  512.0 KiB  3584.0 KiB",
        "======  ==========  =========  ==========",
        "",
        "Snapshot at the end of the window",
        "======  ==========  ========  ==========",
        "Device  Parameter   Gradient  Total",
        "======  ==========  ========  ==========",
        "cpu     3072.0 KiB  0.0 KiB   3072.0 KiB",
        "======  ==========  ========  ==========",
        "",
        "Module-wise snapshots (depth <= 2)",
        "",
        "Module:  Net.a",
        "===============  ======  ==========  ========  ==========",
        "State            Device  Parameter   Gradient  Total",
        "===============  ======  ==========  ========  ==========",
        "Pre-Forward # 0  cpu     3072.0 KiB  0.0 KiB   3072.0 KiB",
        "===============  ======  ==========  ========  ==========",
    ]


# --- the tracker must not hold what the step does not: torch's module-tracker backward hooks


class _Merge(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a[:, :256] + b


class _TwoInputs(nn.Module):
    """A module whose first input's gradient is ready a whole branch before its second's."""

    def __init__(self) -> None:
        super().__init__()
        self.pre = nn.Linear(256, 256)
        self.up = nn.Linear(256, 512)
        self.out = _Merge()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        r = self.pre(x)
        return self.out(torch.nn.functional.silu(self.up(r)), r)


def test_the_window_holds_no_gradient_the_unprofiled_step_frees(tmp_path):
    from census import census_peak

    torch.manual_seed(0)
    net = _TwoInputs()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    x = torch.randn(64, 256)
    plain = census_peak(net, x, opt, lambda m, b: m(b).pow(2).mean(), steps=2)
    # GIVEN the same steps, each inside a module-wise tracker window (open through backward)
    prof = MemProfiler({"track_module_mem": True, "enable_saved_tensors_hooks": False}, save_dir=tmp_path)
    prof.setup(net)
    prof.bind(net, [opt])

    def profiled(m: nn.Module, b: torch.Tensor) -> torch.Tensor:
        with prof.profile("training_step", module=m):
            return m(b).pow(2).mean()

    tracked = census_peak(net, x, opt, profiled, steps=2)
    prof.teardown()
    # THEN the live tensors peak where they do without the profiler: torch's hooks kept the first
    # input's gradient (64 x 512 float32) until the second's arrived, 131,072 B more
    assert tracked == plain
    assert (tmp_path / "module_mem_rank_0_training_step_2.yaml").is_file()  # the window did run
    # AND torch's own function is back once the window is closed
    from torch.distributed._tools import mod_tracker

    assert mod_tracker.register_multi_grad_hook is torch.autograd.graph.register_multi_grad_hook


class _LeafInput(nn.Module):
    """Wav2Vec2's feature encoder in small: it sets ``requires_grad`` on a view of its input."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv1d(1, 8, 5)
        self.fc = nn.Linear(8, 4)
        self.leaves: list[Any] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import weakref

        h = x[:, None]
        h.requires_grad = True
        self.leaves.append(weakref.ref(h))
        return self.fc(self.conv(h).transpose(1, 2))


def test_a_leaf_module_input_dies_with_its_step_inside_the_window(tmp_path):
    torch.manual_seed(0)
    net = _LeafInput()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    prof = MemProfiler(
        {
            "track_module_mem": True,
            "enable_saved_tensors_hooks": False,
            "schedule": {"warmup": 0, "active": 3},
        },
        save_dir=tmp_path,
    )
    prof.setup(net)
    prof.bind(net, [opt])
    for _ in range(3):
        with prof.profile("training_step", module=net):
            loss = net(torch.randn(2, 3200)).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        del loss
    # THEN each step's leaf (and its 25,600 B gradient) is gone once the step is, inside one window
    # of three calls: torch's hook kept the leaf's gradient accumulator, and so the leaf, alive
    alive = [ref() is not None for ref in net.leaves]
    prof.teardown()
    assert alive == [False, False, False]


def test_overlapping_windows_share_the_hook_swap_and_the_last_out_restores_torch():
    from torch.distributed._tools import mod_tracker

    from memprofiler.tracker_hooks import gradient_free_module_hooks

    original = mod_tracker.register_multi_grad_hook
    first, second = gradient_free_module_hooks(), gradient_free_module_hooks()
    assert first.__enter__() and second.__enter__()
    swapped = mod_tracker.register_multi_grad_hook
    assert swapped is not original
    first.__exit__(None, None, None)  # closed out of order: the other window still needs it
    assert mod_tracker.register_multi_grad_hook is swapped
    second.__exit__(None, None, None)
    assert mod_tracker.register_multi_grad_hook is original
