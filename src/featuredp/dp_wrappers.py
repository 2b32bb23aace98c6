"""The wrapped objects :meth:`featuredp.privacy_engine.PrivacyEngine.make_private` returns for the user's loop.

- :class:`DPModule`: the model; a call records its inputs and answers without a graph, under the forward guard.
- :class:`DPCriterion` / :class:`DPLoss`: the criterion; ``loss.backward()`` is the engine's clipped sum of the
  per-example losses (:class:`PerExampleLoss` recomputes them as the user's loop computed the batch's).
- :class:`DPOptimizer`: the optimizer; ``step()`` is the engine's noisy step, then the user's optimizer's.
- the loader, its batches drawn by the run's secret sampler, is :mod:`featuredp.private_loader`'s.
"""

from __future__ import annotations

import copy
import math
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from featuredp._keys import Uncopyable
from featuredp.batches import Batch
from featuredp.errors import PrivacyLeakWarning
from featuredp.private_output import plain

# The engine is typed Any here: this module is what featuredp.privacy_engine returns, and imports nothing back.
PrivacyEngine = Any

# A copy of a wrapper would reach the run's engine, hence its secret streams (pickled: written out).
_WRAPPER_NOT_COPIED = ("the private wrapper holds the run's secret sampler and noise state: save model.state_dict() "
                       "(or the original model) instead of pickling or copying the wrapper")

__all__ = ["DPCriterion", "DPLoss", "DPModule", "DPOptimizer", "PerExampleLoss", "output_transform", "unwrap"]


class DPModule(Uncopyable, nn.Module):
    """The user's model, private: a call records its inputs for the engine and returns the output without a graph.

    ``_module`` is the original model; its parameters are the ones trained. The wrapper refuses to be pickled or
    copied (it reaches the run's secret state); its ``state_dict()`` is the original model's.
    """

    _not_copied = _WRAPPER_NOT_COPIED

    _engine: PrivacyEngine

    def __init__(self, module: nn.Module, engine: PrivacyEngine) -> None:
        super().__init__()
        self._module = module
        object.__setattr__(self, "_engine", engine)  # not a submodule: never in state_dict()

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """The model's output on the batch (no graph: the gradient is the engine's, at ``loss.backward()``)."""
        module: nn.Module = self._module
        return self._engine._forward(module, args, kwargs)

    def __getattr__(self, name: str) -> Any:
        """The original model's public attributes (``generate``, ``save_pretrained``, ``config``), as Opacus's
        ``GradSampleModule`` forwards them; its parameters and submodules stay reachable as ``_module``'s."""
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name.startswith("_"):
                raise
            return getattr(self._module, name)

    def state_dict(self, *args: Any, **kwargs: Any) -> Any:
        """The original model's state dict (keys without a wrapper prefix)."""
        return self._module.state_dict(*args, **kwargs)

    def load_state_dict(self, *args: Any, **kwargs: Any) -> Any:
        """Load into the original model."""
        return self._module.load_state_dict(*args, **kwargs)


class DPCriterion(Uncopyable):
    """The user's criterion, private: returns a :class:`DPLoss` whose ``backward()`` is the engine's clipped sum."""

    _not_copied = _WRAPPER_NOT_COPIED

    def __init__(self, criterion: Any, engine: PrivacyEngine) -> None:
        if not hasattr(criterion, "reduction"):
            raise TypeError(f"criterion must be a torch.nn loss module with a reduction (e.g. nn.CrossEntropyLoss()), "
                            f"got {type(criterion).__name__}")  # fmt: skip
        self.criterion = criterion
        self._engine = engine

    def __call__(self, output: Any, target: torch.Tensor) -> DPLoss:
        """The loss of ``output`` (the private model's output, or a reshape of it) against ``target``."""
        engine = self._engine
        seen = engine._output
        transform = _transform(output, seen)
        with torch.no_grad():  # on plain tensors: the output's loss functions are the engine's (private_output)
            value = self.criterion(plain(output), plain(target))
        loss = DPLoss(value, engine, self.criterion, transform, engine._inputs, target)
        engine._inputs, engine._output = None, None  # one loss per forward
        return loss


