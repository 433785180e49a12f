"""MemProfilerCLI and the callback inside any LightningCLI YAML."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

from _cli_config import write_cli_config
from conftest import load_stats
from memprofiler import MemProfilerCallback, ProfilerHooksMixin
from memprofiler.lightning.cli import MemProfilerCLI

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from demo import DemoGPT

_config = write_cli_config


def test_top_level_group_installs_the_callback(tmp_path):
    out = tmp_path / "out"
    path = _config(tmp_path, {"memprofiler": {"schedule": {"warmup": 0, "active": 2}, "save_dir": str(out)}})
    MemProfilerCLI(DemoGPT, trainer_defaults={"accelerator": "cpu"}, args=["fit", "--config", str(path)])
    assert list(load_stats(out)) == [f"0.training_step.{c}.{p}" for c in (1, 2) for p in ("start", "end")]


def test_callback_in_trainer_callbacks(tmp_path):
    out = tmp_path / "out"
    cb = {
        "class_path": "memprofiler.MemProfilerCallback",
        "init_args": {"config": {"schedule": {"warmup": 1, "active": 1}, "save_dir": str(out)}},
    }
    path = _config(tmp_path, {"memprofiler": {"enabled": False}})
    raw = yaml.safe_load(path.read_text())
    raw["trainer"]["callbacks"] = [cb]
    path.write_text(yaml.safe_dump(raw))
    MemProfilerCLI(DemoGPT, trainer_defaults={"accelerator": "cpu"}, args=["fit", "--config", str(path)])
    assert list(load_stats(out)) == ["0.training_step.2.start", "0.training_step.2.end"]


@pytest.mark.parametrize(
    ("group", "expected"),
    [
        ({"schedule": {"activ": 2}}, "memprofiler.schedule.activ"),
        ({"schedule": {"active": 0}}, "`memprofiler.schedule.active`: got 0; must be >= 1"),
        ({"rss_peak_method": "x"}, "`memprofiler.rss_peak_method`: got 'x'"),
        ({"schedule": {"wait": "soon"}}, "`memprofiler.schedule.wait`: expected int, got 'soon'"),
    ],
)
def test_bad_group_exits_2_naming_the_key_before_training(tmp_path, capsys, group, expected):
    path = _config(tmp_path, {"memprofiler": {**group, "save_dir": str(tmp_path / "out")}})
    with pytest.raises(SystemExit) as info:
        MemProfilerCLI(DemoGPT, trainer_defaults={"accelerator": "cpu"}, args=["fit", "--config", str(path)])
    assert info.value.code == 2
    assert expected in capsys.readouterr().err
    assert not (tmp_path / "out").exists() and not (tmp_path / "run").exists()


def test_unwritable_save_dir_exits_2_before_training(tmp_path, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    path = _config(tmp_path, {"memprofiler": {"save_dir": str(blocker / "sub")}})
    with pytest.raises(SystemExit) as info:
        MemProfilerCLI(DemoGPT, trainer_defaults={"accelerator": "cpu"}, args=["fit", "--config", str(path)])
    assert info.value.code == 2
    assert "`memprofiler.save_dir`" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_a_missing_bucket_exits_2_with_one_line_before_training(tmp_path, capsys, s3_server):
    # GIVEN `memprofiler.save_dir` in a bucket that does not exist (a real S3 server)
    path = _config(tmp_path, {"memprofiler": {"save_dir": "s3://no-such-bucket/run"}})
    # WHEN the CLI starts THEN one line names the key, the URL and the fix; nothing trains
    line = _exit_2_line(tmp_path, capsys, ["fit", "--config", str(path)])
    assert line.startswith(
        "`memprofiler.save_dir` 's3://no-such-bucket/run' is not writable (FileNotFoundError: "
    )
    assert line.endswith("AWS_ENDPOINT_URL for S3-compatible stores) allow writing there")


def _with_callbacks(path: Path, *configs: dict | None) -> None:
    raw = yaml.safe_load(path.read_text())
    raw["trainer"]["callbacks"] = [
        {"class_path": "memprofiler.MemProfilerCallback", **({"init_args": {"config": c}} if c else {})}
        for c in configs
    ]
    path.write_text(yaml.safe_dump(raw))


def _exit_2_line(tmp_path: Path, capsys, args: list[str]) -> str:
    """Run the CLI; assert exit code 2 before training and return stderr's one error line."""
    with pytest.raises(SystemExit) as info:
        MemProfilerCLI(DemoGPT, trainer_defaults={"accelerator": "cpu"}, args=args)
    assert info.value.code == 2
    assert not (tmp_path / "run").exists() and not (tmp_path / "out").exists()
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1
    return lines[0].removeprefix("error: ")


