"""Where the extended profiler's per-cycle traces go, what they are called and how many stay."""

from __future__ import annotations

import re
import string
from dataclasses import dataclass

from memprofiler.errors import ConfigError

#: Fields a ``folder`` template may use: fixed for the whole run.
FOLDER_FIELDS = ("run_name", "rank", "local_rank", "node_rank", "world_size", "stage")
#: Fields a ``filename`` template may use: the folder's plus those of the cycle being written.
#: ``batch`` is the last profiler step in the trace (``ProfilerStep#{batch}``, 0-based: the
#: training call ``batch + 1``), ``epoch`` the epoch it ran in, ``cycle`` counts traces from 1.
FILENAME_FIELDS = (*FOLDER_FIELDS, "epoch", "batch", "cycle")
#: The suffix of a gzip-compressed trace; Perfetto and TensorBoard read ``.pt.trace.json.gz``.
GZIP_SUFFIX = ".gz"
#: Fields that differ from one trace cycle to the next (``batch`` is the profiler step, which
#: only grows): a ``filename`` without one of them gives every cycle the same file.
CYCLE_FIELDS = ("cycle", "batch")
#: The widest padding a format spec may ask for: an int needs at most 20 characters.
MAX_FORMAT_WIDTH = 20
#: What a field's format spec may hold: ``[[fill]align][sign][0][width][type]``, the width at
#: most :data:`MAX_FORMAT_WIDTH` and the fill a letter, digit, ``_``, ``-`` or ``.``
#: (``{batch:06d}``, ``{rank:>3}``, ``{stage:_<8}``). ``{rank:>100000000}`` would make a name
#: no filesystem takes, at every cycle's write, after training started.
_FORMAT_SPEC = re.compile(r"(?:[0-9A-Za-z_.\-]?[<>=^])?[+\- ]?0?(?P<width>[0-9]{1,2})?[dsxXob]?")


def template_fields(template: str) -> list[str]:
    """The ``{field}`` names of a ``str.format`` template, in order (``{{`` escapes skipped)."""
    try:
        return [name for _, name, _, _ in string.Formatter().parse(template) if name is not None]
    except ValueError as err:
        raise ValueError(f"is not a valid template ({err})") from None


def check_template(key: str, template: str, allowed: tuple[str, ...]) -> None:
    """Refuse a template that names a field outside ``allowed`` (or a positional/indexed one),
    converts a field (``!r``), pads it wider than :data:`MAX_FORMAT_WIDTH` or holds a NUL.

    Raises:
        ConfigError: one line naming ``key``, the bad field and the allowed ones.
    """
    if "\0" in template:
        raise ConfigError(key, f"{template!r} holds a NUL character, which no file name may hold")
    try:
        parsed = [
            (name, conversion, spec)
            for _, name, spec, conversion in string.Formatter().parse(template)
            if name is not None
        ]
    except ValueError as err:
        raise ConfigError(key, f"{template!r} is not a valid template ({err})") from None
    listed = ", ".join("{" + f + "}" for f in allowed)
    for name, conversion, spec in parsed:
        shown = "{" + name + "}" if name else "{}"
        if name not in allowed:
            raise ConfigError(key, f"unknown field {shown} in {template!r}; allowed: {listed}")
        match = _FORMAT_SPEC.fullmatch(spec or "")
        width = int(match.group("width") or 0) if match else 0
        if conversion is not None or match is None or width > MAX_FORMAT_WIDTH:
            bad = "{" + name + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "") + "}"
            raise ConfigError(
                key,
                f"{bad} in {template!r}: a field takes at most a padding spec such as "
                f"{{{name}:0{min(6, MAX_FORMAT_WIDTH)}}} or {{{name}:>4}} (width <= {MAX_FORMAT_WIDTH}, "
                "no conversion, no nested field)",
            )