class DPLoss:
    """A private batch's loss: ``backward()`` computes the clipped per-example gradient sum (not ``.grad`` of
    this value). Reading the value (``item()``) reads the private batch: not covered by ε (warned once)."""

    _warned = False

    def __init__(self, value: torch.Tensor, engine: PrivacyEngine, criterion: Any, transform: Callable[[Any], Any],
                 inputs: Any, target: torch.Tensor) -> None:  # fmt: skip
        self.value = value
        self._engine = engine
        self.criterion = criterion
        self.transform = transform
        self.inputs = inputs
        self.target = target

    def backward(self, *args: Any, **kwargs: Any) -> None:
        """Σ_i clip_C ∇ℓ_i over the batch, kept by the engine for ``optimizer.step()``."""
        self._engine._backward(self)

    def item(self) -> float:
        """The batch's mean loss (the private batch's: not covered by ε)."""
        if not DPLoss._warned:
            DPLoss._warned = True
            warnings.warn("loss.item() reads the loss of a private batch, which the guarantee does not cover: keep "
                          "it out of anything you publish (the engine's public_loss is covered)",
                          PrivacyLeakWarning, stacklevel=2)  # fmt: skip
        return float(self.value)

    def __float__(self) -> float:
        return self.item()

    def detach(self) -> torch.Tensor:
        """The value, as a tensor without a graph."""
        return self.value.detach()