_TWO = (
    "two memprofiler profilers on one Trainer: {a} and {b}; only one would collect and both write "
    "the same files. Keep one of them (remove the other, or give it `enabled: false`)"
)


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        (
            {"schedule": {"active": 0}},
            "`trainer.callbacks[0].init_args.config.schedule.active`: got 0; must be >= 1",
        ),
        (
            {"colect_funcs": {"default": ["training_step"]}},
            "`trainer.callbacks[0].init_args.config.colect_funcs`: unknown key; did you mean `collect_funcs`? "
            "allowed keys here: allocator_history, collect_funcs,",
        ),
    ],
)
def test_bad_callback_config_is_one_line_with_the_full_key(tmp_path, capsys, config, expected):
    # GIVEN a bad value inside a callback entry's init_args.config
    path = _config(tmp_path, {})
    _with_callbacks(path, {**config, "save_dir": str(tmp_path / "out")})
    # WHEN the CLI starts THEN one line names the full dotted key, exit 2, nothing trained
    assert _exit_2_line(tmp_path, capsys, ["fit", "--config", str(path)]).startswith(expected)


def test_unknown_group_key_lists_the_allowed_keys_and_a_close_match(tmp_path, capsys):
    path = _config(tmp_path, {"memprofiler": {"collect_func": {"default": ["training_step"]}}})
    line = _exit_2_line(tmp_path, capsys, ["fit", "--config", str(path)])
    assert line.startswith(
        "`memprofiler.collect_func`: unknown key; did you mean `collect_funcs`? "
        "allowed keys here: allocator_history, collect_funcs, cuda_allocator_history,"
    )
    assert line.endswith("schedule, track_fsdp_mem, track_module_mem")


def test_ancestor_key_in_the_group_points_at_the_replacement(tmp_path, capsys):
    path = _config(tmp_path, {"memprofiler": {"saved_tensors_funcs": ["identity_lambda"]}})
    line = _exit_2_line(tmp_path, capsys, ["fit", "--config", str(path)])
    assert line.startswith(
        "`memprofiler.saved_tensors_funcs`: a key of the ancestor's `MemProfilerCfg` that is gone"
    )


def test_yaml_syntax_error_names_the_file_and_line(tmp_path, capsys):
    bad = tmp_path / "profiling.yaml"
    bad.write_text("memprofiler:\n  schedule: {active: 2\n  save_dir: x\n")
    line = _exit_2_line(
        tmp_path, capsys, ["fit", "--config", str(_config(tmp_path, {})), "--config", str(bad)]
    )
    assert line == (
        f"cannot parse config file {str(bad)!r}, line 3, column 11: while parsing a flow mapping "
        "did not find expected ',' or '}'; fix the YAML syntax there"
    )


def test_two_callback_entries_are_refused_before_training(tmp_path, capsys):
    # GIVEN a YAML callback, plus the same class added on the command line
    path = _config(tmp_path, {})
    _with_callbacks(path, {"save_dir": str(tmp_path / "out")})
    args = ["fit", "--config", str(path), "--trainer.callbacks+=memprofiler.MemProfilerCallback"]
    a, b = (
        "`trainer.callbacks[0]` (memprofiler.MemProfilerCallback)",
        "`trainer.callbacks[1]` (memprofiler.MemProfilerCallback)",
    )
    assert _exit_2_line(tmp_path, capsys, args) == _TWO.format(a=a, b=b)


def test_group_plus_callback_entry_is_refused_before_training(tmp_path, capsys):
    path = _config(tmp_path, {"memprofiler": {"schedule": {"active": 2}}})
    _with_callbacks(path, None)
    a, b = (
        "the `memprofiler:` group of `MemProfilerCLI`",
        "`trainer.callbacks[0]` (memprofiler.MemProfilerCallback)",
    )
    assert _exit_2_line(tmp_path, capsys, ["fit", "--config", str(path)]) == _TWO.format(a=a, b=b)


def test_callback_entry_alone_with_the_group_left_at_its_defaults(tmp_path):
    # GIVEN only a callback entry: the `memprofiler:` group is not written, so it adds nothing
    out = tmp_path / "out"
    path = _config(tmp_path, {})
    _with_callbacks(path, {"schedule": {"warmup": 0, "active": 1}, "save_dir": str(out)})
    cli = MemProfilerCLI(
        DemoGPT, trainer_defaults={"accelerator": "cpu"}, args=["fit", "--config", str(path)]
    )
    assert sum(isinstance(cb, MemProfilerCallback) for cb in cli.trainer.callbacks) == 1
    assert list(load_stats(out)) == ["0.training_step.1.start", "0.training_step.1.end"]


