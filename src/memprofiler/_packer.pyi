"""The compiled saved-tensor pack hook (src/memprofiler/_packer.c); see saved_tensors._PyPacker."""

from collections.abc import Callable
from typing import Any

SOURCE_SHA256: str

def use_facts(capsule: object | None, /) -> None:
    """Read plain tensors through this tensor-facts capsule (None: through Python)."""

def facts_in_use() -> bool:
    """Whether plain tensors are read through the tensor-facts capsule."""

class Holder:
    """What the autograd graph stores for one saved tensor."""

    @property
    def t(self) -> Any: ...

class Entry:
    """One storage saved in the call."""

    @property
    def owner(self) -> str: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def alive(self) -> int: ...
    @property
    def last_death(self) -> int: ...

class Packer:
    held: dict[int, Entry]
    excluded: dict[int, Any]
    labels: dict[int, str]
    owner: Callable[[Any], str] | None
    enabled: bool
    @property
    def count(self) -> int: ...
    @property
    def packed_bytes(self) -> int: ...
    @property
    def last_nr(self) -> int: ...
    @property
    def last_owner(self) -> str: ...
    def __init__(
        self,
        storage_of: Callable[[Any], Any],
        on_fault: Callable[[BaseException], None],
        next_nr: Callable[[], int],
        tensor_type: type,
        param_type: type,
        call_code: Any,
        outside: str,
    ) -> None: ...
    def pack(self, t: Any) -> Holder: ...
    def still_held(self) -> tuple[int, dict[str, int]]: ...
