"""Which frames of an allocator stack a user can read: internal C++ frames hidden, own code first.

torch records each allocation's stack innermost first, mixing C++ frames (the unwinder, the
caching allocator, tensor factories, the dispatcher, the CPython interpreter) with Python
frames. A GPU capture's stack starts with ``torch::unwind::unwind()``,
``CapturedTraceback::gather`` and ``CUDACachingAllocator::malloc``: true for every block, so
they say nothing. Here each frame gets a kind:

- ``PYTHON``: a ``.py`` file; ``USER`` as well when it is outside site-packages and the
  standard library (the user's own code, which labels a block);
- ``INTERNAL``: a C++ frame of the unwinder, allocator, tensor factories, dispatcher glue or
  interpreter, hidden unless all frames are asked for;
- ``CPP``: any other C++ frame (an operator's kernel, the autograd engine's backward
  functions), shown after the Python frames.

torch's own Python wrappers that every module call or decorated function passes through
(``Module._call_impl``, ``_wrapped_call_impl``, ``inner`` when hooks are registered,
``_contextlib``'s ``decorate_context``, the optimizer's step wrappers, dynamo's disable
wrappers) are ``PYTHON | INTERNAL``: hidden like the C++ internals, so a stack reads
``forward`` to ``forward`` instead of alternating with them.

Frames of the code that *dispatches* to the user's code are ``PYTHON | INTERNAL | DISPATCH``:
memprofiler's own (its ``@memprofilable`` wrapper, its CLI), Lightning's trainer, loops,
strategies and hooks, and jsonargparse's. They are hidden too, and they also bound the label:
a block is labelled by the user's code called *below* the first dispatch frame
(``training_step (demo.py)``, ``forward (demo.py)``), else by the library code there
(``_multi_tensor_adam (adam.py)`` for optimizer state), and only when there is none by the
user's code above it (the script's ``main``), never by a dispatch frame.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

from memprofiler.analysis.snapshot.roles import ROLE_FILE

PYTHON = 1
USER = 2
INTERNAL = 4
CPP = 8
#: A frame of code that calls the user's code (memprofiler, Lightning, jsonargparse); always
#: with ``INTERNAL``.
DISPATCH = 16
#: A synthetic frame naming a block's role (parameter, optimizer state...; see
#: :mod:`~memprofiler.analysis.snapshot.roles`, file :data:`ROLE_FILE`); always with ``PYTHON | USER`` so it is shown
#: and labels the block.
ROLE = 32

#: Label of a block whose stack the snapshot lacks.
NO_STACK = "(no stack recorded)"

# Names of C++ frames no user acts on. Anchored at the start of the demangled name.
_INTERNAL_CPP = re.compile(
    "|".join(
        (
            # the unwinder that captured the stack
            r"torch::unwind::",
            r"torch::CapturedTraceback",
            r"torch::cuda::\(anonymous namespace\)::gather",
            # the caching allocator and tensor storage
            r"c10::cuda::",
            r"c10::CachingAllocator",
            r"c10::(Storage|Tensor)Impl::",
            r"c10::intrusive_ptr<",
            r"c10::.*Allocator",
            r"at::(TensorBase )?at::detail::_?empty",
            r"at::detail::",
            r"at::native::(_?empty|resize)",
            r"at::(cuda::)?(empty|resize)",
            r"THPVariable_subclass_(clear|dealloc)",
            # dispatcher glue between an operator call and its kernel
            r"c10::impl::",
            r"c10::Dispatcher",
            r"c10::OperatorHandle",
            r"c10::(Boxed)?KernelFunction",
            r"c10::BoxedKernel",
            r"at::_ops::",
            r"at::\(anonymous namespace\)::(\(anonymous namespace\)::)?(wrapper_|create_out|structured_)",
            r"at::autocast::",
            r"at::TensorIterator",
            r"at::meta::",
            r"(void )?at::meta::",
            r"torch::autograd::VariableType::",
            r"torch::ADInplaceOrView::",
            r"torch::autograd::impl::",
            # the CPython interpreter and process start
            r"_?Py",
            r"py(run|main)_",
            r"(method|cfunction|vectorcall|slot_tp|object_vacall|call_function|run_eval_code|run_mod|_start$|__libc_)",
        )
    )
)
# Python files that are not the user's own code: installed packages, the standard library.
_LIBRARY_PY = re.compile(r"(/site-packages/|/dist-packages/|/lib/python\d[\d.]*/|^<)")
# torch's Python plumbing between a caller and the code it calls: (file ending, function).
_PLUMBING_PY = (
    ("torch/nn/modules/module.py", frozenset({"_call_impl", "_wrapped_call_impl", "inner"})),
    ("torch/utils/_contextlib.py", frozenset({"decorate_context"})),
    ("torch/utils/hooks.py", frozenset({"hook", "_pack_with_none", "_unpack_none", "setup_input_hook"})),
    ("torch/optim/optimizer.py", frozenset({"wrapper", "_use_grad", "maybe_fallback"})),
    ("torch/_dynamo/eval_frame.py", frozenset({"_fn"})),
    ("torch/_compile.py", frozenset({"inner"})),
)
# Packages that dispatch to the user's code: Lightning (both namespaces), jsonargparse.
_DISPATCH_PY = re.compile(
    r"/(lightning/(pytorch|fabric)|pytorch_lightning|lightning_fabric|lightning_utilities|jsonargparse)/"
)


def _own_modules() -> re.Pattern[str]:
    """memprofiler's own files, installed or in a source checkout: ``.../memprofiler/<its module>``.

    Built from the package's own entries, so a user's project that merely sits in a directory
    named ``memprofiler`` (``memprofiler/examples/demo.py``) stays the user's code.
    """
    here = os.path.dirname(os.path.abspath(__file__))
    package = os.path.dirname(os.path.dirname(here))  # memprofiler/analysis/snapshot/ -> memprofiler/
    names = sorted(
        re.escape(n[:-3] if n.endswith(".py") else n)
        for n in os.listdir(package)
        if (n.endswith(".py") or os.path.isdir(os.path.join(package, n))) and not n.startswith((".", "_"))
    )
    names += ["__init__", "__main__", "_version"]
    return re.compile(r"(^|/)memprofiler/(" + "|".join(names) + r")(/|\.py$)")


_OWN_PY = _own_modules()
_ARGS = re.compile(r"\(.*\)(\s*(const|\[clone [^]]*\]))*\s*$")


@lru_cache(maxsize=1 << 16)
def frame_kind(name: str, filename: str) -> int:
    """The kind bits of one frame (``PYTHON``, ``USER``, ``INTERNAL``, ``CPP``, ``DISPATCH``, ``ROLE``).

    Kept per name and file: the analysis's stack groups ask again for the frames every stack
    shares (at 1M entries 14,000 asks of a few hundred frames, each a few regex searches).
    """
    if filename == ROLE_FILE:
        return PYTHON | USER | ROLE
    if filename.endswith(".py"):
        if _OWN_PY.search(filename) or _DISPATCH_PY.search(filename):
            return PYTHON | INTERNAL | DISPATCH
        if not _LIBRARY_PY.search(filename):
            return PYTHON | USER
        for ending, names in _PLUMBING_PY:
            if name in names and filename.endswith(ending):
                return PYTHON | INTERNAL
        return PYTHON
    return INTERNAL if _INTERNAL_CPP.match(name) else CPP


def short_name(name: str, kind: int) -> str:
    """A C++ name without its argument list (``at::native::einsum``); Python names unchanged."""
    if kind & PYTHON:
        return name
    short = _ARGS.sub("", name)
    return short or name


def frame_text(frame: Mapping[str, Any], kind: int | None = None) -> str:
    """``name (file:line)`` for a Python frame, the short C++ name (and file, when known) otherwise."""
    name = str(frame.get("name", "?"))
    filename = str(frame.get("filename", "?"))
    if kind is None:
        kind = frame_kind(name, filename)
    if kind & ROLE:
        return name
    if kind & PYTHON:
        return f"{name} ({os.path.basename(filename)}:{frame.get('line', '?')})"
    base = os.path.basename(filename)
    short = short_name(name, kind)
    return f"{short} ({base})" if base and base != "??" else short


def readable(frames: Sequence[Mapping[str, Any]] | None) -> list[Mapping[str, Any]]:
    """The frames shown by default: Python frames first, then C++ frames, internal ones left out.

    Both keep their innermost-first order. A stack of internal frames only is returned whole,
    so that something is always shown.
    """
    if not frames:
        return []
    py: list[Mapping[str, Any]] = []
    cpp: list[Mapping[str, Any]] = []
    for f in frames:
        kind = frame_kind(str(f.get("name", "")), str(f.get("filename", "")))
        if kind & INTERNAL:
            continue
        (py if kind & PYTHON else cpp).append(f)
    return py + cpp if py or cpp else list(frames)


def label_index(kinds: Sequence[int]) -> int:
    """Which frame labels a block; ``-1`` for no frames.

    Below the first dispatch frame (the code that was called by Lightning, memprofiler or
    jsonargparse): the first of the user's code, else the first Python frame, else the first
    C++ frame that is not internal. With none there, the first of the user's code above it
    (the script that started training), then any frame that is not internal, else the first.
    """
    if not kinds:
        return -1
    cut = next((i for i, k in enumerate(kinds) if k & DISPATCH), len(kinds))
    for want in (USER, PYTHON, CPP):
        for i in range(cut):
            k = kinds[i]
            if k & want and not k & INTERNAL:
                return i
    for want in (USER, PYTHON, CPP):
        for i in range(cut, len(kinds)):
            k = kinds[i]
            if k & want and not k & INTERNAL:
                return i
    return 0
