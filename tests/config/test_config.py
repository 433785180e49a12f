"""Config: typed, validated when built, errors name the dotted key and the fix."""

from __future__ import annotations

import pytest
import yaml

from memprofiler import ConfigError, MemProfilerConfig
from memprofiler.config import ScheduleConfig


def test_defaults_follow_the_ancestor_names():
    cfg = MemProfilerConfig()
    assert cfg.enabled and cfg.dump_memorystats_yaml and not cfg.dump_memorystats_pickle
    assert cfg.collect_funcs.default == ["training_step"]
    assert cfg.collect_funcs.funcs_for("cuda") == frozenset({"training_step"})
    assert cfg.retain_hooks_for_funcs == ["training_step"]
    assert cfg.save_hook_attrs[:3] == ["rss_pre_forward", "rss_post_forward", "rss_diff"]


def test_default_names_join_every_collection_type():
    cfg = MemProfilerConfig.from_any({"collect_funcs": {"default": ["a"], "cpu": ["b"], "fsdp": ["c"]}})
    assert cfg.collect_funcs.funcs_for("cpu") == {"a", "b"}
    assert cfg.collect_funcs.funcs_for("fsdp") == {"a", "c"}
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
        ({"enabeld": True}, "`enabeld`: unknown key; allowed keys here: allocator_history, collect_funcs"),
        (
            {"schedule": {"activ": 1}},
            "`schedule.activ`: unknown key; allowed keys here: active, follow_profiler, max_iter",
        ),
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
