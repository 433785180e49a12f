"""MemProfilerCLI under the mistakes of real clusters: one line, exit code 2, nothing trained."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

from _cli_config import write_cli_config
from memprofiler.lightning.cli import MemProfilerCLI

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from demo import DemoGPT


def _config(tmp_path: Path, extra: dict, trainer: dict | None = None) -> Path:
    return write_cli_config(tmp_path, extra, {"limit_train_batches": 2, **(trainer or {})})


def _callback(config: dict) -> dict:
    return {"callbacks": [{"class_path": "memprofiler.MemProfilerCallback", "init_args": {"config": config}}]}


def _exit_2_line(capsys, args: list[str]) -> str:
    """Run the CLI; assert exit code 2 and return stderr's one error line (no traceback)."""
    with pytest.raises(SystemExit) as info:
        MemProfilerCLI(DemoGPT, trainer_defaults={"accelerator": "cpu"}, args=args)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, err
    return lines[0].removeprefix("error: ")


@pytest.mark.parametrize(
    ("save_dir", "expected"),
    [
        (
            "s3:/bucket/run",
            "'s3:/bucket/run' is not a valid s3 URL (it would be a local folder named 's3:'); "
            "write 's3://bucket/run'",
        ),
        ("s3:", "'s3:' names no location; write 's3://BUCKET/PATH'"),
        ("s3:///x", "'s3:///x' names no bucket (nothing between 's3://' and '/'); write 's3://BUCKET/x'"),
        (
            "s3://My_Bucket/run",
            "bucket 'My_Bucket' in 's3://My_Bucket/run' cannot exist (S3 bucket names are",
        ),
    ],
)
@pytest.mark.parametrize("where", ["group", "callback"])
def test_an_almost_right_url_exits_2_before_training(
    tmp_path, capsys, monkeypatch, save_dir, expected, where
):
    # GIVEN a save_dir that is almost an S3 URL, in the group or in a callback entry
    monkeypatch.chdir(tmp_path)
    if where == "group":
        path, key = _config(tmp_path, {"memprofiler": {"save_dir": save_dir}}), "memprofiler.save_dir"
    else:
        path = _config(tmp_path, {}, _callback({"save_dir": save_dir}))
        key = "trainer.callbacks[0].init_args.config.save_dir"
    # WHEN the CLI starts
    line = _exit_2_line(capsys, ["fit", "--config", str(path)])
    # THEN one line names the key and the fix, and no local folder named `s3:` appears
    assert line.startswith(f"`{key}`: {expected}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml"]


def test_a_callback_save_dir_in_a_missing_bucket_exits_2_before_training(tmp_path, capsys, s3_server):
    # GIVEN a callback entry (not the group) whose save_dir is in a bucket that does not exist
    path = _config(tmp_path, {}, _callback({"save_dir": "s3://no-such-bucket-cb/run"}))
    # WHEN the CLI starts THEN one line names the entry's key; nothing trains
    line = _exit_2_line(capsys, ["fit", "--config", str(path)])
    assert line.startswith(
        "`trainer.callbacks[0].init_args.config.save_dir` 's3://no-such-bucket-cb/run' is not writable"
    )
    assert not (tmp_path / "run").exists()


def test_a_remote_default_root_dir_in_a_missing_bucket_exits_2_before_training(tmp_path, capsys, s3_server):
    # GIVEN no save_dir and a default_root_dir in a bucket that does not exist
    trainer = {"default_root_dir": "s3://no-such-root/logs", **_callback({"schedule": {"active": 1}})}
    path = _config(tmp_path, {}, trainer)
    # WHEN the CLI starts THEN one line names `trainer.default_root_dir`
    line = _exit_2_line(capsys, ["fit", "--config", str(path)])
    assert line.startswith("`trainer.default_root_dir` 's3://no-such-root/logs' is not writable")


def test_a_memory_store_save_dir_is_refused_before_training(tmp_path, capsys):
    # GIVEN save_dir in fsspec's in-process memory store, under the CLI (whose process ends)
    path = _config(tmp_path, {"memprofiler": {"save_dir": "memory://runs/a"}})
    # WHEN the CLI starts THEN it refuses, saying why and what to use
    line = _exit_2_line(capsys, ["fit", "--config", str(path)])
    assert line == (
        "`memprofiler.save_dir`: 'memory://runs/a' is fsspec's in-process memory store: whatever is "
        "written there is gone when the CLI's process ends with the run; give a local directory or an "
        "object store (s3://, gs://, abfs://)"
    )
    assert not (tmp_path / "run").exists()


