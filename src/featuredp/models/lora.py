"""LoRA adapters: train a low-rank update of chosen projections and freeze everything else.

:func:`add_lora` replaces each targeted ``nn.Linear`` (or transformers' ``Conv1D``, GPT-2's projections) by
a :class:`LoRA` module computing ``base(x) + (alpha / rank) · up(down(x))``, where ``down`` and ``up`` are
plain bias-free ``nn.Linear`` layers (``up`` starts at zero, so the adapted model starts as the base model),
and sets ``requires_grad=False`` on every other parameter. Private training then clips and noises only the
adapters' parameters (``featuredp.clipping.trainable_parameters``), and ghost clipping covers them with its
exact Linear rule; the frozen layers are not differentiated at all.

>>> from torch import nn
>>> model = add_lora(nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 2)), rank=2, targets=("0",))
>>> sorted(lora_parameters(model))
['0.down.weight', '0.up.weight']
>>> [n for n, p in model.named_parameters() if p.requires_grad] == sorted(lora_parameters(model))
True
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence

import torch
from torch import nn

from featuredp._validate import check_int, check_positive

__all__ = ["LoRA", "add_lora", "lora_parameters", "merge_lora"]

#: Default targets: GPT-2's attention (c_attn, c_proj) and MLP (c_fc, c_proj) projections.
DEFAULT_TARGETS = ("c_attn", "c_proj", "c_fc")

Targets = Sequence[str] | Callable[[str, nn.Module], bool]


def _conv1d_type() -> type[nn.Module] | None:
    """transformers' Conv1D if transformers is loaded (a model holding one has loaded it), without importing it."""
    module = sys.modules.get("transformers.pytorch_utils")
    return getattr(module, "Conv1D", None)


def _is_conv1d(m: nn.Module) -> bool:
    conv1d = _conv1d_type()
    return conv1d is not None and type(m) is conv1d


def _adaptable(m: nn.Module) -> bool:
    return type(m) is nn.Linear or _is_conv1d(m)


def _features(base: nn.Module) -> tuple[int, int]:
    """(in, out) features of a Linear (weight (out, in)) or a Conv1D (weight (in, out))."""
    weight = base.weight
    assert isinstance(weight, torch.Tensor)
    if _is_conv1d(base):
        return int(weight.shape[0]), int(weight.shape[1])
    return int(weight.shape[1]), int(weight.shape[0])


class LoRA(nn.Module):
    """``base(x) + scale · up(down(x))`` with ``scale = alpha / rank``; ``down``, ``up`` bias-free ``nn.Linear``.

    ``base`` is an ``nn.Linear`` or a transformers ``Conv1D``; it is kept as it is (frozen by
    :func:`add_lora`). ``up`` starts at zero; ``down`` gets nn.Linear's default initialisation, drawn from
    ``generator`` when given (the global torch RNG otherwise).
    """

    def __init__(
        self, base: nn.Module, rank: int = 8, alpha: float = 16.0, *, generator: torch.Generator | None = None
    ) -> None:
        super().__init__()
        if not _adaptable(base):
            raise TypeError(f"LoRA adapts nn.Linear or transformers' Conv1D layers, got {type(base).__name__}")
        self.rank = check_int("rank", rank, minimum=1)
        self.alpha = check_positive("alpha", alpha)
        self.scale = self.alpha / self.rank
        n_in, n_out = _features(base)
        weight = base.weight
        assert isinstance(weight, torch.Tensor)
        kw = {"device": weight.device, "dtype": weight.dtype}
        self.base = base
        # skip_init: the default initialisation would draw from the global torch RNG (even with a generator).
        self.down = nn.utils.skip_init(nn.Linear, n_in, self.rank, bias=False, **kw)
        self.up = nn.utils.skip_init(nn.Linear, self.rank, n_out, bias=False, **kw)
        with torch.no_grad():
            # nn.Linear's default (Kaiming uniform with a = √5): U(−1/√in, 1/√in).
            bound = 1.0 / n_in**0.5
            draw = torch.empty(self.down.weight.shape, dtype=torch.float32)
            draw.uniform_(-bound, bound, generator=generator)
            self.down.weight.copy_(draw)
            self.up.weight.zero_()

    def extra_repr(self) -> str:
        """rank, alpha and scale."""
        return f"rank={self.rank}, alpha={self.alpha}, scale={self.scale}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The base layer's output plus the scaled low-rank update."""
        return self.base(x) + self.scale * self.up(self.down(x))

    def delta(self) -> torch.Tensor:
        """The update of the base weight, in the base weight's layout ((out, in) for Linear, (in, out) for Conv1D)."""
        update = self.scale * (self.up.weight @ self.down.weight)  # (out, in)
        return update.t() if _is_conv1d(self.base) else update


