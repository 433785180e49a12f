"""What the compiled pack hook reads of each plain tensor, read from the C++ tensor
(src/memprofiler/_tensor_facts.cpp): a capsule for ``memprofiler._packer.use_facts``."""

API: object
TORCH_VERSION: str
SOURCE_SHA256: str
