"""The plan of ghost clipping for one model: which layers use their rule and which parameters fall back.

:class:`GhostPlan` is built once per model by :meth:`featuredp.clipping.ghost.GhostGradients.plan`
and read by ghost clipping and its checks (:mod:`featuredp.clipping.ghost_checks`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import nn

from featuredp.clipping.rules import Rule

__all__ = ["GhostPlan"]


@dataclass
class _Layer:
    """A supported layer of the model and the trainable parameters its rule covers."""

    name: str
    module: nn.Module
    rule: Rule
    params: dict[str, str]  # attribute on the module -> name in model.named_parameters()


@dataclass
class GhostPlan:
    """How one model's trainable parameters are handled (built once per model and cached)."""

    layers: list[_Layer]
    fallback: list[str]  # parameter names differentiated per example with torch.func
    fallback_layers: list[str]  # "layer (Type): reason", for the user
    signature: tuple[tuple[str, int, bool], ...]
    clone_outputs: set[int] = field(default_factory=set)  # id(module): outputs later modified in place
    validated: bool = False
    whole_model_fallback: bool = False
    deterministic: bool = False  # two batch-of-one computations of the same example agreed (checked once)
    alone_vmap: bool = True  # the checks' batch-of-one forwards run under vmap (False once vmap failed)

