"""The plan of ghost clipping for one model: which layers use their rule and which parameters fall back.

:class:`GhostPlan` is built once per model by :meth:`featuredp.clipping.ghost.GhostGradients.plan`
and read by ghost clipping and its checks (:mod:`featuredp.clipping.ghost_checks`); :func:`validate_rules`
checks it once against autograd (a parameter also used outside its layer's call falls back).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
from torch import nn

from featuredp.clipping.base import add_up
from featuredp.clipping.contributions import Contribution
from featuredp.clipping.rules import Rule

__all__ = ["GhostPlan", "validate_rules"]


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


def validate_rules(
    plan: GhostPlan,
    params: dict[str, torch.Tensor],
    combined: dict[str, Contribution],
    parts: dict[str, list[Contribution]],
    losses: torch.Tensor,
    *,
    piecewise: bool = False,
) -> list[str]:
    """Parameter names whose ghost sum of gradients differs from autograd's (checked once per model).

    A parameter of a supported layer that is also used outside the layer's call (a tied or functionally
    reused weight) would otherwise silently miss that part of its gradient. ``piecewise`` (a sharded model):
    autograd's gradient one layer's parameters at a time (a backward each), never the whole model's at once.
    """
    names = list(dict.fromkeys(n for layer in plan.layers for n in layer.params.values()))  # tied: once
    if not names:
        return []
    groups = [names]
    if piecewise:
        seen: set[str] = set()
        groups = []
        for layer in plan.layers:
            group = [n for n in dict.fromkeys(layer.params.values()) if n not in seen]
            seen.update(group)
            if group:
                groups.append(group)

    total = losses.sum()  # outside no_grad below: the backwards start from it

    def truth() -> Iterator[tuple[str, torch.Tensor | None]]:
        for group in groups:
            yield from zip(group, torch.autograd.grad(total, [params[n] for n in group], allow_unused=True,
                                                      retain_graph=True))  # fmt: skip

    ones = torch.ones(losses.shape[0], dtype=torch.float64, device=losses.device)
    bad = []
    with torch.no_grad():
        # Rounding scales with the size of the terms, not of their (possibly cancelling) sum. A bias whose
        # terms cancel exactly (a conv bias before GroupNorm(C, C), a key bias under softmax: its gradient is
        # 0) reaches its rule already summed, so its layer's largest term size stands in for its own. A
        # parameter this lets through only loses gradient outside its layer: the released sum is of the rules'
        # per-example contributions, each clipped, whatever this check decides.
        own = {n: float(add_up([p.abs_sum() for p in parts[n]]).max()) for n in names if n in combined}
        layer_scale: dict[str, float] = {}
        for layer in plan.layers:
            biggest = max((own.get(n, 0.0) for n in layer.params.values()), default=0.0)
            for n in layer.params.values():
                layer_scale[n] = max(layer_scale.get(n, 0.0), biggest)
        for n, t in truth():
            t = torch.zeros_like(params[n]) if t is None else t
            if n not in combined:
                if float(t.abs().max()) > 0:
                    bad.append(n)
                continue
            mine = combined[n].weighted_sum(ones)
            scale = max(own[n], layer_scale.get(n, 0.0)) + float(t.abs().max())
            if float((mine - t).abs().max()) > 1e-4 * scale:
                bad.append(n)
    return bad
