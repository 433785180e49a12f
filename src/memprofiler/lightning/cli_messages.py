"""One-line versions of two jsonargparse errors ``MemProfilerCLI`` users meet: a value outside a
set of literals (``trainer.precision: bf16-mix``: a union-type dump) and a finetuning-scheduler
``memprofiler_cfg:`` block used as it is ("does not accept option `memprofiler_cfg.enabled`")."""

from __future__ import annotations

import ast
import difflib
import re

#: Where the finetuning-scheduler key names are mapped to memprofiler's.
MIGRATION_DOC = "docs/migration.md"

_PARSER_KEY = re.compile(r'Parser key "([^"]+)":')
_SUBTYPES = re.compile(r"Subtypes: \[(.*)\]")
_LITERAL = re.compile(r"(?:typing\.)?Literal\[([^\]]*)\]")
_GIVEN = re.compile(r"Given value: (.*)")
_FTS_OPTION = re.compile(r"does not accept option '((?:model\.(?:init_args\.)?)?memprofiler_cfg)\.[^']*'")


def literal_choice_message(message: str) -> str | None:
    """``Parser key "k": Does not validate ...`` over literals only: the allowed values in one line."""
    key, subtypes, given = (p.search(message) for p in (_PARSER_KEY, _SUBTYPES, _GIVEN))
    if key is None or subtypes is None or given is None:
        return None
    allowed: list[str] = []
    rest = _LITERAL.sub("", subtypes.group(1))
    if rest.replace("<class 'NoneType'>", "").strip(" ,"):
        return None  # a type other than literals and None: jsonargparse's own words are better
    for match in _LITERAL.finditer(subtypes.group(1)):
        try:
            values = ast.literal_eval(f"[{match.group(1)}]")
        except (ValueError, SyntaxError):
            return None
        allowed += [str(v) for v in values if str(v) not in allowed]
    if "NoneType" in subtypes.group(1):
        allowed.append("null")
    value = given.group(1).strip()
    close = difflib.get_close_matches(value, allowed, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"`{key.group(1)}`: got {value!r}; allowed: {', '.join(allowed)}{hint}"


def fts_block_message(message: str) -> str | None:
    """A finetuning-scheduler ``memprofiler_cfg`` block where this CLI takes none: where it goes."""
    match = _FTS_OPTION.search(message)
    if match is None:
        return None
    where = match.group(1)
    if where == "memprofiler_cfg":
        return (
            "`memprofiler_cfg` is finetuning-scheduler's block: under MemProfilerCLI its keys belong "
            "under `memprofiler:`; rename the block to `memprofiler:` and any renamed key as the "
            f"migration table in {MIGRATION_DOC} lists"
        )
    return (
        f"`{where}`: the model takes no `memprofiler_cfg`; move the block to the top-level "
        "`memprofiler:` group (or mix `memprofiler.ProfilerHooksMixin` into the model); renamed "
        f"keys: see the migration table in {MIGRATION_DOC}"
    )


_CLASS_PATH = re.compile(
    r"Problem with given class_path '([^']*)':\s*(.*?)\s*(?:\n\s*- |\n\s*Given value|$)", re.S
)
_EXPECTED = re.compile(r"Expected a <class '([\w.]+)'>\.? Got value: (.*)")


def class_path_message(message: str) -> str | None:
    """A ``class_path`` that cannot be imported (a misspelt ``model.class_path``): the key, the
    path and why, in one line."""
    match = _CLASS_PATH.search(message)
    if match is None:
        return None
    key = _PARSER_KEY.search(message)
    where = f"`{key.group(1)}.class_path`" if key else "`class_path`"
    why = " ".join(match.group(2).split())
    return (
        f"{where}: cannot use {match.group(1)!r} ({why}); give the full import path of the class, "
        "e.g. `mypackage.models.MyModel`"
    )


def wrong_type_message(message: str) -> str | None:
    """``Parser key "k": Expected a <class 'int'>. Got value: one``: the key, the type and the value."""
    key, match = _PARSER_KEY.search(message), _EXPECTED.search(message)
    if key is None or match is None:
        return None
    return f"`{key.group(1)}`: expected {match.group(1)}, got {match.group(2).strip()!r}"


_CLASS_NAME = re.compile(r"<class '([\w.]+)'>")


def union_type_message(message: str) -> str | None:
    """``Parser key "k": Does not validate ...`` over plain types (``int | None``): the key,
    the value and the types allowed, in one line."""
    key, subtypes, given = (p.search(message) for p in (_PARSER_KEY, _SUBTYPES, _GIVEN))
    if key is None or subtypes is None or given is None:
        return None
    names = _CLASS_NAME.findall(subtypes.group(1))
    if not names or _CLASS_NAME.sub("", subtypes.group(1)).strip(" ,"):
        return None  # literals, generics: left to the other rewrites or the joined text
    allowed = ["null" if n == "NoneType" else n.rsplit(".", 1)[-1] for n in names]
    return f"`{key.group(1)}`: got {given.group(1).strip()!r}; expected {' or '.join(allowed)}"


def one_line(message: str) -> str:
    """Any other message of the parser as one line (its lines joined)."""
    return " ".join(message.split())


def better_message(message: str) -> str | None:
    """The first of the rewrites above that applies, or ``None``."""
    return (
        fts_block_message(message)
        or literal_choice_message(message)
        or class_path_message(message)
        or union_type_message(message)
        or wrong_type_message(message)
    )
