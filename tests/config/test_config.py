"""Config: typed, validated when built, errors name the dotted key and the fix."""

from __future__ import annotations

import pytest
import yaml

from memprofiler import ConfigError, MemProfilerConfig
from memprofiler.config import ScheduleConfig


def test_a_config_nested_too_deep_is_one_line(tmp_path):
    # GIVEN a config file nested 60,000 levels deep (the YAML loader recurses once per level)
    path = tmp_path / "deep.yaml"
    path.write_text("schedule: " + "[" * 60_000 + "]" * 60_000 + "\n")
    # THEN a ConfigError naming the file, not a RecursionError traceback
    with pytest.raises(ConfigError, match=r"cannot parse config YAML in .*deep\.yaml.*: nested too deep"):
        MemProfilerConfig.from_any(path)


def test_defaults_follow_the_ancestor_names():
    cfg = MemProfilerConfig()
    assert cfg.enabled and cfg.dump_memorystats_yaml and not cfg.dump_memorystats_pickle
    assert cfg.collect_funcs.default == ["training_step"]
    assert cfg.collect_funcs.funcs_for("cuda") == frozenset({"training_step"})
    assert cfg.retain_hooks_for_funcs == ["training_step"]
    assert cfg.save_hook_attrs[:3] == ["rss_pre_forward", "rss_post_forward", "rss_diff"]


def test_default_names_join_every_collection_type():
    cfg = MemProfilerConfig.from_any({"collect_funcs": {"default": ["a"], "cpu": ["b"], "module_mem": ["c"]}})
    assert cfg.collect_funcs.funcs_for("cpu") == {"a", "b"}
    assert cfg.collect_funcs.funcs_for("module_mem") == {"a", "c"}
    assert cfg.collect_funcs.funcs_for("cuda") == {"a"}
    assert cfg.collect_funcs.all_funcs() == {"a", "b", "c"}


def test_from_dict_yaml_text_and_file(tmp_path):
    data = {"schedule": {"warmup": 0, "active": 3}, "save_dir": "out"}
    path = tmp_path / "mp.yaml"
    path.write_text(yaml.safe_dump(data))
    for source in (data, yaml.safe_dump(data), path, str(path)):
        cfg = MemProfilerConfig.from_any(source)
        assert cfg.schedule == ScheduleConfig(warmup=0, active=3)
        assert cfg.save_dir == "out"


def test_direct_construction_accepts_nested_mappings():
    cfg = MemProfilerConfig(schedule={"active": 2})  # type: ignore[arg-type]
    assert isinstance(cfg.schedule, ScheduleConfig) and cfg.schedule.active == 2


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            {"enabeld": True},
            "`enabeld`: unknown key; did you mean `enabled`? allowed keys here: allocator_history, collect_funcs",
        ),
        (
            {"schedule": {"activ": 1}},
            "`schedule.activ`: unknown key; did you mean `active`? allowed keys here: active, "
            "follow_profiler, max_iter",
        ),
        ({"zzz": 1}, "`zzz`: unknown key; allowed keys here: allocator_history,"),
        ({"schedule": {"active": 0}}, "`schedule.active`: got 0; must be >= 1"),
        ({"schedule": {"wait": "1"}}, "`schedule.wait`: got '1'; expected an integer"),
        ({"enabled": "yes"}, "`enabled`: got 'yes'; expected true or false"),
        (
            {"collect_funcs": {"cpu": "validation_step"}},
            "`collect_funcs.cpu`: got 'validation_step'; expected a list",
        ),
        ({"rss_peak_method": "guess"}, "`rss_peak_method`: got 'guess'; allowed: auto, clear_refs, sampler"),
        (
            {"memory_hooks": {"pre_forward_hooks": ["no.such.module.hook"]}},
            "`memory_hooks.pre_forward_hooks[0]`: cannot import 'no.such.module.hook'",
        ),
        (
            {"schedule": {"warmup_iters": 2, "max_iter": 1}},
            "`schedule.max_iter`: got 1; must be greater than",
        ),
    ],
)
def test_errors_name_the_dotted_key(data, message):
    with pytest.raises(ConfigError) as info:
        MemProfilerConfig.from_any(data)
    assert str(info.value).startswith(message)
    assert "\n" not in str(info.value)


def test_not_a_mapping():
    with pytest.raises(ConfigError, match="expected a mapping of MemProfilerConfig fields"):
        MemProfilerConfig.from_any("- just\n- a list\n")


def test_hooks_given_as_dotted_paths_resolve():
    cfg = MemProfilerConfig.from_any(
        {"memory_hooks": {"pre_forward_hooks": ["memprofiler.collectors.module_hooks.rss_pre_forward"]}}
    )
    from memprofiler.collectors.module_hooks import rss_pre_forward

    assert cfg.memory_hooks.resolved("pre_forward_hooks") == [rss_pre_forward]


def test_to_dict_round_trips_through_yaml():
    cfg = MemProfilerConfig.from_any({"schedule": {"warmup": 2}})
    again = MemProfilerConfig.from_any(yaml.safe_load(yaml.safe_dump(cfg.to_dict())))
    assert again == cfg


def test_unknown_key_of_the_callback_dict_names_the_key_and_a_close_match():
    # GIVEN a typo one level down, as a callback's dict config would carry it
    from memprofiler.lightning.callback import MemProfilerCallback

    # WHEN the callback is built THEN one line names the dotted key, the guess and the choices
    with pytest.raises(ConfigError) as info:
        MemProfilerCallback({"collect_funcs": {"defualt": ["training_step"]}})
    assert str(info.value) == (
        "`collect_funcs.defualt`: unknown key; did you mean `default`? "
        "allowed keys here: cpu, cuda, cuda_allocator_history, default, module_mem"
    )


