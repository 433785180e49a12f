"""The config reference as Markdown, read from the config dataclasses and their field docstrings.

The documentation's config page is generated from this (``docs/hooks.py``), so it cannot
drift from the code: a new field appears with its type, default and docstring, and a field
without a docstring fails the docs test (``tests/config/test_reference.py``).

Example:
    >>> from memprofiler.config.reference import config_fields
    >>> [f.key for f in config_fields()][:2]
    ['enabled', 'save_dir']
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import itertools
import re
import textwrap
import typing
from dataclasses import dataclass
from typing import Any

import yaml

from memprofiler.config.root import MemProfilerConfig


@dataclass(frozen=True)
class FieldDoc:
    """One leaf or nested field of the config tree, with its dotted key."""

    key: str
    type: str
    default: Any
    doc: str
    nested: bool


def field_docstrings(cls: type) -> dict[str, str]:
    """The docstring written under each field of dataclass ``cls`` (the string after its annotation)."""
    docs: dict[str, str] = {}
    for stmt, after in itertools.pairwise(_class_body(cls)):
        if (
            isinstance(stmt, ast.AnnAssign)
            and isinstance(stmt.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs[stmt.target.id] = inspect.cleandoc(after.value.value)
    return docs


def _class_body(cls: type) -> list[ast.stmt]:
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    return next(n for n in tree.body if isinstance(n, ast.ClassDef)).body


def _annotations(cls: type) -> dict[str, str]:
    """Each field's annotation as written in the source (``str | None``, not ``typing.Optional``)."""
    return {
        s.target.id: ast.unparse(s.annotation)
        for s in _class_body(cls)
        if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
    }


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def _nested_dataclass(tp: Any) -> type | None:
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return tp
    return None


def config_fields(cls: type = MemProfilerConfig, prefix: str = "") -> list[FieldDoc]:
    """Every field of the config tree under ``cls``, depth first, nested configs before their fields."""
    docs = field_docstrings(cls)
    annotations = _annotations(cls)
    hints = typing.get_type_hints(cls)
    out: list[FieldDoc] = []
    for f in dataclasses.fields(cls):
        if f.name.startswith("_"):
            continue
        key = f"{prefix}{f.name}"
        nested = _nested_dataclass(hints[f.name])
        out.append(
            FieldDoc(
                key=key,
                type=annotations.get(f.name, str(hints[f.name])),
                default=None if nested else _default(f),
                doc=docs.get(f.name, ""),
                nested=nested is not None,
            )
        )
        if nested is not None:
            out.extend(config_fields(nested, f"{key}."))
    return out


def _yaml_value(value: Any) -> str:
    if callable(value):
        return f"{value.__module__}.{value.__qualname__}"
    text = yaml.safe_dump(value, default_flow_style=True, width=10_000).strip()
    return text.removesuffix("\n...").removesuffix("...").strip()


_ROLE = re.compile(r":(?:class|func|meth|attr|data|mod):`(~?)([^`]+)`")


def _markdown(text: str) -> str:
    """Docstring text as one Markdown line: Sphinx roles become code spans (``~`` keeps the last name)."""
    text = _ROLE.sub(lambda m: f"`{m.group(2).rsplit('.', 1)[-1] if m.group(1) else m.group(2)}`", text)
    return " ".join(text.split())


def _cell(text: str) -> str:
    return _markdown(text).replace("|", "\\|")


def render_markdown(cls: type = MemProfilerConfig) -> str:
    """The reference: one table per config level, each row a key, its type, default and docstring."""
    sections: list[tuple[str, type, str]] = [("", cls, inspect.cleandoc(cls.__doc__ or ""))]
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        nested = _nested_dataclass(hints[f.name])
        if nested is not None:
            sections.append((f"{f.name}.", nested, inspect.cleandoc(nested.__doc__ or "")))
    lines: list[str] = []
    for prefix, section_cls, doc in sections:
        title = f"`{prefix.rstrip('.')}`" if prefix else "Top level"
        lines += [f"## {title}", ""]
        intro = doc.split("\n\n")[0] if doc else ""
        if intro:
            lines += [_markdown(intro), ""]
        lines += ["| key | type | default | meaning |", "| --- | --- | --- | --- |"]
        for fd in config_fields(section_cls, prefix):
            if fd.key.count(".") != prefix.count("."):
                continue
            if fd.nested:
                anchor = fd.key.replace(".", "")
                default = f"see [`{fd.key}`](#{anchor})"
            else:
                default = f"`{_cell(_yaml_value(fd.default))}`"
            # Python-Markdown keeps a ``\\|`` inside a code span, so a union is one span per member
            kind = " or ".join(f"`{part.strip()}`" for part in fd.type.split("|"))
            lines.append(f"| `{fd.key}` | {kind} | {default} | {_cell(fd.doc)} |")
        lines.append("")
    return "\n".join(lines)


def default_yaml(cls: type = MemProfilerConfig) -> str:
    """Every key with its default, as a YAML mapping (callables by dotted path); loads back into ``cls``."""
    return yaml.safe_dump(_plain_defaults(cls()), sort_keys=False, width=100)


def _plain_defaults(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: _plain_defaults(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, list):
        return [_plain_defaults(v) for v in obj]
    if callable(obj):
        return f"{obj.__module__}.{obj.__qualname__}"
    return obj