def test_a_missing_fsdp_root_module_is_one_line_exit_2(tmp_path, capsys):
    # GIVEN a callback entry tracking FSDP memory of a submodule the model does not have
    config = {
        "track_fsdp_mem": True,
        "fsdp_mem_tracker_root_module": "nope.x",
        "collect_funcs": {"module_mem": ["training_step"]},
        "save_dir": str(tmp_path / "out"),
    }
    path = _config(tmp_path, {}, _callback(config))
    # WHEN the CLI runs THEN one line names the key and the fix, exit code 2, no traceback
    line = _exit_2_line(capsys, ["fit", "--config", str(path)])
    assert line.startswith("`fsdp_mem_tracker_root_module`: 'nope.x' is not a submodule of DemoGPT")


@pytest.mark.parametrize("subcommand", ["fit", "estimate"])
def test_a_finetuning_scheduler_block_points_to_the_group_and_the_migration_table(
    tmp_path, capsys, subcommand
):
    # GIVEN a finetuning-scheduler config used as it is: a top-level `memprofiler_cfg:` block
    path = _config(tmp_path, {"memprofiler_cfg": {"enabled": True, "save_dir": str(tmp_path / "out")}})
    # WHEN fit or estimate starts THEN one line says where the block belongs and where the table is
    line = _exit_2_line(capsys, [subcommand, "--config", str(path)])
    assert line == (
        "`memprofiler_cfg` is finetuning-scheduler's block: under MemProfilerCLI its keys belong under "
        "`memprofiler:`; rename the block to `memprofiler:` and any renamed key as the migration table "
        "in docs/migration.md lists"
    )


def test_a_finetuning_scheduler_block_under_the_model_points_to_the_group(tmp_path, capsys):
    path = _config(tmp_path, {})
    raw = yaml.safe_load(path.read_text())
    raw["model"]["memprofiler_cfg"] = {"enabled": True}
    path.write_text(yaml.safe_dump(raw))
    line = _exit_2_line(capsys, ["fit", "--config", str(path)])
    assert line.startswith("`model.memprofiler_cfg`: the model takes no `memprofiler_cfg`; move the block")
    assert line.endswith("see the migration table in docs/migration.md")


def test_a_precision_typo_lists_the_allowed_values(tmp_path, capsys):
    # GIVEN a precision typo
    path = _config(tmp_path, {}, {"precision": "bf16-mix"})
    # WHEN the CLI starts THEN one line lists the values Lightning allows and the closest one
    line = _exit_2_line(capsys, ["fit", "--config", str(path)])
    assert line == (
        "`trainer.precision`: got 'bf16-mix'; allowed: 64, 32, 16, transformer-engine, "
        "transformer-engine-float16, 16-true, 16-mixed, bf16-true, bf16-mixed, 32-true, 64-true, bf16, "
        "null; did you mean 'bf16-mixed'?"
    )


def _only_line(capsys, args: list[str], model: type | None = DemoGPT) -> str:
    """Run the CLI: exit code 2 and one line on stderr, no usage or tip before it."""
    with pytest.raises(SystemExit) as info:
        if model is None:  # as `python -m memprofiler.lightning`: the model from its class_path
            MemProfilerCLI(trainer_defaults={"accelerator": "cpu"}, args=args)
        else:
            MemProfilerCLI(model, trainer_defaults={"accelerator": "cpu"}, args=args)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "usage:" not in err and "tip:" not in err and "Traceback" not in err, err
    (line,) = [ln for ln in err.splitlines() if ln.startswith("error: ")]
    assert len(err.strip().splitlines()) <= 3, err  # at most Lightning's seed lines besides
    return line.removeprefix("error: ")


def test_a_misspelt_model_class_path_is_one_line_without_the_usage(capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "examples"))
    line = _only_line(capsys, ["fit", "--model.class_path=demo.DemoGTP"], model=None)
    assert line == (
        "`model.class_path`: cannot use 'demo.DemoGTP' (module 'demo' has no attribute 'DemoGTP'); "
        "give the full import path of the class, e.g. `mypackage.models.MyModel`"
    )


def test_an_unknown_gpu_for_the_estimate_is_one_line_without_the_usage(capsys):
    line = _only_line(capsys, ["estimate", "--estimate.gpu=H900"])
    assert line.startswith("`gpu`: got 'H900'; use one of V100")


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            ["fit", "--memprofiler.schedule.warmup=one"],
            "`memprofiler.schedule.warmup`: expected int, got 'one'",
        ),
        (["fit", "--trainer.max_epochs=x"], "`trainer.max_epochs`: got 'x'; expected int or null"),
        (["fit", "--nonsense"], "unrecognized arguments: --nonsense"),
    ],
)
def test_a_wrong_type_is_one_line_without_the_usage(capsys, args, expected):
    assert _only_line(capsys, args) == expected


def test_a_wrong_type_in_the_group_of_a_config_file_is_one_line(tmp_path, capsys):
    config = _config(tmp_path, {"memprofiler": {"schedule": {"warmup": "one"}}})
    line = _only_line(capsys, ["fit", "--config", str(config)])
    assert "memprofiler.schedule.warmup" in line and "'one'" in line