@pytest.mark.parametrize(
    ("data", "old", "new"),
    [
        ({"collect_funcs": {"fsdp": ["c"]}}, "collect_funcs.fsdp", "collect_funcs.module_mem"),
        ({"fsdp_mem_track_module_depth": 3}, "fsdp_mem_track_module_depth", "module_mem_depth"),
        ({"fsdp_mem_tracker_units": "KiB"}, "fsdp_mem_tracker_units", "module_mem_units"),
        ({"fsdp_mem_tracker_tabulate": True}, "fsdp_mem_tracker_tabulate", "module_mem_tabulate"),
    ],
)
def test_the_module_wise_trackers_old_key_names_are_read_with_one_warning(data, old, new):
    # GIVEN a config written with a key named before the module-wise tracker's keys were renamed
    # WHEN it is read THEN one line names the old key and the new one, and the value is kept
    with pytest.warns(FutureWarning) as caught:
        cfg = MemProfilerConfig.from_any(data)
    assert [str(w.message) for w in caught] == [f"memprofiler: config key `{old}` is deprecated; use `{new}`"]
    assert cfg == MemProfilerConfig.from_any(
        {"collect_funcs": {"module_mem": ["c"]}}
        if "collect_funcs" in data
        else {new: next(iter(data.values()))}
    )


def test_an_old_key_beside_its_new_name_is_refused():
    with pytest.raises(ConfigError) as info:
        MemProfilerConfig.from_any({"fsdp_mem_tracker_units": "KiB", "module_mem_units": "B"})
    assert str(info.value) == (
        "`fsdp_mem_tracker_units`: renamed to `module_mem_units`, which is given too; keep only `module_mem_units`"
    )


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            {"saved_tensors_funcs": ["fts_examples.profiling.npp_hooks._npp_hook", "identity_lambda"]},
            "`saved_tensors_funcs`: a key of the ancestor's `MemProfilerCfg` that is gone: memprofiler "
            "counts saved tensors itself (`saved_tensors.*` keys) and takes no pack/unpack functions; "
            "drop the key and keep `enable_saved_tensors_hooks: true`",
        ),
        (
            {"enabled_funcs": {"cpu": ["training_step"]}},
            "`enabled_funcs`: a key of the ancestor's `MemProfilerCfg`, renamed: use `collect_funcs`",
        ),
        (
            {"schedule": {"max_step": 3}},
            "`schedule.max_step`: a key of the ancestor's `MemProfilerCfg`, renamed: use `max_iter`",
        ),
    ],
)
def test_ancestor_keys_point_at_their_replacement(data, message):
    with pytest.raises(ConfigError) as info:
        MemProfilerConfig.from_any(data)
    assert str(info.value) == message


_STATE = "with a `memprofiler.collectors.module_hooks.HookState`"


@pytest.mark.parametrize(
    ("field", "hook", "message"),
    [
        (
            "pre_forward_hooks",
            "pre_forward",
            "`memory_hooks.pre_forward_hooks[0]`: `ancestor_hooks.pre_forward(module, *args, **kwargs)` "
            "looks like a finetuning-scheduler hook (module first): memprofiler calls it as "
            f"`hook(state, module, args)` {_STATE} as the first argument; see docs/migration.md",
        ),
        (
            "post_forward_hooks",
            "post_forward",
            "`memory_hooks.post_forward_hooks[0]`: `ancestor_hooks.post_forward(module, *args, **kwargs)` "
            "looks like a finetuning-scheduler hook (module first): memprofiler calls it as "
            f"`hook(state, module, args, output)` {_STATE} as the first argument; see docs/migration.md",
        ),
        (
            "reset_state_hooks",
            "reset_state",
            "`memory_hooks.reset_state_hooks[0]`: `ancestor_hooks.reset_state(model, reset_attrs)` "
            f"does not fit: memprofiler calls it as `hook(state)` {_STATE}",
        ),
        (
            "pre_forward_hooks",
            "pre_two_args",
            "`memory_hooks.pre_forward_hooks[0]`: `ancestor_hooks.pre_two_args(state, module)` "
            f"does not fit: memprofiler calls it as `hook(state, module, args)` {_STATE}",
        ),
    ],
)
def test_hook_signatures_are_checked_when_the_config_is_built(field, hook, message):
    # GIVEN the ancestor's hooks (module first) or one missing an argument
    data = {"enable_memory_hooks": True, "memory_hooks": {field: [f"ancestor_hooks.{hook}"]}}
    # WHEN the config is built THEN one line names the key, the signature and the expected call
    with pytest.raises(ConfigError) as info:
        MemProfilerConfig.from_any(data)
    assert str(info.value) == message


def test_hooks_of_the_documented_shape_pass_the_signature_check():
    def pre(state, module, args): ...
    def post(state, module, args, output=None, *extra): ...
    def reset(state): ...

    cfg = MemProfilerConfig.from_any(
        {
            "memory_hooks": {
                "pre_forward_hooks": [pre],
                "post_forward_hooks": [post],
                "reset_state_hooks": [reset],
            }
        }
    )
    assert cfg.memory_hooks.resolved("post_forward_hooks") == [post]