class DPOptimizer(Uncopyable, torch.optim.Optimizer):
    """The user's optimizer, private: ``step()`` adds the noise, divides by the expected batch size, adds the
    public term, counts the step and applies the original optimizer. Exposes Opacus's ``noise_multiplier``,
    ``max_grad_norm``, ``expected_batch_size`` and ``original_optimizer``."""

    _not_copied = _WRAPPER_NOT_COPIED

    def __init__(self, optimizer: torch.optim.Optimizer, engine: PrivacyEngine) -> None:
        # Not Optimizer.__init__: this object shares the original's param_groups and state.
        self.original_optimizer = optimizer
        self._engine = engine
        plan = engine.plan
        self.noise_multiplier = float(plan.noise_multiplier or 0.0)
        self.max_grad_norm = float(plan.max_grad_norm or math.inf)
        self.expected_batch_size = plan.expected_batch_size
        self.defaults = optimizer.defaults

    @property
    def param_groups(self) -> list[dict[str, Any]]:  # type: ignore[override]
        """The original optimizer's parameter groups (a learning-rate scheduler may edit them)."""
        return self.original_optimizer.param_groups

    @property
    def state(self) -> Any:  # type: ignore[override]
        """The original optimizer's state."""
        return self.original_optimizer.state

    def step(self, closure: Any = None) -> Any:
        """One private step on the batch of the last ``loss.backward()``."""
        return self._engine._step(self.original_optimizer, closure)

    def signal_skip_step(self, do_skip: bool = True) -> None:
        """Opacus's skip-step protocol (``BatchMemoryManager``): with ``do_skip`` the next ``step()`` only keeps the
        clipped sum of the physical chunk just backpropagated; the logical batch's last chunk steps."""
        self._engine._skip_next = bool(do_skip)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the gradients (the engine's pending sum is kept until ``step``)."""
        self.original_optimizer.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        """The original optimizer's state dict."""
        return self.original_optimizer.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load into the original optimizer."""
        self.original_optimizer.load_state_dict(state_dict)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Refused: the run's noise covers the parameters it was planned with."""
        raise ValueError("add_param_group after make_private: the noise is planned for the original parameters")

    def __repr__(self) -> str:
        return f"DPOptimizer({self.original_optimizer!r}, σ={self.noise_multiplier:g}, C={self.max_grad_norm:g})"


class PerExampleLoss:
    """ℓ_i of the user's criterion for each example: the model called as the user called it, the output reshaped
    as the user reshaped it, the criterion at reduction ``"none"`` and each example's elements reduced alone."""

    def __init__(self, criterion: Any, transform: Callable[[Any], Any], nargs: int,
                 constants: tuple[dict[str, Any], dict[str, Any]], tail: tuple[int, ...]) -> None:  # fmt: skip
        self.criterion = copy.copy(criterion)
        self.tail = tail  # the target's shape after the first dimension, as the user passed it
        self.mean = criterion.reduction == "mean"
        self.criterion.reduction = "none"
        self.transform = transform
        self.nargs = nargs
        self.constants = constants
        self.ignore = getattr(criterion, "ignore_index", None)
        self.counted = getattr(criterion, "counted", None)  # a criterion that knows its own counted elements

    def __call__(self, model: nn.Module, batch: Batch, draws: Batch) -> torch.Tensor:
        """ℓ_i for every example of ``batch`` (shape (B,))."""
        args = [batch[f"arg{i}"] if f"arg{i}" in batch else self.constants[0][f"arg{i}"] for i in range(self.nargs)]
        kwargs = {k[3:]: v for k, v in batch.items() if k.startswith("kw:")} | self.constants[1]
        y = batch["y"]
        size = int(y.shape[0])
        per = _rows(self.criterion(self.transform(model(*args, **kwargs)), y.reshape(-1, *self.tail)), size)
        if not self.mean:
            return per.sum(1)
        if self.counted is not None:  # a mean over each example's own counted elements, as the criterion counts
            return per.sum(1) / self.counted(_rows(y, size)).clamp(min=1)
        if self.ignore is not None:
            counted = (_rows(y, size) != self.ignore).sum(1).clamp(min=1)
            return per.sum(1) / counted
        return per.mean(1)


def _rows(t: torch.Tensor, size: int) -> torch.Tensor:
    """``t`` as ``size`` rows; a batch of no rows (a sharded model's rank with nothing to do, clipping/fsdp.py) as
    (0, 1)."""
    return t.reshape(size, -1) if size else t.reshape(0, 1)


def _identity(out: Any) -> Any:
    return out


def _transform(output: Any, seen: Any) -> Callable[[Any], Any]:
    """How the user turned the model's output into the criterion's input: itself, its ``logits``, or a reshape
    (``logits.view(-1, V)``). Anything else is refused: the engine must be able to recompute it per example."""
    if seen is None:
        raise RuntimeError("the criterion was called without a fresh output of the private model: call "
                           "criterion(model(x), y) with the model make_private returned")  # fmt: skip
    if output is seen:
        return _identity
    base = getattr(seen, "logits", None)
    source: Callable[[Any], Any] = _identity
    if base is not None and isinstance(base, torch.Tensor):
        source = _logits
    else:
        base = seen
    if output is base:
        return source
    if isinstance(output, torch.Tensor) and isinstance(base, torch.Tensor) and output.numel() == base.numel() and (
            output.data_ptr() == base.data_ptr()):  # fmt: skip
        tail = tuple(output.shape[1:])
        return _Reshape(source, tail)
    raise TypeError("the criterion must get the private model's output, its .logits, or a reshape of either "
                    "(e.g. logits.view(-1, V)); compute anything else (a shift, a slice) inside the criterion")


def output_transform(output: Any, seen: Any) -> Callable[[Any], Any]:
    """How ``output`` was made from the model's output ``seen`` (itself, its ``.logits``, a reshape); refused in one
    line otherwise."""
    return _transform(output, seen)


def _logits(out: Any) -> Any:
    return out.logits


class _Reshape:
    def __init__(self, source: Callable[[Any], Any], tail: tuple[int, ...]) -> None:
        self.source, self.tail = source, tail

    def __call__(self, out: Any) -> Any:
        return self.source(out).reshape(-1, *self.tail)


def unwrap(module: nn.Module) -> nn.Module:
    """The user's model inside a :class:`DPModule` (or ``module`` itself)."""
    if isinstance(module, DPModule):
        inner: nn.Module = module._module
        return inner
    return module
