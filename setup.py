"""The one compiled part: the saved-tensor pack hook (src/memprofiler/_packer.c).

Everything else is in pyproject.toml. The extension is optional: where it cannot be built
(no C compiler), the install goes on and the pure-Python pack hook runs instead, with the
same results (`python -c "import memprofiler._packer"` tells whether it was built). The build
records the SHA-256 of the source it was made from (`memprofiler._packer.SOURCE_SHA256`): a
checkout whose `_packer.c` changed since its last build is told so (`saved_tensors.packer_build`).
"""

import hashlib
from pathlib import Path

from setuptools import Extension, setup

SOURCE = "src/memprofiler/_packer.c"
SHA256 = hashlib.sha256((Path(__file__).parent / SOURCE).read_bytes()).hexdigest()

setup(
    ext_modules=[
        Extension(
            "memprofiler._packer",
            [SOURCE],
            define_macros=[("PACKER_SOURCE_SHA256", f'"{SHA256}"')],
            optional=True,
        )
    ]
)
