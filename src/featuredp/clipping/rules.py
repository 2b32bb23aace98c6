"""Per-layer rules for ghost (book-keeping) clipping.

Each supported layer turns what its forward hook saw (inputs, output) and the
gradient of the summed loss with respect to that output into *contributions*
(:mod:`featuredp.clipping.contributions`: :class:`~featuredp.clipping.contributions.Outer`,
:class:`~featuredp.clipping.contributions.Passes`, :class:`~featuredp.clipping.contributions.Rows`,
:class:`~featuredp.clipping.contributions.Dense`) to the per-example gradient of each of its
parameters, without materialising per-example gradients where that is expensive. The rules only
build contributions; their norms, sums and cross terms are the contributions' own.

Add a layer rule (two files):

1. ``src/featuredp/clipping/rules.py`` — write the rule and register it for the exact
   module type(s) with :func:`register_rule`::

       @register_rule(nn.MyLayer, unsupported=lambda m: "mode='x'" if m.mode == "x" else "")
       def _my_layer(m: nn.MyLayer, args: tuple[Any, ...], kwargs: dict[str, Any], grad: torch.Tensor,
                     B: int, name: str) -> dict[str, Contribution]:
           x = _input(args, kwargs, name)  # the first argument, positional or keyword
           _lead(x, B, name)  # NotPerExampleError unless the first dimension is the batch of B examples
           return {"weight": Outer(...), "bias": Dense(...)}

   ``args``/``kwargs`` are what the layer's ``forward`` received, ``grad`` the gradient of
   Σ_i loss_i with respect to its output (row i belongs to example i), and the result maps
   the module's parameter attribute names to contributions of the existing kinds (a
   parameter missing from it gets no gradient from that call). ``unsupported`` (optional)
   returns a non-empty reason for module configurations the rule cannot handle; those fall
   back to torch.func with that reason. Nothing else changes: :func:`rule_for` reads the
   registry, :class:`~featuredp.clipping.ghost.GhostGradients` hooks every registered layer,
   and a once-per-model check against autograd catches a rule that misses part of a gradient.
   Types are matched exactly (a subclass may override ``forward``): register each one. A layer
   of your own is registered the same way from your code (``featuredp.clipping.register_rule``).
2. ``tests/clipping/test_ghost.py`` — a test that the new layer matches per-example autograd,
   single pass and FDP's two passes: ``assert_matches(model, single(), batch)`` and
   ``assert_matches(model, double(), batch, {"pad": ...})``.

A new *kind* of contribution is one subclass of
:class:`~featuredp.clipping.contributions.Contribution` in
:mod:`featuredp.clipping.contributions`.

>>> from torch import nn
>>> rule, reason = rule_for(nn.Linear(3, 2))
>>> rule is not None, reason
(True, '')
>>> rule_for(nn.PReLU())[1]
'no ghost rule for this layer type'
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from torch import nn
from torch.nn import functional as nnf

from featuredp.clipping.contributions import Contribution, Dense, Outer, Rows
from featuredp.clipping.fsdp import plain_type

__all__ = [
    "RULES",
    "LayerRule",
    "NotPerExampleError",
    "Rule",
    "linear_rule",
    "register_rule",
    "rule_for",
]


class NotPerExampleError(ValueError):
    """A supported layer saw an input whose first dimension is not the batch of examples."""


# ---------------------------------------------------------------------------------------------------------
# Layer rules. A rule reads the forward hook's (args, kwargs) and the output gradient and returns
# {parameter attribute name: contribution}. ``B`` is the number of examples.

#: ``rule(module, args, kwargs, output_grad, B, layer_name) -> {parameter attribute: contribution}``.
Rule = Callable[[Any, tuple[Any, ...], dict[str, Any], torch.Tensor, int, str], dict[str, Contribution]]
_RuleT = TypeVar("_RuleT", bound=Rule)


@dataclass(frozen=True)
class LayerRule:
    """A registered ghost rule and the module configurations it does not handle."""

    rule: Rule
    #: A non-empty reason when a module instance's configuration is outside the rule (it then falls back).
    unsupported: Callable[[Any], str] | None = None


#: Exact module types with a ghost rule (subclasses may override ``forward``, so they fall back).
RULES: dict[type[nn.Module], LayerRule] = {}


def register_rule(
    *types: type[nn.Module], unsupported: Callable[[Any], str] | None = None
) -> Callable[[_RuleT], _RuleT]:
    """Decorator registering a ghost rule for the exact module ``types`` (see "Add a layer rule" above).

    ``unsupported(module)`` returns a non-empty reason for configurations the rule cannot handle. A type
    that already has a rule is refused (replace it by deleting ``RULES[type]`` first, deliberately).
    """
    if not types:
        raise ValueError("register_rule needs at least one module type")

    for t in types:
        if not (isinstance(t, type) and issubclass(t, nn.Module)):
            raise TypeError(f"register_rule takes nn.Module subclasses, got {t!r}")

    def decorate(rule: _RuleT) -> _RuleT:
        for t in types:  # all or nothing
            if t in RULES:
                raise ValueError(f"{t.__name__} already has a ghost rule ({getattr(RULES[t].rule, '__name__', '?')})")
        for t in types:
            RULES[t] = LayerRule(rule, unsupported)
        return rule

    return decorate


def rule_for(module: nn.Module) -> tuple[Rule | None, str]:
    """The rule for ``module`` and, when there is none, the reason (for the fallback report)."""
    entry = RULES.get(plain_type(module))  # an FSDP-wrapped Linear is a Linear
    if entry is None:
        return None, "no ghost rule for this layer type"
    reason = entry.unsupported(module) if entry.unsupported is not None else ""
    if reason:
        return None, reason
    return entry.rule, ""


def _lead(t: torch.Tensor, batch_size: int, layer: str) -> None:
    """NotPerExampleError unless the first dimension of ``t`` is the batch of examples."""
    if t.dim() == 0 or t.shape[0] != batch_size:
        raise NotPerExampleError(
            f"layer {layer!r} was called with an input of shape {tuple(t.shape)} whose first dimension is not "
            f"the batch of {batch_size} examples"
        )


def _input(args: tuple[Any, ...], kwargs: dict[str, Any], layer: str, key: str = "input") -> torch.Tensor:
    """The layer's first argument (positional, or the keyword ``key``), which must be a tensor."""
    x = args[0] if args else kwargs[key]
    if not isinstance(x, torch.Tensor):
        raise NotPerExampleError(f"layer {layer!r} was called with a {type(x).__name__}, not a tensor")
    return x


