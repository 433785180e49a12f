"""The compiled parts of the saved-tensor pack hook. Everything else is in pyproject.toml.

* ``memprofiler._packer`` (``_packer.c``, C and Python's C API only): the pack hook itself.
* ``memprofiler._tensor_facts`` (``_tensor_facts.cpp``, against torch's headers): what the hook
  reads of each saved tensor (its storage, node numbers, whether it is a view), read from the
  C++ tensor instead of through Python objects. It is built only where torch is importable
  while building (``pip install --no-build-isolation``, as ``make install`` does) and records
  the torch it was built against: another torch does not load it.

Both are optional: without a C compiler the pure-Python pack hook runs, and without the second
the compiled hook asks Python, all with the same results (``saved_tensors.packer_build()`` tells
which runs). Each build records the SHA-256 of the sources it was made from: a checkout whose
sources changed since its last build is told so.
"""

import hashlib
from pathlib import Path

from setuptools import Extension, setup

HERE = Path(__file__).parent
PACKER = "src/memprofiler/_packer.c"
FACTS = "src/memprofiler/_tensor_facts.cpp"
FACTS_HEADER = "src/memprofiler/_tensor_facts.h"


def sha256(*sources: str) -> str:
    """What ``saved_tensors.packer_build`` compares: the sources' bytes, in this order."""
    h = hashlib.sha256()
    for source in sources:
        h.update((HERE / source).read_bytes())
    return h.hexdigest()


def facts_extension() -> list[Extension]:
    try:
        import torch
        from torch.utils.cpp_extension import include_paths, library_paths

        abi = int(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True))
        includes, library_dirs = include_paths(), library_paths()
    except Exception:  # an isolated build (no torch), or a torch without its headers
        return []
    return [
        Extension(
            "memprofiler._tensor_facts",
            [FACTS],
            depends=[FACTS_HEADER],
            include_dirs=includes,
            library_dirs=library_dirs,
            libraries=["c10", "torch", "torch_cpu", "torch_python"],
            language="c++",
            extra_compile_args=["-std=c++20", "-fvisibility=hidden"],
            define_macros=[
                ("_GLIBCXX_USE_CXX11_ABI", str(abi)),
                ("FACTS_TORCH_VERSION", f'"{torch.__version__}"'),
                ("FACTS_SOURCE_SHA256", f'"{sha256(FACTS, FACTS_HEADER)}"'),
            ],
            optional=True,
        )
    ]


setup(
    ext_modules=[
        Extension(
            "memprofiler._packer",
            [PACKER],
            depends=[FACTS_HEADER],
            define_macros=[("PACKER_SOURCE_SHA256", f'"{sha256(PACKER, FACTS_HEADER)}"')],
            optional=True,
        ),
        *facts_extension(),
    ]
)
