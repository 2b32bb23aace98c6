"""The own loop's one-line refusals and checks, before and during a run: Opacus's options with one meaning here,
the grad_sample_mode a strategy maps to, the optimizer that holds the model's parameters, and the record-alone
comparison (one record's loss and gradient, alone and in its batch) the engine runs on secret draws."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader

from featuredp._validate import check_choice
from featuredp.batches import Batch
from featuredp.clipping import trainable_parameters
from featuredp.dp_wrappers import DPModule
from featuredp.features import PublicFeatureMap
from featuredp.losses import LossSplit

__all__ = ["GRAD_SAMPLE_MODES", "OpacusOptions", "check_make", "check_optimizer_holds", "loss_and_gradient",
           "named_columns", "same_up_to_rounding", "strategy_of"]  # fmt: skip

#: Opacus's grad_sample_mode → featuredp's strategy (both compute the same clipped sum; the replay checks each).
#: Opacus returns the criterion (four values) exactly when the mode's name contains "ghost"; so does featuredp.
#: ``ghost_fsdp``: ghost on a module the user wrapped with ``fully_shard`` (clipping/fsdp.py); any ghost mode runs
#: such a module sharded.
GRAD_SAMPLE_MODES = {"hooks": "ghost", "ew": "ghost", "functorch": "vmap", "ghost": "ghost", "vmap": "vmap",
                     "ghost_fsdp": "ghost"}  # fmt: skip
REFUSED_MODES = {
    "ghost_tp": "tensor-parallel training is not supported; use grad_sample_mode='ghost' on one process or "
                "data-parallel torchrun",
    "no_op": "it computes no per-example gradient, so nothing could be clipped; use grad_sample_mode='ghost' "
             "(or 'hooks')",
}  # fmt: skip

@dataclass(frozen=True)
class OpacusOptions:
    """Opacus options with one meaning here: accepted at their default, refused otherwise (one line each)."""

    clipping: str
    noise_generator: Any
    batch_first: bool
    loss_reduction: str
    wrap_model: bool

    def check(self) -> None:
        """Refuse, in one line, an option whose value means something featuredp does not do."""
        if self.clipping != "flat":
            raise ValueError(f"clipping={self.clipping!r}: featuredp clips each example's whole gradient "
                             "(clipping='flat') only")  # fmt: skip
        if self.noise_generator is not None:
            raise ValueError("noise_generator: the noise's randomness is secret (OS entropy); for a reproducible "
                             "research run give PrivacyEngine(seed=...)")  # fmt: skip
        if not self.batch_first:
            raise ValueError("batch_first=False: featuredp's strategies need batch-first inputs")
        check_choice("loss_reduction", self.loss_reduction, ("mean", "sum"))


def check_optimizer_holds(model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Refuse an optimizer that does not hold the model's trainable parameters: its step would move nothing the
    engine computed, and the run would spend ε on a model that never changes (Opacus #820: ``model.to(device)``
    after ``get_peft_model`` re-created the parameters the optimizer was built on)."""
    params = trainable_parameters(model)
    held = {id(p) for group in optimizer.param_groups for p in group["params"]}
    missing = [k for k, p in params.items() if id(p) not in held]
    if missing:
        raise RuntimeError(f"the optimizer does not hold {len(missing)} of the model's {len(params)} trainable "
                           f"parameters ({missing[0]!r} first): its step would move nothing the private gradient "
                           "reaches (re-created parameters, e.g. model.to(device) after get_peft_model); build the "
                           "optimizer from the model after moving and wrapping it, or freeze what it should not "
                           "train (requires_grad=False)")  # fmt: skip