@register_rule(nn.Linear)
def linear_rule(
    m: nn.Linear, args: tuple[Any, ...], kwargs: dict[str, Any], grad: torch.Tensor, B: int, name: str
) -> dict[str, Contribution]:
    """The rule of ``nn.Linear`` and of Linear layers called with a column subset (``columns=``, the second argument).

    :class:`featuredp.models.layers.ColumnLinear` registers it for itself: the models build on clipping, never the
    reverse.
    """
    x = _input(args, kwargs, name)
    columns = args[1] if len(args) > 1 else kwargs.get("columns")  # ColumnLinear's column subset
    if x.dim() < 2:
        raise NotPerExampleError(f"layer {name!r} was called without a batch dimension (input {tuple(x.shape)})")
    _lead(x, B, name)
    a = x.reshape(B, -1, 1, x.shape[-1])
    g = grad.reshape(B, -1, 1, m.out_features)
    out: dict[str, Contribution] = {"weight": Outer(a, g, m.weight.shape, columns)}
    if m.bias is not None:
        out["bias"] = Dense(grad if grad.dim() == 2 else g.sum((1, 2)))  # one token: no sum, no copy
    return out


def _without_padding(
    example: torch.Tensor, index: torch.Tensor, *values: torch.Tensor, padding_idx: int | None
) -> tuple[torch.Tensor, ...]:
    """Drop the tokens that look up the padding row (PyTorch gives the padding row no gradient)."""
    if padding_idx is None:
        return (example, index, *values)
    keep = index != padding_idx
    return (example[keep], index[keep], *(v[keep] for v in values))


@register_rule(nn.Embedding, unsupported=lambda m: "scale_grad_by_freq" if m.scale_grad_by_freq else "")
def _embedding(
    m: nn.Embedding, args: tuple[Any, ...], kwargs: dict[str, Any], grad: torch.Tensor, B: int, name: str
) -> dict[str, Contribution]:
    idx = _input(args, kwargs, name)
    _lead(idx, B, name)
    flat = idx.reshape(-1).long()
    per = flat.numel() // B
    example = torch.arange(B, device=flat.device).repeat_interleave(per)
    ex, ix, val = _without_padding(example, flat, grad.reshape(-1, m.embedding_dim), padding_idx=m.padding_idx)
    return {"weight": Rows(ex, ix, val, B, m.weight.shape)}


def _embedding_bag_unsupported(m: nn.EmbeddingBag) -> str:
    if m.mode == "max":
        return f"mode={m.mode!r}"
    return "scale_grad_by_freq" if m.scale_grad_by_freq else ""


