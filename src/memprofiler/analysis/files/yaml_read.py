"""Read the YAML files a run wrote: integrity lines checked, aliases refused, libyaml when present.

Files that start with :data:`memprofiler.layout.YAML_HEADER` carry a block-end line after
every block of top-level entries (:data:`memprofiler.layout.YAML_BLOCK_END`). A copy cut
short, or a writer killed mid-append, leaves text after the last block-end: a number cut
in the middle (``74880`` read back as ``7488``) would still be valid YAML. So only what
lies before the last block-end whose count matches is read, and the rest is reported as
cut (:class:`Cut`). Files without the header are older files and are read whole.

The per-rank stats files are large (about 1 KB per collected call, 100 MB for 100,000
calls), and even libyaml's loader builds them at about 1-2 MB/s because PyYAML constructs
every node in Python. Memprofiler writes each entry on one line as a flow mapping in JSON's
syntax (``key: {"rss": 5, ...}``), which the C JSON decoder reads, a few thousand entries
per call; older files are block mappings with two-space indents, plain keys and numbers,
read line by line. :func:`_fast_mapping` reads exactly these two shapes; anything outside
them (a quoted top-level key, a string value in block style, a comment after a value, a
JSON form YAML 1.1 reads otherwise) sends the whole file to the YAML loader, so what comes
back is always what ``yaml.safe_load`` would return.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from memprofiler import layout
from memprofiler.analysis.files.gc_pause import gc_paused
from memprofiler.errors import ArtifactError

#: libyaml's parser where PyYAML was built with it (about 4x faster than the pure-Python one).
_BaseLoader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

HEADER = layout.YAML_HEADER
#: ``#memprofiler-end entries=<n>`` as a pattern, from the layout constant. It starts with the
#: literal, not ``^``, so the regex engine skips ahead to each occurrence (anchored, it tried
#: every position: 0.6 s on a 74 MB file); :func:`_block_ends` keeps those at a line start.
BLOCK_END = re.compile(
    re.escape(layout.YAML_BLOCK_END).replace(re.escape("{n}"), r"(\d+)") + r"[ \t]*\r?$", re.M
)
#: A top-level key: a line at column 0 that is not a comment, nor an item of a sequence
#: (``safe_dump`` writes a key's list items at column 0 too), nor a document marker, nor the
#: ``{}`` a stats file with no entry holds (``entries=0``). Matched from the newline before it
#: (the header is the first line): a literal to search for, so a 100 MB file is counted in C at
#: memory speed.
_TOP_KEY = re.compile(r"\n(?!- |-\n|---|\.\.\.|\{\}[ \t]*\r?\n)[^\s#]")


@dataclass(frozen=True)
class Cut:
    """A file that ends after its last matching block-end: only the verified entries were read."""

    path: Path
    kept: int
    """Top-level entries read (the last matching block-end's count)."""
    dropped_lines: int
    """Lines after that block-end, not read."""
    dropped_entries: int
    """Top-level entries that started after it (the last one may be partial)."""

    def line(self) -> str:
        """One line for the terminal, naming the file and what was dropped."""
        return (
            f"{self.path}: cut short (copied partially or its writer was killed); read the "
            f"{self.kept} verified entries, dropped {self.dropped_entries} entr"
            f"{'y' if self.dropped_entries == 1 else 'ies'} ({self.dropped_lines} lines) after the last "
            f"`{layout.YAML_BLOCK_END.format(n=self.kept)}`"
        )


class _AliasFound(yaml.YAMLError):
    def __init__(self, mark: Any) -> None:
        super().__init__("alias")
        self.problem_mark = mark


class _NoAliasLoader(yaml.SafeLoader):
    """``SafeLoader`` that refuses aliases (``*name``).

    Each alias re-uses a whole subtree, so a 760-byte file of nested aliases expands to
    gigabytes (the "billion laughs"). Memprofiler's writers never emit aliases, so a file
    with one was written by something else. libyaml's loader composes nodes in C, where
    this hook cannot run, so only text holding a ``*`` (every alias does) comes here.
    """

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            raise _AliasFound(self.peek_event().start_mark)
        return super().compose_node(parent, index)


def read_text(path: Path) -> str:
    """A file's text, every failure as a one-line :class:`ArtifactError`."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ArtifactError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as err:
        raise ArtifactError(f"{path}: cannot read as text ({err})") from None
    if not text.strip():
        raise ArtifactError(f"{path}: file is empty; re-run to write it again")
    return text


def _block_ends(text: str) -> Iterator[re.Match[str]]:
    for m in BLOCK_END.finditer(text):
        if m.start() == 0 or text[m.start() - 1] == "\n":
            yield m


def no_block_end(path: Path) -> ArtifactError:
    """The error for a file with the header and no block-end whose count matches."""
    return ArtifactError(
        f"{path}: starts with `{HEADER}` but has no matching `{layout.YAML_BLOCK_END.format(n='<n>')}` "
        "line: the file was cut before its first block was complete; re-copy it or re-run"
    )


def is_top_key(line: str) -> bool:
    """Whether ``line`` starts a top-level entry (what :data:`_TOP_KEY` finds after a newline)."""
    return bool(line) and _TOP_KEY.match("\n" + line[:4]) is not None


def verified_text(text: str, path: Path) -> tuple[str, Cut | None]:
    """The part of ``text`` its integrity lines vouch for, and what was cut after it.

    Raises:
        ArtifactError: the file has the header but no block-end whose count matches.
    """
    if not text.startswith(HEADER):
        return text, None  # an older file: no integrity lines to check
    count_from, counted = 0, 0
    good: tuple[int, int] | None = None  # (end offset of the block-end line, its count)
    for m in _block_ends(text):
        counted += len(_TOP_KEY.findall(text, max(count_from - 1, 0), m.start()))
        count_from = m.end()
        if int(m.group(1)) == counted:
            good = (m.end(), counted)
    if good is None:
        raise no_block_end(path)
    end, kept = good
    rest = text[end:]
    if not rest.strip():
        return text, None  # not text[:end]: a copy of a 100 MB file, for blank lines
    dropped_lines = len(rest.strip("\n").splitlines())
    return text[:end], Cut(path, kept, dropped_lines, len(_TOP_KEY.findall(text, end - 1)))


#: Nesting memprofiler never writes (its files are a few levels deep); libyaml's loader
#: crashed the process (a C stack overflow, no exception) on 50,000 nested ``[``.
_MAX_FLOW_DEPTH = 1000
_DEEP_INDENT = re.compile(r"^[ \t]{4000}", re.M)
_BRACKET = re.compile(r"[\[\]{}]")
_QUOTED = re.compile(r'"(?:[^"\\\n]|\\.)*"|\'(?:[^\'\n]|\'\')*\'')


def _too_deep(text: str) -> bool:
    """Whether ``text`` nests deeper than a loader can be trusted with (brackets in quotes skipped)."""
    if _DEEP_INDENT.search(text):
        return True
    if "[" not in text and "{" not in text:
        return False
    depth = 0
    for m in _BRACKET.finditer(_QUOTED.sub("", text)):
        if m.group() in "[{":
            depth += 1
            if depth > _MAX_FLOW_DEPTH:
                return True
        elif depth:
            depth -= 1
    return False


def load_yaml_text(text: str, path: Path) -> Any:
    """Load YAML text with the alias-refusing safe loader; errors name the file and line.

    Raises:
        ArtifactError: an alias, nesting deeper than memprofiler writes, or text that is
            not valid YAML.
    """
    if _too_deep(text):
        raise ArtifactError(
            f"{path}: refused: nested deeper than any file memprofiler writes (over {_MAX_FLOW_DEPTH} "
            "levels, or indented 4000 columns); a YAML parser can crash on such a file"
        )
    try:
        # Both are safe loaders: no tags, no objects. An alias needs a `*`; without one the
        # faster libyaml loader cannot meet one.
        return yaml.load(text, Loader=_NoAliasLoader if "*" in text else _BaseLoader)
    except _AliasFound as err:
        raise ArtifactError(
            f"{path}: refused: YAML alias (*name) at line {err.problem_mark.line + 1}; memprofiler "
            "never writes aliases and they can expand a small file to gigabytes"
        ) from None
    except RecursionError:  # the pure-Python loader, for text holding a `*`
        raise ArtifactError(f"{path}: refused: nested too deep to read safely") from None
    except yaml.YAMLError as err:
        where = getattr(err, "problem_mark", None)
        at = f" at line {where.line + 1}" if where is not None else ""
        raise ArtifactError(f"{path}: not valid YAML{at} (truncated or foreign file?)") from None
    except (ValueError, OverflowError) as err:  # a value YAML matched but Python cannot build
        what = str(err).split(";")[0].splitlines()[0][:120]
        raise ArtifactError(
            f"{path}: holds a value that cannot be read ({what}); foreign or edited file?"
        ) from None


def read_yaml(path: Path, cuts: list[Cut] | None = None) -> Any:
    """Load a file memprofiler wrote, as safe YAML without aliases, checking its integrity lines.

    Args:
        path: the file.
        cuts: where to record a file cut after its last block-end; without it, such a file
            is refused.

    Raises:
        ArtifactError: unreadable, empty, cut before its first block-end, invalid YAML, or
            holding an alias; or cut at all when ``cuts`` is not given.

    Example:
        >>> read_yaml(Path("run/rank_0_memory_stats.yaml"))["0.training_step.2.end"]["rss"]  # doctest: +SKIP
        412090368
    """
    text, cut = verified_text(read_text(path), path)
    if cut is not None:
        if cuts is None:
            raise ArtifactError(cut.line())
        cuts.append(cut)
    return parse_text(text, path)


def parse_text(text: str, path: Path) -> Any:
    """Verified text memprofiler wrote, parsed: :func:`_fast_mapping`, else the YAML loader.

    Raises:
        ArtifactError: as :func:`load_yaml_text`.
    """
    with gc_paused():  # plain data: a quarter of a 100,000-call file's load went to the GC
        fast = _fast_mapping(text)
        return fast if fast is not None else load_yaml_text(text, path)


# ----------------------------------------------------------------------- the fast shape
#: A plain key as safe_dump writes one: no quote, indicator, colon, comment or tab; inner
#: single spaces only.
_KEY = re.compile(r"[^\s'\"#&*!|>%@`{}\[\],:?-][^\s:#{}\[\],]*(?: [^\s:#{}\[\],]+)*")
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(\.[0-9]*(?:e[-+][0-9]+)?)?")
_SPECIAL = {".inf": float("inf"), "-.inf": float("-inf"), ".nan": float("nan"), "{}": {}}
_STR = "tag:yaml.org,2002:str"
_RESOLVER = yaml.resolver.Resolver()
#: A letter no YAML 1.1 number or date can hold (hex digits, x, t, z and e can).
_NOT_NUMERIC = re.compile(r"[g-su-wyG-SU-WY_(]")
#: Words YAML 1.1 reads as booleans or null: the only plain scalars starting with a letter
#: that are not strings.
_WORDS = frozenset(
    w
    for base in ("yes", "no", "true", "false", "on", "off", "null")
    for w in (base, base.capitalize(), base.upper())
)


def _plain_str(key: str) -> bool:
    """Whether ``key`` is a plain scalar YAML reads as a string (not a bool, null, number, date)."""
    if not _KEY.fullmatch(key):
        return False
    first = key[0]
    if first.isalpha() or first == "(":
        return key not in _WORDS
    if first.isdigit() and _NOT_NUMERIC.search(key):
        return True  # snapshot keys ("0.training_step.2.end")
    return _resolved_str(key)


@lru_cache(maxsize=1024)
def _resolved_str(key: str) -> bool:
    return bool(_RESOLVER.resolve(yaml.ScalarNode, key, (True, False)) == _STR)


def _value(text: str) -> Any:
    """A number as safe_dump writes it (the caller took plain decimal integers already)."""
    m = _NUMBER.fullmatch(text)
    if m is not None:
        return float(text) if m.group(1) else int(text)
    if text in _SPECIAL:
        v = _SPECIAL[text]
        return {} if v == {} else v
    raise ValueError(text)


#: Flow entries decoded per JSON call: the decoder shares one string per key within a call.
_FLOW_BATCH = 4096
#: An escaped surrogate: JSON joins a pair into one character, YAML decodes each half alone.
_SURROGATE = re.compile(r"\\u[dD][89abAB]")


def _refuse(text: str) -> Any:
    raise ValueError(text)  # NaN / Infinity: strings to YAML


def _yaml_float(text: str) -> float:
    """A JSON float YAML 1.1 also reads as one: a dot, and a signed exponent if any."""
    if "." not in text:
        raise ValueError(text)  # 1e5: a string to YAML 1.1
    e = text.find("e") if "e" in text else text.find("E")
    if e >= 0 and text[e + 1] not in "+-":
        raise ValueError(text)
    return float(text)


def _decode_values(values: list[str]) -> list[dict[str, Any]]:
    """The JSON objects ``values`` (one line each), decoded together; ValueError where YAML differs.

    Decoded as one array, so the decoder shares one string per key across them. Each value
    starts with ``{`` and, without a ``[`` in any, a value cannot run into the next (a comma
    inside an object is followed by a key) nor hold two: the count tells.
    """
    joined = ",".join(values)
    if not joined.isascii() or _SURROGATE.search(joined):
        raise ValueError("not read alike by JSON and YAML")
    if "[" in joined:
        decoded = [json.loads(v, parse_float=_yaml_float, parse_constant=_refuse) for v in values]
    else:
        decoded = json.loads(f"[{joined}]", parse_float=_yaml_float, parse_constant=_refuse)
    if len(decoded) != len(values) or any(type(v) is not dict for v in decoded):
        raise ValueError("not one mapping per line")
    return decoded


def _decode_flow(out: dict[str, Any], keys: list[str], values: list[str]) -> None:
    """Fill ``out[key]`` from the JSON flow mappings ``values``, and empty both lists."""
    for key, value in zip(keys, _decode_values(values), strict=True):
        out[key] = value
    keys.clear()
    values.clear()


#: ``key: {...}`` lines: the whole file in one C pass when every entry is one (files written now).
_FLOW_ENTRY = re.compile(r"^([^\s#:][^:\n]*): (\{[^\n]*)$", re.M)
#: A line that is neither empty nor a comment, after the first (a literal first: a fast scan).
_ENTRY_LINE = re.compile(r"\n(?=[^#\n])")
#: Keys such as ``0.training_step.2.end``, one per line: plain strings to YAML (see _plain_str).
_SNAPSHOT_KEYS = re.compile(r"(?:[0-9][^\s:#{}\[\],]*[g-su-wyG-SU-WY_(][^\s:#{}\[\],]*\n)*")


def _all_flow(text: str) -> dict[str, Any] | None:
    """``text`` read at C speed if every entry is a ``key: {...}`` line, else ``None``.

    Read a batch at a time, so that only one batch of entries is held as text beside what
    was decoded (all of them at once cost 100 MB more at the peak for 100,000 calls).
    """
    lines = len(_ENTRY_LINE.findall(text)) + (text[:1] not in ("#", "\n", ""))
    out: dict[str, Any] = {}
    keys: list[str] = []
    values: list[str] = []
    found = 0
    for m in _FLOW_ENTRY.finditer(text):
        keys.append(m.group(1))
        values.append(m.group(2))
        if len(keys) == _FLOW_BATCH:
            found += _decode_batch(out, keys, values)
    if keys:
        found += _decode_batch(out, keys, values)
    return out if found and found == lines else None


def _decode_batch(out: dict[str, Any], keys: list[str], values: list[str]) -> int:
    """:func:`_decode_flow` for keys not yet checked; how many entries it read."""
    if not _SNAPSHOT_KEYS.fullmatch("\n".join(keys) + "\n") and not all(_plain_str(k) for k in keys):
        raise ValueError("a key YAML does not read as a plain string")
    n = len(keys)
    _decode_flow(out, keys, values)
    return n


def _fast_mapping(text: str) -> dict[str, Any] | None:
    """Read ``text`` if it is a mapping of entries in the two shapes memprofiler writes, else ``None``.

    An entry is either ``key: {...}`` on one line, a JSON object that YAML reads alike, or
    block style: ``key:`` at column 0, ``name: number`` or ``name:`` at two spaces, and
    ``name: number`` at four under a ``name:``; comments only as whole lines. Anything else
    (quotes, strings, other flow collections, anchors, deeper nesting) returns ``None``.
    """
    if "\r" in text or "\t" in text:
        return None
    try:
        flow = _all_flow(text)
    except (ValueError, RecursionError):  # RecursionError: nesting deeper than JSON's C stack
        return None
    if flow is not None:
        return flow
    out: dict[str, Any] = {}
    flow_keys: list[str] = []
    flow_values: list[str] = []
    top: dict[str, Any] | None = None
    sub: dict[str, Any] | None = None
    top_key = sub_key = ""
    keys: dict[str, str] = {}  # nested name -> itself once checked ("" if not plain): checked once
    try:
        for line in text.split("\n"):
            if not line or line[0] == "#":
                continue
            key, sep, val = line.partition(":")
            if not sep:
                return None
            if val[:2] == " {" and val != " {}" and line[0] != " ":
                if not _plain_str(key):
                    return None
                out[key], top, sub = None, None, None  # its place in the order; filled below
                flow_keys.append(key)
                flow_values.append(val)
                if len(flow_keys) >= _FLOW_BATCH:
                    _decode_flow(out, flow_keys, flow_values)
                continue
            if val:
                if val[0] != " ":
                    return None
                val = val[1:]
                if val.isdigit() and val.isascii() and (val[0] != "0" or len(val) == 1):
                    num: Any = int(val)
                else:
                    num = _value(val)
            if line[0] != " ":
                if not _plain_str(key):
                    return None
                if val:
                    if num != {}:
                        return None  # a top-level scalar: not a stats file
                    out[key], top, sub = {}, None, None
                else:
                    top, top_key, sub = {}, key, None
                    out[key] = None  # YAML's value for `key:` with nothing under it
                continue
            name = key.lstrip(" ")
            canon = keys.get(name)
            if canon is None:
                canon = keys[name] = name if _plain_str(name) else ""
            if not canon:
                return None
            name = canon  # one string object per distinct name: 100k entries share them
            depth = len(key) - len(name)
            if depth == 2 and top is not None:
                if out[top_key] is None:
                    out[top_key] = top
                if val:
                    top[name], sub = num, None
                else:
                    top[name], sub, sub_key = None, {}, name
            elif depth == 4 and sub is not None and top is not None and val:
                if top[sub_key] is None:
                    top[sub_key] = sub
                sub[name] = num
            else:
                return None
        if flow_keys:
            _decode_flow(out, flow_keys, flow_values)
    except ValueError:
        return None
    return out or None