def strategy_of(grad_sample_mode: str, *, users: bool = False, sharded: bool = False) -> str:
    """featuredp's strategy for an Opacus ``grad_sample_mode`` (one-line refusal of the modes it cannot honour).
    ``users``: a user-level run, which sums each user's per-record gradients before clipping: the per-record modes
    (Opacus's hooks materialise them too) run vmap, and ghost is refused. ``sharded``: the module is wrapped with
    ``fully_shard``, which ``"ghost_fsdp"`` needs."""
    if grad_sample_mode == "ghost_fsdp" and not sharded:
        raise ValueError("grad_sample_mode='ghost_fsdp' needs a module wrapped with torch.distributed.fsdp."
                         "fully_shard (under torchrun); for an unsharded module use grad_sample_mode='ghost'")
    if grad_sample_mode in REFUSED_MODES:
        raise ValueError(f"grad_sample_mode={grad_sample_mode!r}: {REFUSED_MODES[grad_sample_mode]}")
    if grad_sample_mode not in GRAD_SAMPLE_MODES:
        raise ValueError(f"grad_sample_mode must be one of {sorted(GRAD_SAMPLE_MODES)}, got {grad_sample_mode!r}")
    if users and "ghost" in grad_sample_mode:
        raise ValueError(f"grad_sample_mode={grad_sample_mode!r} clips each record's gradient; user-level privacy "
                         "(user_key=) sums a user's records first: use grad_sample_mode='hooks' or 'functorch'")
    return "vmap" if users else GRAD_SAMPLE_MODES[grad_sample_mode]


def check_make(module: nn.Module, optimizer: torch.optim.Optimizer, data_loader: DataLoader,
                criterion: nn.Module | None, poisson_sampling: bool, feature_map: PublicFeatureMap | None,
                loss_split: LossSplit | None) -> nn.Module:  # fmt: skip
    """The one-line refusals of make_private's arguments; returns the criterion (cross-entropy by default)."""
    if not isinstance(module, nn.Module):
        raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
    if isinstance(module, DPModule):
        raise ValueError("module is already private (a DPModule): pass the original model")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
    if not isinstance(data_loader, DataLoader):
        raise TypeError(f"data_loader must be a torch DataLoader, got {type(data_loader).__name__}")
    if not poisson_sampling:
        raise ValueError("poisson_sampling=False: featuredp accounts Poisson (or its cyclic) sampling only; the "
                         "printed ε would not answer the run's question. Use poisson_sampling=True")  # fmt: skip
    criterion = nn.CrossEntropyLoss() if criterion is None else criterion
    if feature_map is not None and loss_split is None and type(criterion) is not nn.CrossEntropyLoss:
        raise ValueError(f"criterion={type(criterion).__name__}: with feature_map= the losses ℓ and ℓ_pub are the "
                         "loss split's (cross-entropy); give loss_split= for another loss")  # fmt: skip
    return criterion


def loss_and_gradient(model: nn.Module, loss_fn: Callable[..., torch.Tensor], batch: Batch, draws: Batch
                       ) -> tuple[float, torch.Tensor] | None:  # fmt: skip
    """One example's loss and flat gradient, in eval mode (no dropout draw can differ between two calls); None
    where the model cannot take the batch (a shape the batch's collate would not make)."""
    params = list(trainable_parameters(model).values())
    was = model.training
    model.eval()
    try:
        loss = loss_fn(model, batch, draws).sum()
        grads = torch.autograd.grad(loss, params, allow_unused=True)
    except (RuntimeError, ValueError, IndexError):
        return None
    finally:
        model.train(was)
    flat = torch.cat([(torch.zeros_like(p) if g is None else g).reshape(-1).double() for p, g in zip(params, grads)])
    return float(loss.detach()), flat


def same_up_to_rounding(a: tuple[float, torch.Tensor], b: tuple[float, torch.Tensor]) -> bool:
    """Equal up to float32 rounding: the loss within 1e-4 relative, the gradient within 1e-3 of its norm."""
    (la, ga), (lb, gb) = a, b
    if not math.isclose(la, lb, rel_tol=1e-4, abs_tol=1e-6):
        return False
    scale = float(ga.norm() + gb.norm())
    return float((ga - gb).norm()) <= 1e-3 * scale + 1e-7


def named_columns(names: Any) -> Any:
    """A stand-in dataset that names the loader's columns (``feature_names=``) for binding a column map."""
    names = [str(c) for c in names]
    return SimpleNamespace(name="loader", feature_names=names, feature_sources=list(names), label_name="y",
                           statistics_from_data=None, statistics_warned=[], column_types=None,
                           default_private=[])  # fmt: skip