@dataclass
class TraceFilesConfig:
    """The extended profiler's trace files: names, compression, retention, overwriting.

    Every file of a trace cycle (the Chrome trace and any companion written beside it) follows
    these rules; the folder is relative to the output directory (memprofiler's ``save_dir``
    when a :class:`~memprofiler.MemProfilerCallback` runs, else ``dirpath`` / the Trainer's
    log dir).
    """

    folder: str = ""
    """Folder of the traces under the output directory, a template over ``{run_name}``,
    ``{rank}``, ``{local_rank}``, ``{node_rank}``, ``{world_size}``, ``{stage}``; ``""`` for the
    output directory itself."""
    filename: str = "{stage}_rank_{rank}.{cycle}.pt.trace.json"
    """Trace file name, a template over the folder's fields plus ``{epoch}``, ``{batch}`` and
    ``{cycle}``. Keep the ``.pt.trace.json`` ending: ``memprofiler report`` and
    ``merge-traces`` find traces by it."""
    use_gzip: bool = False
    """Write every trace file gzip-compressed, with ``.gz`` appended to its name."""
    num_traces_to_keep: int = -1
    """Trace cycles to keep; older cycles' files are deleted as new ones are written, locally
    and in a remote ``save_dir``. ``-1`` keeps all."""
    overwrite: bool = False
    """Allow the trace folder to already hold ``*.pt.trace.json*`` files from an earlier run
    (they may be overwritten). If false, such a folder is refused when training starts."""
    run_name: str | None = None
    """``{run_name}``; default: the Trainer logger's ``{name}_{version}``, or ``run``."""

    def __post_init__(self) -> None:
        check_template("folder", self.folder, FOLDER_FIELDS)
        check_template("filename", self.filename, FILENAME_FIELDS)
        if not self.filename.strip() or self.filename.endswith("/"):
            raise ConfigError("filename", f"got {self.filename!r}; give a file name template")
        if not self.filename.removesuffix(GZIP_SUFFIX).endswith(".pt.trace.json"):
            raise ConfigError(
                "filename",
                f"got {self.filename!r}; end it in '.pt.trace.json' (memprofiler report, "
                "merge-traces and retention find traces by that ending)",
            )
        if self.folder.startswith(("/", "\\")):
            raise ConfigError(
                "folder", f"got {self.folder!r}; give a folder relative to the output directory"
            )
        if ".." in re.split(r"[/\\]", self.folder):
            raise ConfigError(
                "folder", f"got {self.folder!r}; '..' would put traces outside the output directory"
            )
        if "/" in self.filename or "\\" in self.filename:
            raise ConfigError(
                "filename",
                f"got {self.filename!r}; give a file name without '/' and put folders in "
                "`trace_files.folder`",
            )
        if self.run_name is not None:
            bad = [c for c in ("/", "\\", "\0") if c in self.run_name]
            if bad or self.run_name in (".", ".."):
                raise ConfigError(
                    "run_name",
                    f"got {self.run_name!r}; give a plain name (no '/', '\\', NUL, '.' or '..'): it "
                    "names files and folders inside the output directory",
                )
        if self.num_traces_to_keep == 0 or self.num_traces_to_keep < -1:
            raise ConfigError(
                "num_traces_to_keep",
                f"got {self.num_traces_to_keep}; give -1 (keep all) or a count >= 1",
            )
        if self.num_traces_to_keep >= 1 and not set(CYCLE_FIELDS) & set(template_fields(self.filename)):
            raise ConfigError(
                "filename",
                f"{self.filename!r} names no {{cycle}} or {{batch}}, so every trace cycle writes the "
                f"same file and `num_traces_to_keep: {self.num_traces_to_keep}` cannot keep cycles "
                "apart; add {cycle} to the name, or set `num_traces_to_keep: -1` to rewrite one file",
            )

    @property
    def trace_filename(self) -> str:
        """``filename`` with ``.gz`` appended when ``use_gzip`` (and not already there)."""
        if self.use_gzip and not self.filename.endswith(GZIP_SUFFIX):
            return self.filename + GZIP_SUFFIX
        return self.filename
