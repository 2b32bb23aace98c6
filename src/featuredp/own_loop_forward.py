"""The own loop's one forward: the user's call of the model is the forward the clipped sum differentiates.

In the user's loop the model is called (``model(x)``) before the loss and its ``backward()`` say what the step is.
Run without a graph, that call is wasted work: the clipping strategy then runs the model again on the same batch.
With ghost clipping the call runs instead under ghost's layer hooks, with a graph (:meth:`GhostGradients.capture`),
and the user gets its output without one; ``loss.backward()`` on that output's loss hands the captured forward to
the clipped sum, which computes the per-example losses from it rather than calling the model again. Nothing about
the step changes: the same layer calls, the same losses, the same checks (the separability cross-check still
recomputes its examples alone; the forward guard still runs around the user's call and around the strategy).

The capture is used once, for the loss of the very call it recorded, and only while the model's parameters, the
call's inputs and the output are unchanged (a write to any of them: the model runs again, as before). Elsewhere
the call runs without a graph: vmap (its per-example pass cannot reuse an ordinary forward), a feature map (its
loss runs the model on Ψ(x) as well), bfloat16 (the strategy's own autocast), a transformers model (its
per-example pass needs plain attention), a model whose output is not a tensor, a forward under ``no_grad``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from featuredp.clipping.auto import AutoStrategy
from featuredp.clipping.ghost import Captured, GhostGradients

__all__ = ["OneForward", "ghost_of"]


def ghost_of(strategy: Any) -> GhostGradients | None:
    """The ghost strategy that computes the next clipped sum, if ghost does (``auto`` once it chose ghost)."""
    if isinstance(strategy, GhostGradients):
        return strategy
    if isinstance(strategy, AutoStrategy) and strategy.chosen == "ghost":
        ghost = strategy.strategies["ghost"]
        return ghost if isinstance(ghost, GhostGradients) else None
    return None


class OneForward:
    """The user's last call of the model, captured for the clipped sum where it can be (see the module docstring)."""

    def __init__(self) -> None:
        self._captured: Captured | None = None
        self._inputs: Any = None  # the (args, kwargs) object the capture ran on: the loss names its call by it
        self._tensor_output = True  # False once the model answered with something else: never captured again

    def forward(self, module: nn.Module, inputs: tuple[tuple[Any, ...], dict[str, Any]],
                ghost: GhostGradients | None) -> Any:  # fmt: skip
        """The model's output on ``inputs`` (``(args, kwargs)``, the object the loss will name this call by) without
        a graph; captured under ``ghost``'s hooks when given. The caller guards the forward."""
        self._captured, self._inputs = None, None
        args, kwargs = inputs
        if ghost is None or not self._tensor_output or not torch.is_grad_enabled():
            with torch.no_grad():
                return module(*args, **kwargs)
        tensors = [t for t in (*args, *kwargs.values()) if isinstance(t, torch.Tensor)]
        out, captured = ghost.capture(module, lambda: module(*args, **kwargs), tensors)
        if not isinstance(out, torch.Tensor):
            self._tensor_output = False
            del out, captured  # the graph goes; the output without one comes from a plain call
            with torch.no_grad():
                return module(*args, **kwargs)
        captured.versions.append((out, out._version))  # a write to the output (the user's copy shares it)
        self._captured, self._inputs = captured, inputs
        return out.detach()

    def take(self, inputs: Any) -> Captured | None:
        """The capture of the call the loss was computed from (``inputs``), once; None for any other call."""
        captured, self._captured = self._captured, None
        if captured is None or inputs is not self._inputs:
            return None
        return captured

    def clear(self) -> None:
        """Drop the capture (a step, a new draw): its graph holds the batch's activations."""
        self._captured, self._inputs = None, None
