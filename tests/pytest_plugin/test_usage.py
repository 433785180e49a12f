"""Usage: typos are usage errors naming the marker; unmarked runs load no torch; the entry point."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from memprofiler.errors import ConfigError
from memprofiler.pytest_plugin.markers import parse_budget, parse_leak

pytest_plugins = ["pytester", "_pytester"]

ROOT = Path(__file__).resolve().parents[2]
UNITS = "expected a number with an optional unit (B, KiB, MiB, GiB, TiB, KB, MB, GB, TB), e.g. 2GiB or 300MiB"


@pytest.mark.parametrize(
    ("marker", "message"),
    [
        (
            'memory_budget(saved_tensor="1MiB")',
            "ERROR: test_typo.py::test_a: `memory_budget(saved_tensor='1MiB')`: unknown metric 'saved_tensor'; "
            "use rss_peak, saved_tensors, cuda_peak, or a name `memprofiler check --max` takes: *",
        ),
        (
            'memory_budget(rss_peak="1 GiBs")',
            f"ERROR: test_typo.py::test_a: `memory_budget(rss_peak='1 GiBs')`: got '1 GiBs'; {UNITS}",
        ),
        (
            'memory_budget("allocated_bytes.all.peek=2GiB")',
            "ERROR: test_typo.py::test_a: `memory_budget('allocated_bytes.all.peek=2GiB')`: unknown metric "
            "'allocated_bytes.all.peek'; *",
        ),
        (
            'memory_leak(cuda_bytes="1MiB")',
            "ERROR: test_typo.py::test_a: `memory_leak(cuda_bytes=...)`: unknown keyword 'cuda_bytes'; "
            "use cuda= and/or saved_tensors=",
        ),
        (
            'memory_budjet(rss_peak="1GiB")',
            "ERROR: test_typo.py::test_a: `@pytest.mark.memory_budjet` is not a memprofiler marker: "
            "did you mean `memory_budget`? (as written, nothing is measured or checked)",
        ),
        (
            "memory_leaks()",
            "ERROR: test_typo.py::test_a: `@pytest.mark.memory_leaks` is not a memprofiler marker: "
            "did you mean `memory_leak`? *",
        ),
        (
            "memory_budget()",
            "ERROR: test_typo.py::test_a: `memory_budget`: no budget given; "
            "e.g. @pytest.mark.memory_budget(rss_peak='1GiB')",
        ),
    ],
)
def test_a_typo_is_a_usage_error_naming_the_marker(inner, marker, message):
    # GIVEN a marker with a typo
    inner.write("test_typo", f"@pytest.mark.{marker}\ndef test_a():\n    pass\n", model=False)
    # WHEN the suite runs
    result = inner.run()
    # THEN nothing runs and one line names the test, the marker and the fix
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])


def test_a_misspelt_marker_is_said_first_and_alone(inner):
    # GIVEN the only marked test's marker misspelt, and a directory for the figures
    inner.write(
        "test_typo", '@pytest.mark.memory_budjet(rss_peak="1GiB")\ndef test_a():\n    pass\n', model=False
    )
    result = inner.run("--memprofiler-dir", "out")
    # THEN the misspelling is the error, not "nothing written ... no test is marked"
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["ERROR: test_typo.py::test_a: `@pytest.mark.memory_budjet` is not a memprofiler*"]
    )
    assert "nothing written" not in result.stdout.str()


def test_a_registered_marker_that_reads_like_ours_is_left_alone(inner):
    inner.write(
        "test_own",
        "@pytest.mark.memory_usage\ndef test_a():\n    pass\n",
        model=False,
    )
    inner.pytester.makeini("[pytest]\nmarkers =\n    memory_usage: our own\n")
    inner.run().assert_outcomes(passed=1)


def test_aliases_and_check_names_parse_to_the_check_limits():
    # GIVEN the three short names and one `--max` string
    budgets = parse_budget(
        ("reserved_bytes.all.peak=1.5GB",),
        {"rss_peak": "1GiB", "saved_tensors": 300 * 2**20, "cuda_peak": "2G"},
    )
    # THEN they are the metric names and byte values `memprofiler check` uses
    assert [(b.limit.metric, b.limit.value, b.cuda) for b in budgets] == [
        ("reserved_bytes.all.peak", 1.5e9, True),
        ("rss_peak", 2.0**30, False),
        ("saved_tensors.unique_bytes", 300.0 * 2**20, False),
        ("allocated_bytes.all.peak", 2.0 * 2**30, True),
    ]
    assert parse_leak((), {"cuda": "1MiB"}).cuda == 2**20
    with pytest.raises(ConfigError, match=r"^`memory_leak`: got positional \('1MiB',\)"):
        parse_leak(("1MiB",), {})


@pytest.mark.slow
def test_a_run_without_the_markers_imports_no_torch(inner):
    # GIVEN a suite with no memory markers, run in a fresh interpreter with the plugin loaded
    inner.write(
        "test_plain",
        """
import sys

def test_plain():
    assert "memprofiler.pytest_plugin" in sys.modules
    heavy = sorted(m for m in ("torch", "memprofiler.collectors", "memprofiler.core.profiler") if m in sys.modules)
    assert heavy == []
""",
        model=False,
    )
    # WHEN it runs
    result = inner.run("--memprofiler-dir", "figures", subprocess=True)
    # THEN torch and the collectors were never imported, and no figures were written, saying why
    result.assert_outcomes(passed=1)
    assert not (inner.path / "figures").exists()
    result.stdout.fnmatch_lines(
        ["memprofiler: nothing written to figures: no test that ran is marked memory_budget or memory_leak"]
    )


def test_the_pytest11_entry_point_is_declared():
    # GIVEN the project's metadata
    toml = pytest.importorskip("tomllib")  # Python 3.11+
    meta = toml.loads((ROOT / "pyproject.toml").read_text())
    # THEN pytest loads the plugin module from the `pytest11` group, under the module's own name
    # (so an explicit `-p memprofiler.pytest_plugin` is no second registration); xdist is a dev extra
    assert meta["project"]["entry-points"]["pytest11"] == {
        "memprofiler.pytest_plugin": "memprofiler.pytest_plugin"
    }
    assert any(dep.startswith("pytest-xdist") for dep in meta["project"]["optional-dependencies"]["dev"])


@pytest.mark.slow
@pytest.mark.parametrize("explicit", [False, True])
def test_the_installed_entry_point_loads_the_plugin_with_or_without_dash_p(inner, monkeypatch, explicit):
    # GIVEN an installed distribution declaring the pyproject's pytest11 entry point
    toml = pytest.importorskip("tomllib")
    (name, value), *_ = toml.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"][
        "pytest11"
    ].items()
    dist = inner.path / "site" / "memprofiler-0.1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: memprofiler\nVersion: 0.1.0\n")
    (dist / "entry_points.txt").write_text(f"[pytest11]\n{name} = {value}\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(dist.parent), os.environ["PYTHONPATH"]]))
    inner.write(
        "test_ep", "@pytest.mark.memory_budget(rss_peak='1GiB')\ndef test_a():\n    pass\n", model=False
    )
    # WHEN pytest runs with no -p, or with -p on top of the entry point
    result = inner.run("--memprofiler-dir", "figures", subprocess=True, load=explicit)
    # THEN the plugin is loaded once and measures the test
    result.assert_outcomes(passed=1)
    assert (inner.path / "figures" / "rank_0_memory_stats.yaml").is_file()
