"""torch's private API, as memprofiler uses it: each name pinned (``memprofiler/_torch_compat.py``),
so a torch release that removes, renames or re-signs one fails here, naming the feature."""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

import pytest
import torch

from _torch_private_scan import private, used_names
from memprofiler import _torch_compat
from memprofiler._torch_compat import PINNED, PINNED_ATTRIBUTES, Pin, problem, resolve

SRC = Path(__file__).resolve().parents[1] / "src" / "memprofiler"
CUDA_BUILD = torch.backends.cuda.is_built()


@pytest.mark.parametrize("name", sorted(PINNED))
def test_each_pinned_private_name_is_there_as_relied_on(name):
    # GIVEN a private torch name memprofiler relies on
    pin = PINNED[name]
    if pin.cuda and not CUDA_BUILD:
        pytest.skip("a name of torch's CUDA build; this torch is built without CUDA")
    # THEN the installed torch has it, with its members and parameters
    assert problem(name, pin, torch.__version__) is None, problem(name, pin, torch.__version__)


@pytest.mark.parametrize("owner", sorted(PINNED_ATTRIBUTES))
def test_each_pinned_private_attribute_is_still_set_by_torch(owner):
    names, feature = PINNED_ATTRIBUTES[owner]
    classes = [c for c in inspect.getmro(resolve(owner)) if c.__module__.startswith("torch")]  # type: ignore[arg-type]
    source = "".join(inspect.getsource(c) for c in classes)
    missing = [a for a in names if f"self.{a} =" not in source and f"self.{a}:" not in source]
    assert missing == [], f"torch {torch.__version__} no longer sets {missing} on {owner}: {feature} breaks"


def _covered(name: str) -> bool:
    """Pinned itself, a member of a pinned name, or a module a pinned name lives in."""
    for pinned, pin in PINNED.items():
        if name == pinned or pinned.startswith(name + "."):
            return True
        rest = name.removeprefix(pinned + ".")
        if rest != name and rest.split(".")[0] in pin.members:
            return True
    owner, _, attr = name.rpartition(".")
    return attr in PINNED_ATTRIBUTES.get(owner, ((), ""))[0]


def _relied_on(name: str) -> bool:
    """A used name counts when it is torch's: a method our subclass defines under a private name
    overrides only when the torch base has it."""
    parts = name.split(".")
    if not private(parts[-1]):
        return True
    try:
        owner = resolve(".".join(parts[:-1]))
    except (ImportError, AttributeError):
        return True
    if not inspect.isclass(owner):
        return True
    return hasattr(owner, parts[-1]) or parts[-1] in PINNED_ATTRIBUTES.get(".".join(parts[:-1]), ((), ""))[0]


def test_every_private_torch_name_the_source_uses_is_pinned():
    # GIVEN every private torch name the source reaches (imports, attribute chains, overrides)
    used = used_names(SRC)
    # THEN each is pinned (a chain past a pinned name, e.g. an enum member's `.value`, counts as
    # the member it starts with)
    unpinned = []
    for name, files in sorted(used.items()):
        parts = name.split(".")
        prefixes = [".".join(parts[:k]) for k in range(len(parts), 1, -1)]
        if any(_covered(p) for p in prefixes) or not _relied_on(name):
            continue
        unpinned.append(f"{name} ({', '.join(sorted(files))})")
    assert unpinned == []


def test_a_renamed_name_fails_naming_the_feature(tmp_path, monkeypatch):
    # GIVEN a module standing for a torch release that renamed one function and re-signed another
    (tmp_path / "fake_torch_release.py").write_text(
        "def _record_memory_history_v2(enabled='all'):\n    pass\n\n"
        "def _snapshot(device=None, include_traces=True):\n    pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("fake_torch_release", None)
    history = Pin(_torch_compat.HIST, params=("enabled",))
    # WHEN the pins are checked against it
    gone = problem("fake_torch_release._record_memory_history", history, "9.9")
    resigned = problem("fake_torch_release._snapshot", Pin(_torch_compat.HIST, params=("device",)), "9.9")
    # THEN each fails with one line naming the name and the feature that breaks
    assert gone is not None and gone.startswith(
        "torch 9.9 has no `fake_torch_release._record_memory_history`"
    )
    assert gone.endswith(f": {_torch_compat.HIST} breaks")
    assert resigned == (
        "torch 9.9: `fake_torch_release._snapshot` takes (device, include_traces), memprofiler relies on "
        f"(device): {_torch_compat.HIST} breaks"
    )
    # AND a member gone is named too
    enum = Pin(_torch_compat.TRACKER, members=("PARAM", "RENAMED"))
    assert problem("torch.distributed._tools.mem_tracker._MemRefType", enum, "9.9") == (
        "torch 9.9: `torch.distributed._tools.mem_tracker._MemRefType` lacks RENAMED: "
        f"{_torch_compat.TRACKER} breaks"
    )


def test_a_new_private_name_in_the_source_is_found(tmp_path):
    # GIVEN a module that starts using a private torch name nobody pinned
    (tmp_path / "new.py").write_text("import torch\n\nx = torch._C._some_new_binding()\n")
    # THEN the scan sees it, so the pin test above would fail until it is pinned
    assert used_names(tmp_path) == {"torch._C._some_new_binding": {"new.py"}}
    assert not _covered("torch._C._some_new_binding")


def test_the_installed_torch_is_one_the_list_names_or_newer():
    installed = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])
    checked = [tuple(int(p) for p in v.split(".")[:2]) for v in _torch_compat.CHECKED_ON]
    assert installed >= min(checked), (torch.__version__, _torch_compat.CHECKED_ON)
