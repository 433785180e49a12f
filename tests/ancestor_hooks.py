"""Hooks written the ancestor's way (finetuning-scheduler): the module comes first."""

from __future__ import annotations

from typing import Any


def pre_forward(module: Any, *args: Any, **kwargs: Any) -> None:
    module.rss_pre_forward = 0


def post_forward(module: Any, *args: Any, **kwargs: Any) -> None:
    module.rss_post_forward = 0


def reset_state(model: Any, reset_attrs: list[str]) -> None:
    for attr in reset_attrs:
        setattr(model, attr, 0)


def pre_two_args(state: Any, module: Any) -> None:
    """Ours in spirit, but missing ``args``."""
