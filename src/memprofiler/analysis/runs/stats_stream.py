"""Read a per-rank stats file one verified block at a time, in memory bounded by a block.

``memprofiler check`` compares each value with its limits and keeps nothing else, so it
needs no more of a 100,000-call file at once than one block: what one flush appended
(``flush_every_calls``, 50 calls by default). The integrity lines are checked as
:func:`memprofiler.analysis.files.yaml_read.verified_text` checks them: entries are parsed once a
block-end whose count matches vouches for them, and what follows the last such line is a
cut. An older file without the header is read whole.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from memprofiler.analysis.files.yaml_read import (
    BLOCK_END,
    HEADER,
    Cut,
    is_top_key,
    no_block_end,
    parse_text,
    read_yaml,
)
from memprofiler.errors import ArtifactError


def iter_stats(path: Path, cuts: list[Cut]) -> Iterator[Any]:
    """Yield the contents of ``path`` as parsed mappings, one verified run of blocks each.

    Args:
        path: a ``rank_{r}_memory_stats.yaml``.
        cuts: where a file cut after its last matching block-end is recorded (once all of
            it before that line was yielded).

    Raises:
        ArtifactError: as :func:`memprofiler.analysis.files.yaml_read.read_yaml`. A block only the
            YAML loader reads that it refuses is read again as a whole file, so that the
            message names the file's line, not the block's.
    """
    f = None
    try:
        f = path.open()
        first = f.readline()
    except FileNotFoundError:
        raise ArtifactError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError):
        first = ""  # read_yaml says what is wrong, in its words
    if f is None or not first.startswith(HEADER):
        if f is not None:
            f.close()
        yield read_yaml(path, cuts)  # an older file (or an empty or unreadable one)
        return
    with f:
        pending, keys, counted, kept = [first], 0, 0, None
        try:
            for line in f:
                pending.append(line)
                end = BLOCK_END.match(line)
                if end is None:
                    keys += is_top_key(line)
                    continue
                counted, keys = counted + keys, 0
                if int(end.group(1)) == counted:
                    block, pending, kept = _parse("".join(pending), path), [], counted
                    if block is not None:
                        yield block
        except UnicodeDecodeError:
            read_yaml(path, cuts)  # raises: not text
            raise
    rest = "".join(pending)
    if kept is None:
        raise no_block_end(path)
    if rest.strip():
        entries = sum(map(is_top_key, rest.splitlines(keepends=True)))
        cuts.append(Cut(path, kept, len(rest.strip("\n").splitlines()), entries))


def _parse(text: str, path: Path) -> Any:
    try:
        return parse_text(text, path)
    except ArtifactError:
        read_yaml(path, [])  # the same failure, with the file's line number
        raise
