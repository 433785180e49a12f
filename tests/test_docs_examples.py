"""Every ```python and ```yaml example in README.md and docs/ works: an example that no longer runs fails here.

Python blocks run as scripts in a fresh interpreter, in an empty temporary directory, on CPU.
YAML blocks must parse; where one is a memprofiler config (the ``memprofiler:`` group of
``MemProfilerCLI``, a ``MemProfilerCallback`` entry's ``init_args.config``, or a mapping of
config keys) it must also build with :meth:`MemProfilerConfig.from_any`. A block preceded by
the line ``<!-- skip-example -->`` is illustrative and skipped; shell blocks are never run.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import pytest
import yaml

from memprofiler.config import MemProfilerConfig

ROOT = Path(__file__).resolve().parents[1]
SKIP_MARK = "<!-- skip-example -->"
_FENCE = re.compile(r"^(?P<indent>[ ]*)(?P<fence>`{3,})(?P<lang>[\w-]*)[^\n]*$")
#: A python example gets this long (the first import of torch and Lightning on a loaded machine).
TIMEOUT_S = 180


@dataclass(frozen=True)
class Example:
    path: Path
    line: int
    lang: str
    code: str
    skipped: bool

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def doc_files() -> list[Path]:
    """README.md and every Markdown page under docs/."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def examples_in(path: Path) -> Iterator[Example]:
    """The fenced code blocks of ``path``, with their language and whether they are skipped."""
    lines = path.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, lang = len(m["indent"]), m["fence"], m["lang"].lower()
        start = i
        body: list[str] = []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i][indent:] if lines[i][:indent].strip() == "" else lines[i])
            i += 1
        i += 1
        skipped = start > 0 and lines[start - 1].strip() == SKIP_MARK
        yield Example(path, start + 1, lang, "\n".join(body) + "\n", skipped)


def all_examples(lang: str) -> list[Example]:
    return [ex for path in doc_files() for ex in examples_in(path) if ex.lang == lang]


def _params(lang: str) -> list[Any]:
    return [
        pytest.param(ex, id=ex.id, marks=[pytest.mark.skip(reason=SKIP_MARK)] if ex.skipped else [])
        for ex in all_examples(lang)
    ]


_CONFIG_KEYS = frozenset(f.name for f in fields(MemProfilerConfig))


def memprofiler_configs(doc: Any) -> list[tuple[str, Any]]:
    """The memprofiler configs a YAML document holds, each with where it sits."""
    if not isinstance(doc, Mapping):
        return []
    found: list[tuple[str, Any]] = []
    if "memprofiler" in doc:
        found.append(("memprofiler", doc["memprofiler"]))
    callbacks = (doc.get("trainer") or {}).get("callbacks") or []
    for i, cb in enumerate(callbacks):
        if isinstance(cb, Mapping) and str(cb.get("class_path", "")).endswith("MemProfilerCallback"):
            config = (cb.get("init_args") or {}).get("config")
            found.append((f"trainer.callbacks[{i}].init_args.config", config))
    model_args = (doc.get("model") or {}).get("init_args") or doc.get("model") or {}
    if isinstance(model_args, Mapping) and "memprofiler_cfg" in model_args:
        found.append(("model.memprofiler_cfg", model_args["memprofiler_cfg"]))
    if not found and doc and set(doc) <= _CONFIG_KEYS:
        found.append(("(top level)", doc))
    return found


def test_the_docs_have_examples_of_both_kinds() -> None:
    """GIVEN the docs WHEN collecting examples THEN both kinds are found (the collector works)."""
    assert len(all_examples("python")) >= 4
    assert len(all_examples("yaml")) >= 6


def test_a_skip_marker_and_indented_fences_are_read(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "text\n<!-- skip-example -->\n```python\nraise SystemExit(1)\n```\n"
        "- item\n\n  ```yaml\n  a: 1\n  ```\n```bash\nrm -rf /\n```\n"
    )
    got = [(ex.lang, ex.code, ex.skipped) for ex in examples_in(page)]
    assert got == [
        ("python", "raise SystemExit(1)\n", True),
        ("yaml", "a: 1\n", False),
        ("bash", "rm -rf /\n", False),
    ]


@pytest.mark.slow
@pytest.mark.parametrize("example", _params("python"))
def test_python_example_runs(example: Example, tmp_path: Path) -> None:
    script = tmp_path / "example.py"
    script.write_text(example.code, encoding="utf-8")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.update(CUDA_VISIBLE_DEVICES="", MALLOC_ARENA_MAX="1", OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    proc = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    assert proc.returncode == 0, f"{example.id} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"


@pytest.mark.parametrize("example", _params("yaml"))
def test_yaml_example_is_valid(example: Example) -> None:
    doc = yaml.safe_load(example.code)
    for where, config in memprofiler_configs(doc):
        try:
            MemProfilerConfig.from_any(config or {})
        except Exception as err:  # the assertion names the block and the key
            pytest.fail(f"{example.id}: `{where}` is not a valid memprofiler config: {err}")


def test_a_wrong_config_in_yaml_is_caught() -> None:
    """GIVEN a callback entry with a bad key WHEN the YAML test reads it THEN it is found and refused."""
    doc = yaml.safe_load(
        "trainer:\n  callbacks:\n    - class_path: memprofiler.MemProfilerCallback\n"
        "      init_args:\n        config: {schedule: {active: 0}}\n"
    )
    ((where, config),) = memprofiler_configs(doc)
    assert where == "trainer.callbacks[0].init_args.config"
    with pytest.raises(Exception, match=r"schedule\.active"):
        MemProfilerConfig.from_any(config)
