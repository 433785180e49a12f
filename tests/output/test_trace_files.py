"""TraceFiles: names from templates, gzip, retention of whole cycles locally and on a real S3 store."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from memprofiler.config.trace_files import TraceFilesConfig
from memprofiler.errors import ConfigError
from memprofiler.output.mirror import RemoteMirror
from memprofiler.output.remote import RemoteDir
from memprofiler.output.trace_files import TRACE, TraceFiles, template_regex

FIELDS = {"run_name": "demo", "rank": 1, "local_rank": 1, "node_rank": 0, "world_size": 2, "stage": "fit"}


def _files(root: Path, mirror: RemoteMirror | None = None, **cfg: object) -> TraceFiles:
    return TraceFiles(TraceFilesConfig(**cfg), root, FIELDS, mirror=mirror)  # type: ignore[arg-type]


def test_names_follow_folder_and_filename_templates(tmp_path):
    # GIVEN Composer-style templates
    files = _files(
        tmp_path, folder="{run_name}/traces", filename="ep{epoch}-ba{batch}-rank{rank}.pt.trace.json"
    )
    cycle = files.cycle(3, epoch=1, batch=42)
    # WHEN asked where the trace and a companion go THEN both are filled in, the companion beside it
    assert files.path_for(TRACE, cycle) == tmp_path / "demo/traces/ep1-ba42-rank1.pt.trace.json"
    assert files.path_for("memory", cycle) == tmp_path / "demo/traces/ep1-ba42-rank1.memory.json"


def test_unknown_field_fails_with_one_line_naming_it_and_the_allowed_ones():
    with pytest.raises(ConfigError) as err:
        TraceFilesConfig(filename="rank{rank}.{step}.pt.trace.json")
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("`filename`: unknown field {step}")
    assert "allowed: {run_name}, {rank}, {local_rank}, {node_rank}, {world_size}, {stage}, {epoch}" in message
    # the folder is fixed for the run: per-cycle fields are refused there
    with pytest.raises(ConfigError, match=r"`folder`: unknown field \{batch\}"):
        TraceFilesConfig(folder="t/{batch}")
    with pytest.raises(ConfigError, match="num_traces_to_keep"):
        TraceFilesConfig(num_traces_to_keep=0)


def test_gzip_names_and_content(tmp_path):
    # GIVEN use_gzip
    files = _files(tmp_path, use_gzip=True)
    cycle = files.cycle(1, epoch=0, batch=3)
    # WHEN a trace and a companion are written
    trace = files.write_bytes(TRACE, cycle, json.dumps({"traceEvents": [1]}).encode())
    extra = files.write_bytes("memory", cycle, b'{"a": 2}')
    # THEN both end in .gz and are gzip holding the JSON given
    assert trace.name == "fit_rank_1.1.pt.trace.json.gz"
    assert extra.name == "fit_rank_1.1.memory.json.gz"
    assert json.loads(gzip.decompress(trace.read_bytes())) == {"traceEvents": [1]}
    assert json.loads(gzip.decompress(extra.read_bytes())) == {"a": 2}


def test_retention_keeps_the_newest_cycles_with_their_companions(tmp_path):
    # GIVEN keep 2
    files = _files(tmp_path, num_traces_to_keep=2)
    # WHEN 5 cycles are written, each a trace plus a companion written by someone else
    for n in range(1, 6):
        cycle = files.cycle(n, epoch=0, batch=n)
        files.write_bytes(TRACE, cycle, b"{}")
        other = files.path_for("memory", cycle)
        other.write_text("{}")
        files.written(cycle, [other])
    # THEN exactly cycles 4 and 5 remain, both files each
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "fit_rank_1.4.memory.json",
        "fit_rank_1.4.pt.trace.json",
        "fit_rank_1.5.memory.json",
        "fit_rank_1.5.pt.trace.json",
    ]
    assert sorted(files.cycles()) == [4, 5]


def test_overwrite_false_refuses_a_folder_with_earlier_traces(tmp_path):
    (tmp_path / "fit_rank_1.1.pt.trace.json").write_text("{}")
    (tmp_path / "notes.txt").write_text("")
    with pytest.raises(ConfigError, match=r"already holds 'fit_rank_1.1.pt.trace.json'.*overwrite: true"):
        _files(tmp_path).check_overwrite()
    _files(tmp_path, overwrite=True).check_overwrite()  # allowed
    _files(tmp_path / "other").check_overwrite()  # a fresh folder is fine


def test_template_regex_matches_what_the_template_makes():
    pattern = template_regex("ep{epoch}-rank{rank}.pt.trace.json.gz")
    assert pattern.match("ep1-rank0.pt.trace.json.gz")
    assert not pattern.match("ep1-rank0.pt.trace.json")


def test_retention_deletes_old_cycles_from_a_real_s3_store(tmp_path, s3_bucket):
    # GIVEN a staging directory mirrored to a bucket, gzip, keep 2
    remote = RemoteDir.from_url(f"{s3_bucket}/run")
    mirror = RemoteMirror(tmp_path, remote, warn=lambda m: pytest.fail(m), min_interval_s=0.0)
    files = _files(tmp_path, mirror=mirror, folder="traces", use_gzip=True, num_traces_to_keep=2)
    # WHEN 6 cycles are written, each uploaded before the next
    for n in range(1, 7):
        files.write_bytes(TRACE, files.cycle(n, epoch=0, batch=n), json.dumps({"cycle": n}).encode())
        assert mirror.sync(wait=True)
    assert files.finish()
    # THEN the store holds exactly the last two cycles, each a gzip Python's json reads
    names = sorted(remote.child("traces").names())
    assert names == ["fit_rank_1.5.pt.trace.json.gz", "fit_rank_1.6.pt.trace.json.gz"]
    for name, n in zip(names, (5, 6), strict=True):
        data = remote.fs.cat_file(remote.child("traces").path(name))
        assert json.loads(gzip.decompress(data)) == {"cycle": n}
    assert sorted(p.name for p in (tmp_path / "traces").iterdir()) == names


def test_names_without_a_rank_are_refused_in_a_multi_rank_run(tmp_path):
    files = TraceFiles(TraceFilesConfig(filename="ba{batch}.pt.trace.json"), tmp_path, FIELDS)
    with pytest.raises(
        ConfigError, match=r"`trace_files.filename`: .* the 2 ranks would write the same files"
    ):
        files.check_unique_per_rank()
    TraceFiles(
        TraceFilesConfig(folder="r{rank}", filename="b.pt.trace.json"), tmp_path, FIELDS
    ).check_unique_per_rank()
    TraceFiles(
        TraceFilesConfig(filename="ba{batch}.pt.trace.json"), tmp_path, {**FIELDS, "world_size": 1}
    ).check_unique_per_rank()


@pytest.mark.parametrize("name", ["trace.json", "ba{batch}.json.gz", "{rank}.pt.trace"])
def test_a_name_the_readers_would_not_find_is_refused(name):
    # GIVEN a file name template without the ending report/merge-traces/retention look for
    # WHEN the config is built THEN one line names the key and the ending to use
    with pytest.raises(ConfigError, match=r"`filename`: got .*; end it in '\.pt\.trace\.json'"):
        TraceFilesConfig(filename=name)
    TraceFilesConfig(filename=name.split(".")[0] + ".pt.trace.json.gz")  # with it, accepted


def test_retention_never_deletes_the_path_the_current_cycle_just_wrote(tmp_path):
    # GIVEN a name without {cycle} built past the config's check (as a subclass or an older
    # config could), keep 1: every cycle writes the same path
    cfg = TraceFilesConfig(filename="latest.pt.trace.json")
    cfg.num_traces_to_keep = 1
    files = TraceFiles(cfg, tmp_path, FIELDS)
    # WHEN three cycles are written
    for n in range(1, 4):
        files.write_bytes(TRACE, files.cycle(n, epoch=0, batch=n), json.dumps({"cycle": n}).encode())
    # THEN the newest trace is still there (retiring cycle 2 skipped the path cycle 3 wrote)
    assert json.loads((tmp_path / "latest.pt.trace.json").read_text()) == {"cycle": 3}


def test_retention_never_deletes_a_file_it_did_not_write(tmp_path):
    # GIVEN keep 1 and cycle 1's file replaced by someone else (another run, a user's copy)
    files = _files(tmp_path, num_traces_to_keep=1)
    first = files.write_bytes(TRACE, files.cycle(1, epoch=0, batch=1), b'{"a": 1}')
    first.unlink()
    first.write_text('{"theirs": true, "longer": 1}')
    # WHEN cycle 2 retires cycle 1
    files.write_bytes(TRACE, files.cycle(2, epoch=0, batch=2), b"{}")
    # THEN the replaced file stays; retention forgot it
    assert json.loads(first.read_text()) == {"theirs": True, "longer": 1}
    assert sorted(files.cycles()) == [2]


def test_a_name_that_cannot_tell_cycles_apart_is_refused_with_retention():
    # GIVEN a natural `latest.pt.trace.json` with num_traces_to_keep: 1
    with pytest.raises(ConfigError) as err:
        TraceFilesConfig(filename="latest.pt.trace.json", num_traces_to_keep=1)
    # THEN one line names the key and the fix
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("`filename`: 'latest.pt.trace.json' names no {cycle} or {batch}")
    assert "add {cycle}" in message
    TraceFilesConfig(filename="latest.pt.trace.json")  # keep all: rewriting one file is allowed
    TraceFilesConfig(filename="b{batch}.pt.trace.json", num_traces_to_keep=1)


@pytest.mark.parametrize(
    ("cfg", "match"),
    [
        ({"folder": "../out"}, r"`folder`: got '\.\./out'; '\.\.' would put traces outside"),
        ({"folder": "a/../../b"}, r"`folder`: .*'\.\.'"),
        ({"filename": "../x.{cycle}.pt.trace.json"}, r"`filename`: .* without '/'"),
        ({"run_name": ".."}, r"`run_name`: got '\.\.'; give a plain name"),
        ({"run_name": "a/../../b"}, r"`run_name`"),
        (
            {"filename": "{rank:>100000000}.{cycle}.pt.trace.json"},
            r"`filename`: \{rank:>100000000\} .*width <= 20",
        ),
        ({"filename": "{rank!r}.{cycle}.pt.trace.json"}, r"`filename`: \{rank!r\}"),
        ({"filename": "{rank:{cycle}}.pt.trace.json"}, r"`filename`: \{rank:\{cycle\}\}"),
        ({"filename": "a\0{cycle}.pt.trace.json"}, r"`filename`: .* NUL"),
    ],
)
def test_templates_leaving_the_directory_or_no_file_name_are_refused_in_one_line(cfg, match):
    with pytest.raises(ConfigError, match=match) as err:
        TraceFilesConfig(**cfg)
    assert "\n" not in str(err.value)


def test_ordinary_format_specs_stay_allowed(tmp_path):
    files = _files(tmp_path, filename="{stage:_<6}r{rank:03}.b{batch:06d}.{cycle:x}.pt.trace.json")
    files.check_paths()
    assert (
        files.path_for(TRACE, files.cycle(11, epoch=0, batch=42)).name == "fit___r001.b000042.b.pt.trace.json"
    )


def test_expanded_names_are_checked_before_training(tmp_path):
    # a 300-character name: refused before training, naming the key and the length limit
    files = _files(tmp_path, filename="x" * 300 + ".{cycle}.pt.trace.json")
    with pytest.raises(
        ConfigError, match=r"`trace_files.filename`: .* bytes long, over the filesystem's 255"
    ):
        files.check_paths()
    # a companion name over the limit although the trace name fits
    files = _files(tmp_path, filename="x" * 225 + ".{cycle}.pt.trace.json")
    files.check_paths()
    with pytest.raises(ConfigError, match="over the filesystem's"):
        files.check_paths(kinds=[("memory_categories", ".json")])
    # a run name from the logger with a separator, used in the file name
    odd = {**FIELDS, "run_name": "team/exp"}
    with pytest.raises(ConfigError, match=r"`trace_files.run_name`: .* path separator"):
        TraceFiles(TraceFilesConfig(filename="{run_name}.{cycle}.pt.trace.json"), tmp_path, odd).check_paths()
    # ... and with '..' in the folder
    odd = {**FIELDS, "run_name": ".."}
    with pytest.raises(ConfigError, match=r"`trace_files.run_name`: .*'\.\.' leaves the output directory"):
        TraceFiles(TraceFilesConfig(folder="{run_name}/t"), tmp_path, odd).check_paths()


def test_a_symlinked_folder_leading_out_of_the_run_directory_is_refused(tmp_path):
    run, outside = tmp_path / "run", tmp_path / "elsewhere"
    run.mkdir()
    outside.mkdir()
    (run / "traces").symlink_to(outside, target_is_directory=True)
    files = _files(run, folder="traces")
    with pytest.raises(ConfigError, match=r"`trace_files.folder`: .* resolves to .*elsewhere, outside"):
        files.check_paths()
    # a symlink made after the check: the write refuses (the profiler warns, training goes on)
    files = _files(run, folder="later")
    files.check_paths()
    (run / "later").symlink_to(outside, target_is_directory=True)
    with pytest.raises(ValueError, match="outside"):
        files.write_bytes(TRACE, files.cycle(1, epoch=0, batch=1), b"{}")
    assert list(outside.iterdir()) == []
