"""The one compiled part: the saved-tensor pack hook (src/memprofiler/_packer.c).

Everything else is in pyproject.toml. The extension is optional: where it cannot be built
(no C compiler), the install goes on and the pure-Python pack hook runs instead, with the
same results (`python -c "import memprofiler._packer"` tells whether it was built).
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("memprofiler._packer", ["src/memprofiler/_packer.c"], optional=True)])