class MixinGPT(ProfilerHooksMixin, DemoGPT):
    def __init__(
        self, n_layers: int = 1, d_model: int = 32, num_samples: int = 48, memprofiler_cfg: dict | None = None
    ):
        super().__init__(
            n_layers=n_layers, d_model=d_model, num_samples=num_samples, memprofiler_cfg=memprofiler_cfg
        )


def test_bad_mixin_config_is_one_line_with_the_full_key(tmp_path, capsys):
    path = _config(tmp_path, {})
    raw = yaml.safe_load(path.read_text())
    raw["model"]["memprofiler_cfg"] = {"schedule": {"repeat": -1}}
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(SystemExit) as info:
        MemProfilerCLI(MixinGPT, trainer_defaults={"accelerator": "cpu"}, args=["fit", "--config", str(path)])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "error: `model.memprofiler_cfg.schedule.repeat`: got -1; must be >= 0\n" in err
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_demo_prints_a_memprofiler_command_that_runs(tmp_path):
    import os
    import shlex
    import subprocess

    from demo import memprofiler_command

    # GIVEN the command the demo prints after a run, and a run directory to read
    save = tmp_path / "out"
    path = _config(tmp_path, {"memprofiler": {"schedule": {"warmup": 0, "active": 2}, "save_dir": str(save)}})
    MemProfilerCLI(DemoGPT, trainer_defaults={"accelerator": "cpu"}, args=["fit", "--config", str(path)])
    # WHEN it is run as printed, with `report` on that directory
    src = str(Path(__file__).resolve().parents[2] / "src")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [*shlex.split(memprofiler_command()), "report", str(save), "--no-html"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    # THEN it is the memprofiler command: it summarises the run's two collected calls
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.splitlines()[0] == f"memprofiler run {save}  ranks: 0"
    rows = [line.split("│")[1:4] for line in done.stdout.splitlines() if "│ training_step" in line]
    assert [[cell.strip() for cell in row] for row in rows] == [
        ["0", "training_step", "1"],
        ["0", "training_step", "2"],
    ]


def test_the_old_import_path_warns_and_gives_the_same_class():
    import importlib

    import memprofiler

    sys.modules.pop("memprofiler.cli", None)
    with pytest.warns(
        DeprecationWarning, match=r"`memprofiler\.cli` is deprecated; import `MemProfilerCLI` from"
    ):
        old = importlib.import_module("memprofiler.cli")
    assert old.MemProfilerCLI is MemProfilerCLI is memprofiler.MemProfilerCLI


def test_ancestor_keys_in_the_group_are_read_with_a_deprecation(tmp_path):
    # GIVEN a finetuning-scheduler config's renamed keys in the group, as docs/migration.md
    # promises they still load: `fsdp_mem_track_module_depth` and `collect_funcs.fsdp`
    out = tmp_path / "out"
    group = {
        "schedule": {"warmup": 0, "active": 1},
        "save_dir": str(out),
        "collect_funcs": {"default": ["training_step"], "fsdp": ["training_step"]},
        "track_module_mem": True,
        "fsdp_mem_track_module_depth": 1,
        "fsdp_mem_tracker_units": "KiB",
    }
    path = _config(tmp_path, {"memprofiler": group})
    # WHEN the CLI runs THEN each old key warns once, naming the new one, and is read
    with pytest.warns(FutureWarning) as caught:
        cli = MemProfilerCLI(
            DemoGPT, args=["fit", "--config", str(path)], trainer_defaults={"accelerator": "cpu"}
        )
    messages = [str(w.message) for w in caught if "deprecated" in str(w.message)]
    assert (
        "memprofiler: config key `memprofiler.fsdp_mem_track_module_depth` is deprecated; use "
        "`memprofiler.module_mem_depth`" in messages
    )
    assert (
        "memprofiler: config key `memprofiler.collect_funcs.fsdp` is deprecated; use "
        "`memprofiler.collect_funcs.module_mem`" in messages
    )
    (cb,) = [c for c in cli.trainer.callbacks if isinstance(c, MemProfilerCallback)]
    assert cb.config.module_mem_depth == 1 and cb.config.module_mem_units == "KiB"
    assert cb.config.collect_funcs.module_mem == ["training_step"]
    assert list(load_stats(out)) == ["0.training_step.1.start", "0.training_step.1.end"]


def test_an_ancestor_key_on_the_command_line_is_read_with_a_deprecation(tmp_path):
    out = tmp_path / "out"
    path = _config(tmp_path, {"memprofiler": {"schedule": {"warmup": 0, "active": 1}, "save_dir": str(out)}})
    with pytest.warns(FutureWarning, match=r"`memprofiler.fsdp_mem_tracker_units` is deprecated"):
        cli = MemProfilerCLI(
            DemoGPT,
            args=["fit", "--config", str(path), "--memprofiler.fsdp_mem_tracker_units=KiB"],
            trainer_defaults={"accelerator": "cpu"},
        )
    (cb,) = [c for c in cli.trainer.callbacks if isinstance(c, MemProfilerCallback)]
    assert cb.config.module_mem_units == "KiB"


def test_an_old_and_a_new_key_together_are_one_line(tmp_path, capsys):
    path = _config(tmp_path, {"memprofiler": {"fsdp_mem_tracker_units": "KiB", "module_mem_units": "MiB"}})
    line = _exit_2_line(tmp_path, capsys, ["fit", "--config", str(path)])
    assert line == "`memprofiler.fsdp_mem_tracker_units`: renamed: use `module_mem_units`"


def test_an_unknown_trace_template_field_exits_2_with_one_line_before_training(tmp_path, capsys):
    # GIVEN the shipped profiler config with a file name template using a field that does not exist
    args = [
        "fit",
        "--config",
        str(Path(__file__).resolve().parents[2] / "configs" / "profiler.yaml"),
        "--trainer.profiler.init_args.trace_files",
        '{"filename": "rank{rank}.{step}.pt.trace.json"}',
        f"--trainer.default_root_dir={tmp_path / 'run'}",
    ]
    # WHEN the CLI starts THEN one line names the dotted key, the field and the allowed ones
    line = _exit_2_line(tmp_path, capsys, args)
    assert line == (
        "`trainer.profiler.init_args.trace_files.filename`: unknown field {step} in "
        "'rank{rank}.{step}.pt.trace.json'; allowed: {run_name}, {rank}, {local_rank}, {node_rank}, "
        "{world_size}, {stage}, {epoch}, {batch}, {cycle}"
    )


def test_the_shipped_profiler_config_turns_on_memory_by_category_from_yaml(tmp_path):
    # GIVEN configs/profiler.yaml, whose profile_memory / record_shapes / with_stack are named
    # arguments of ExtendedPyTorchProfiler (LightningCLI cannot pass **kwargs from YAML)
    path = _config(tmp_path, {})
    args = ["fit", "--config", str(path), "--config"]
    args += [str(Path(__file__).resolve().parents[2] / "configs" / "profiler.yaml")]
    args += ["--trainer.limit_train_batches=5", f"--memprofiler.save_dir={tmp_path / 'mem'}"]
    # WHEN the CLI trains
    cli = MemProfilerCLI(DemoGPT, trainer_defaults={"accelerator": "cpu"}, args=args)
    # THEN torch's profiler ran with the three options and the categories file lies beside the trace
    kwargs = cli.trainer.profiler._profiler_kwargs
    assert (kwargs["profile_memory"], kwargs["record_shapes"], kwargs["with_stack"]) == (True, True, True)
    names = sorted(p.name for p in (tmp_path / "mem").glob("fit_rank_0.*"))
    assert names == ["fit_rank_0.1.memory_categories.json", "fit_rank_0.1.pt.trace.json"]


def test_a_profiler_option_that_is_not_a_bool_is_one_line(tmp_path):
    from memprofiler import ExtendedPyTorchProfiler
    from memprofiler.errors import ConfigError

    with pytest.raises(ConfigError, match="`profile_memory`: got 'yes'; expected true or false"):
        ExtendedPyTorchProfiler(profile_memory="yes")  # type: ignore[arg-type]


def test_the_parsers_use_no_deprecated_jsonargparse_call(monkeypatch, capsys):
    # GIVEN jsonargparse's deprecated way to add a dataclass group made to fail (it warns in a
    # user's every run from jsonargparse 4.35, and goes in 5.0)
    import jsonargparse

    def deprecated(*args, **kwargs):
        raise AssertionError("add_dataclass_arguments called")

    monkeypatch.setattr(jsonargparse.ArgumentParser, "add_dataclass_arguments", deprecated)
    # WHEN every subcommand's parser is built (the group, `estimate` and `advise` among them)
    with pytest.raises(SystemExit) as exited:
        MemProfilerCLI(DemoGPT, trainer_defaults={"accelerator": "cpu"}, args=["fit", "--help"])
    # THEN help is printed, with the group's keys
    assert exited.value.code == 0
    assert "--memprofiler.schedule.warmup" in capsys.readouterr().out
