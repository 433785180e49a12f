"""Tied (shared) parameters and buffers: recorded before a model is materialized, restored after.

``Module.to_empty`` builds a new tensor for every place a tensor is registered, so a weight
used twice (GPT-2's ``lm_head`` and ``wte``, BERT's MLM decoder, T5's ``shared`` embedding in
four places) would come out as separate tensors: counted, given a gradient and optimizer state
once per place. The estimate records which places share a tensor on the meta copy and points
them all back at the first one after materializing.
"""

from __future__ import annotations

from torch import nn

#: (module, attribute, "_parameters" or "_buffers") of each place a tensor is registered.
Place = tuple[nn.Module, str, str]


def find_ties(model: nn.Module) -> list[list[Place]]:
    """Groups of two or more places that hold the same tensor, in module order."""
    groups: dict[int, list[Place]] = {}
    for module in model.modules():
        for kind in ("_parameters", "_buffers"):
            for name, t in getattr(module, kind).items():
                if t is not None:
                    groups.setdefault(id(t), []).append((module, name, kind))
    return [places for places in groups.values() if len(places) > 1]


def restore_ties(ties: list[list[Place]]) -> None:
    """Point every place of a group at the tensor its first place now holds."""
    for (first, first_name, first_kind), *rest in ties:
        shared = getattr(first, first_kind)[first_name]
        for module, name, kind in rest:
            getattr(module, kind)[name] = shared