def _selector(targets: Targets) -> Callable[[str, nn.Module], bool]:
    if callable(targets):
        return targets
    if isinstance(targets, str) or not all(isinstance(t, str) and t for t in targets) or not len(targets):
        raise ValueError(f"targets must be a list of layer names or a predicate (name, module) -> bool, got "
                         f"{targets!r}")  # fmt: skip
    names = set(targets)
    # A name matches a module's own (last) name ("c_attn" matches "transformer.h.0.attn.c_attn") or its full name.
    return lambda name, module: name in names or name.rsplit(".", 1)[-1] in names


def add_lora(
    model: nn.Module,
    *,
    rank: int = 8,
    alpha: float = 16.0,
    targets: Targets = DEFAULT_TARGETS,
    seed: int | None = None,
) -> nn.Module:
    """Wrap the targeted layers of ``model`` in :class:`LoRA` adapters and freeze every other parameter (in place).

    ``targets`` are layer names, matched against a module's last name or its full dotted name (default: GPT-2's
    ``c_attn``, ``c_proj``, ``c_fc``), or a predicate ``(full_name, module) -> bool``. Targeted layers must be
    ``nn.Linear`` or transformers' ``Conv1D``; a target that matches no layer is a ValueError. ``seed`` draws
    the adapters' initial ``down`` weights from its own generator (the global torch RNG is left alone).
    Returns ``model``, whose trainable parameters are now the adapters' ``down`` and ``up`` weights only.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    rank = check_int("rank", rank, minimum=1)
    alpha = check_positive("alpha", alpha)
    if any(isinstance(m, LoRA) for m in model.modules()):
        raise ValueError("model already has LoRA adapters: merge_lora(model) first, or train the ones it has")
    select = _selector(targets)
    chosen: list[tuple[str, nn.Module]] = []
    for name, module in model.named_modules():
        if not name or not select(name, module):
            continue
        if not _adaptable(module):
            if not callable(targets) and any(True for _ in module.children()):
                continue  # a container sharing a target's name (e.g. an "attn" block): its layers are matched instead
            raise ValueError(f"targets={targets!r} selects layer {name!r} ({type(module).__name__}); LoRA adapts "
                             "nn.Linear and transformers' Conv1D layers only")  # fmt: skip
        chosen.append((name, module))
    if not chosen:
        raise ValueError(f"targets={targets!r} match no nn.Linear or Conv1D layer of the model")
    generator = None
    if seed is not None:
        generator = torch.Generator().manual_seed(check_int("seed", seed))
    for p in model.parameters():
        p.requires_grad_(False)
    for name, module in chosen:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        setattr(parent, child, LoRA(module, rank, alpha, generator=generator))
    return model


def lora_parameters(model: nn.Module) -> dict[str, nn.Parameter]:
    """The adapters' parameters by name (``...c_attn.down.weight``, ``...c_attn.up.weight``)."""
    out: dict[str, nn.Parameter] = {}
    for name, module in model.named_modules():
        if isinstance(module, LoRA):
            prefix = f"{name}." if name else ""
            for attr in ("down", "up"):
                out[f"{prefix}{attr}.weight"] = getattr(module, attr).weight
    return out


def merge_lora(model: nn.Module) -> nn.Module:
    """Fold every adapter into its base layer's weight and put the base layer back in its place (in place).

    The merged model computes the same function without the adapters (a plain model again: it saves and
    loads like the original architecture). Parameters keep their ``requires_grad`` (the base layers stay frozen).
    """
    wrapped = [(name, m) for name, m in model.named_modules() if isinstance(m, LoRA)]
    if isinstance(model, LoRA):
        raise ValueError("model is itself a LoRA module, which cannot replace itself: merge the model holding it")
    for name, module in wrapped:
        weight = module.base.weight
        assert isinstance(weight, torch.Tensor)
        with torch.no_grad():
            weight.add_(module.delta().to(weight.dtype))
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name), child, module.base)
    return model
