"""The private model's output as the user's loop sees it: values without a graph, and a loss on them made private.

Opacus's tutorials build the loss themselves (``criterion = nn.CrossEntropyLoss()`` after ``make_private``, or
``F.cross_entropy(output, target)``). The wrapped model returns its output as a :class:`PrivateOutput`: the same
values, no graph, and a ``__torch_function__`` that recognises a loss function of ``torch.nn.functional`` called on
it (directly, through an ``nn`` loss module, on the output's ``.logits`` or a batch-first reshape of it). That call
returns the engine's :class:`featuredp.dp_wrappers.DPLoss`, whose ``backward()`` is the clipped sum of the same loss
recomputed per example: the loop needs no criterion from featuredp.

Any other computation on the output (``argmax`` for an accuracy, ``softmax``) gives values as usual, without a
graph; a loss the engine cannot recompute per example (a shift or slice of the output before the loss, a hand-made
loss) gives nothing to differentiate, and its ``backward()`` fails with PyTorch's error: the engine's refusal names
the fix where it can see the call (``DPCriterion``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch.nn import functional

__all__ = ["LOSS_FUNCTIONS", "FunctionalLoss", "PrivateOutput", "plain", "wrap_output"]

#: The loss functions recomputed per example (each takes ``reduction``); anything else is not a private loss.
LOSS_FUNCTIONS: tuple[Callable[..., torch.Tensor], ...] = (
    functional.cross_entropy, functional.nll_loss, functional.mse_loss, functional.l1_loss, functional.smooth_l1_loss,
    functional.huber_loss, functional.binary_cross_entropy, functional.binary_cross_entropy_with_logits,
    functional.soft_margin_loss, functional.poisson_nll_loss, functional.kl_div,
)  # fmt: skip
_IGNORING = (functional.cross_entropy, functional.nll_loss)  # the ones with ignore_index


class FunctionalLoss:
    """A ``torch.nn.functional`` loss with its keyword arguments, callable as a criterion ``(output, target)``;
    ``reduction`` may be set (the engine sets ``"none"`` to read each example's loss)."""

    def __init__(self, func: Callable[..., torch.Tensor], arguments: dict[str, Any]) -> None:
        self.func = func
        self.arguments = {k: v for k, v in arguments.items() if k not in ("reduction", "size_average", "reduce")}
        self.reduction = str(arguments.get("reduction", "mean"))
        if func in _IGNORING:
            self.ignore_index = int(arguments.get("ignore_index", -100))

    @property
    def is_cross_entropy(self) -> bool:
        """Whether this is ``cross_entropy`` (the loss the feature-DP splits compute)."""
        return self.func is functional.cross_entropy

    def __call__(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """The loss at this object's ``reduction``."""
        return self.func(output, target, reduction=self.reduction, **self.arguments)

    def __repr__(self) -> str:
        return f"{self.func.__name__}(reduction={self.reduction!r})"


class PrivateOutput(torch.Tensor):
    """A private batch's output (see the module docstring): a loss function called on it is the engine's."""

    _engine: Any

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        engine = _engine_of(args, kwargs)
        if func in LOSS_FUNCTIONS and engine is not None:
            bound = inspect.signature(func).bind(*args, **kwargs)
            arguments = dict(bound.arguments)
            output, target = arguments.pop("input"), arguments.pop("target")
            return engine._loss_of(output, plain(target), FunctionalLoss(func, arguments))
        out = super().__torch_function__(func, types, args, kwargs)
        _tag(out, engine)
        return out


def wrap_output(out: Any, engine: Any) -> Any:
    """``out`` (a tensor, or an output with ``.logits``) with its tensor as a :class:`PrivateOutput` of ``engine``."""
    if isinstance(out, torch.Tensor):
        wrapped = out.as_subclass(PrivateOutput)
        wrapped._engine = engine
        return wrapped
    logits = getattr(out, "logits", None)
    if isinstance(logits, torch.Tensor):
        out.logits = wrap_output(logits, engine)
    return out


def plain(t: Any) -> Any:
    """A :class:`PrivateOutput` as a plain tensor (the same storage); anything else as it is."""
    return t.as_subclass(torch.Tensor) if isinstance(t, PrivateOutput) else t


def _engine_of(args: Any, kwargs: Any) -> Any:
    for a in (*args, *kwargs.values()):
        if isinstance(a, PrivateOutput):
            return getattr(a, "_engine", None)
        if isinstance(a, list | tuple):
            found = _engine_of(a, {})
            if found is not None:
                return found
    return None


def _tag(out: Any, engine: Any) -> None:
    if isinstance(out, PrivateOutput):
        out._engine = engine
    elif isinstance(out, list | tuple):
        for o in out:
            _tag(o, engine)
