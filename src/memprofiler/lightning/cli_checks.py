"""Checks ``MemProfilerCLI`` runs on the parsed config before anything is built: where each
profiler would write (a ``save_dir`` from the group, a callback entry or the model's
``memprofiler_cfg``, else the remote ``trainer.default_root_dir``) is writable and outlives the
process.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from memprofiler.config import MemProfilerConfig, urls
from memprofiler.errors import ConfigError, MemProfilerError
from memprofiler.lightning.cli_parser import config_entries, get_dotted, to_dict
from memprofiler.output import remote
from memprofiler.output.remote import RemoteDir, is_url
from memprofiler.output.run_dir import check_writable


def check_save_dirs(cfg: Any, use_group: bool) -> str | None:
    """The first problem with where an enabled profiler in ``cfg`` writes, as one line, or ``None``."""
    root = get_dotted(cfg, "trainer.default_root_dir")
    try:
        for key, value, _ in config_entries(cfg, use_group):
            built = MemProfilerConfig.from_any(to_dict(value))
            if not built.enabled:
                continue
            if built.save_dir:
                _check_one(built.save_dir, f"{key}.save_dir")
            elif root is not None and is_url(str(root)):
                # Lightning's own files follow a remote default_root_dir; so do ours.
                urls.check_dir(str(root), "trainer.default_root_dir")
                _check_one(str(root), "trainer.default_root_dir")
    except MemProfilerError as err:
        return str(err)
    return None


def _check_one(where: str, key: str) -> None:
    if urls.in_process(where):
        raise ConfigError(key, urls.in_process_message(where, "when the CLI's process ends with the run"))
    if is_url(where):
        remote.check_writable(RemoteDir.from_url(where, key=key), key=key)
    else:
        check_writable(Path(where).expanduser(), key=key)