@register_rule(nn.EmbeddingBag, unsupported=_embedding_bag_unsupported)
def _embedding_bag(
    m: nn.EmbeddingBag, args: tuple[Any, ...], kwargs: dict[str, Any], grad: torch.Tensor, B: int, name: str
) -> dict[str, Contribution]:
    names = ("input", "offsets", "per_sample_weights")
    given = dict(zip(names, args))
    given.update({k: v for k, v in kwargs.items() if k in names})
    idx = _input((given["input"],), {}, name)
    offsets: torch.Tensor | None = given.get("offsets")
    psw: torch.Tensor | None = given.get("per_sample_weights")
    if grad.shape[0] != B:
        raise NotPerExampleError(f"layer {name!r} produced {grad.shape[0]} bags for a batch of {B} examples")
    if idx.dim() == 2:
        flat = idx.reshape(-1).long()
        example = torch.arange(B, device=flat.device).repeat_interleave(idx.shape[1])
    else:
        if offsets is None:  # PyTorch itself refuses 1-d input without offsets
            raise NotPerExampleError(f"layer {name!r} was called with 1-d input and no offsets")
        flat = idx.long()
        starts = offsets.long()
        if m.include_last_offset:
            ends = starts[1:]
            starts = starts[:-1]
        else:
            ends = torch.cat([starts[1:], starts.new_tensor([flat.numel()])])
        lengths = ends - starts
        example = torch.arange(B, device=flat.device).repeat_interleave(lengths)
        # Tokens after the last bag's end (possible with include_last_offset) belong to no bag.
        flat = flat[: int(lengths.sum())] if m.include_last_offset else flat
        if psw is not None and m.include_last_offset:
            psw = psw[: flat.numel()]
    weights = psw.reshape(-1).to(grad.dtype) if psw is not None else torch.ones_like(flat, dtype=grad.dtype)
    example, flat, weights = _without_padding(example, flat, weights, padding_idx=m.padding_idx)
    if m.mode == "mean":
        # The mean is over the bag's non-padding entries.
        counts = torch.zeros(B, dtype=grad.dtype, device=grad.device).index_add_(0, example, torch.ones_like(weights))
        weights = weights / counts.clamp(min=1)[example]
    value = grad[example] * weights.unsqueeze(1)
    return {"weight": Rows(example, flat, value, B, m.weight.shape)}


def _same_padding(kernel: Sequence[int], dilation: Sequence[int]) -> list[int]:
    # nnf.pad order (last dim first): PyTorch's 'same' puts the odd extra pixel on the right/bottom.
    pads: list[int] = []
    for k, d in zip(reversed(kernel), reversed(dilation)):
        total = d * (k - 1)
        pads += [total // 2, total - total // 2]
    return pads


def _patches(x: torch.Tensor, kernel: Sequence[int], dilation: Sequence[int], padding: Sequence[int],
             stride: Sequence[int]) -> torch.Tensor:  # fmt: skip
    """The convolution's input patches of a (B, C, H, W) input, (B, L, C·kh·kw) with L = H'·W' positions: what
    ``nnf.unfold`` gives, transposed, with its features in the weight's (C, kh, kw) order.

    Why not ``nnf.unfold``: its CPU kernel (im2col) took 0.2–0.3 ms for the tutorial CNN's small inputs and 74 ms at
    256 × 64 × 16 × 16, against 0.04, 0.24 and 53 ms for these strided views and one copy, which also does the
    transpose that ``unfold``'s layout needed afterwards."""
    (kh, kw), (dh, dw), (ph, pw), (sh, sw) = kernel, dilation, padding, stride
    if ph or pw:
        x = nnf.pad(x, (pw, pw, ph, ph))
    windows = x.unfold(2, dh * (kh - 1) + 1, sh).unfold(3, dw * (kw - 1) + 1, sw)  # (B, C, H', W', eh, ew)
    windows = windows[..., ::dh, ::dw]  # (B, C, H', W', kh, kw)
    B, C, Ho, Wo = windows.shape[:4]
    return windows.permute(0, 2, 3, 1, 4, 5).reshape(B, Ho * Wo, C * kh * kw)


@register_rule(nn.Conv1d, nn.Conv2d)
def _conv(
    m: nn.Conv1d | nn.Conv2d, args: tuple[Any, ...], kwargs: dict[str, Any], grad: torch.Tensor, B: int, name: str
) -> dict[str, Contribution]:
    x = _input(args, kwargs, name)
    spatial = 1 if isinstance(m, nn.Conv1d) else 2
    if x.dim() != spatial + 2:  # unbatched input
        raise NotPerExampleError(f"layer {name!r} was called without a batch dimension (input {tuple(x.shape)})")
    _lead(x, B, name)
    kernel, stride, dilation = list(m.kernel_size), list(m.stride), list(m.dilation)
    padding: list[int] = [0] * spatial
    if m.padding_mode != "zeros":
        x = nnf.pad(x, m._reversed_padding_repeated_twice, mode=m.padding_mode)
    elif isinstance(m.padding, str):
        if m.padding == "same":
            x = nnf.pad(x, _same_padding(kernel, dilation))
    else:
        padding = list(m.padding)
    if spatial == 1:  # a 1-d convolution is a 2-d one of height 1
        x = x.unsqueeze(2)
        kernel, stride, dilation, padding = [1, *kernel], [1, *stride], [1, *dilation], [0, *padding]
    patches = _patches(x, kernel, dilation, padding, stride)  # (B, L, C·k)
    K = m.groups
    L = patches.shape[1]
    a = patches.reshape(B, L, K, -1)
    g = grad.reshape(B, m.out_channels, -1)
    if g.shape[-1] != L:
        raise NotPerExampleError(f"layer {name!r}: output positions {g.shape[-1]} != patches {L}")
    gt = g.transpose(1, 2).reshape(B, L, K, m.out_channels // K)
    out: dict[str, Contribution] = {"weight": Outer(a, gt, m.weight.shape)}
    if m.bias is not None:
        out["bias"] = Dense(g.sum(-1))
    return out


def _affine(
    normalise: Callable[[torch.Tensor], torch.Tensor],
    x: torch.Tensor,
    grad: torch.Tensor,
    B: int,
    pshape: Sequence[int],
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-example gradients of an elementwise affine (weight, bias) over the trailing ``pshape`` dims."""
    n = len(pshape)
    xhat = normalise(x)
    lead = (B, -1, *grad.shape[grad.dim() - n :])
    return (grad * xhat).reshape(lead).sum(1), grad.reshape(lead).sum(1)


def _normalised_input(
    m: nn.LayerNorm | nn.RMSNorm, args: tuple[Any, ...], kwargs: dict[str, Any], B: int, name: str, key: str
) -> torch.Tensor:
    x = _input(args, kwargs, name, key)
    _lead(x, B, name)
    if x.dim() == len(m.normalized_shape):
        raise NotPerExampleError(f"layer {name!r} was called without a batch dimension")
    return x


@register_rule(nn.LayerNorm)
def _layer_norm(
    m: nn.LayerNorm, args: tuple[Any, ...], kwargs: dict[str, Any], grad: torch.Tensor, B: int, name: str
) -> dict[str, Contribution]:
    x = _normalised_input(m, args, kwargs, B, name, "input")
    shape = tuple(m.normalized_shape)
    gw, gb = _affine(lambda t: nnf.layer_norm(t, shape, None, None, m.eps), x, grad, B, shape)
    out: dict[str, Contribution] = {}
    if m.weight is not None:
        out["weight"] = Dense(gw)
    if m.bias is not None:
        out["bias"] = Dense(gb)
    return out


def _rms_norm(
    m: nn.RMSNorm, args: tuple[Any, ...], kwargs: dict[str, Any], grad: torch.Tensor, B: int, name: str
) -> dict[str, Contribution]:
    x = _normalised_input(m, args, kwargs, B, name, "x" if "x" in kwargs else "input")
    shape = list(m.normalized_shape)
    gw, _ = _affine(lambda t: nnf.rms_norm(t, shape, None, m.eps), x, grad, B, shape)
    return {"weight": Dense(gw)} if m.weight is not None else {}


if hasattr(nn, "RMSNorm"):  # torch >= 2.4
    register_rule(nn.RMSNorm)(_rms_norm)


@register_rule(nn.GroupNorm)
def _group_norm(
    m: nn.GroupNorm, args: tuple[Any, ...], kwargs: dict[str, Any], grad: torch.Tensor, B: int, name: str
) -> dict[str, Contribution]:
    x = _input(args, kwargs, name)
    _lead(x, B, name)
    if x.dim() < 2:
        raise NotPerExampleError(f"layer {name!r} needs a (B, C, ...) input, got {tuple(x.shape)}")
    xhat = nnf.group_norm(x, m.num_groups, None, None, m.eps)
    g = grad.reshape(B, m.num_channels, -1)
    out: dict[str, Contribution] = {}
    if m.weight is not None:
        out["weight"] = Dense((g * xhat.reshape(B, m.num_channels, -1)).sum(-1))
    if m.bias is not None:
        out["bias"] = Dense(g.sum(-1))
    return out
