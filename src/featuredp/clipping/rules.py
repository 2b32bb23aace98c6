"""Per-layer rules for ghost (book-keeping) clipping.

Each supported layer turns what its forward hook saw (inputs, output) and the
gradient of the summed loss with respect to that output into *contributions*
to the per-example gradient of each of its parameters, without materialising
per-example gradients where that is expensive. Three shapes of contribution
cover every supported layer:

* :class:`Outer` — the per-example gradient is Σ_t g_t a_tᵀ over "tokens" t
  (Linear over any number of leading dims, Conv via im2col), optionally in
  independent groups (grouped convolutions). Several passes through the same
  layer (FDP's ℓ(x) − ℓ(x_padded)) simply add tokens, which is exactly where
  the cross terms 2(a₁·a₂)(g₁·g₂) of the squared norm come from.
* :class:`Rows` — the per-example gradient of a (V, d) table is sparse: row
  ``index[j]`` of example ``example[j]`` receives ``value[j]`` (Embedding,
  EmbeddingBag with ragged bags, per-sample weights, padding).
* :class:`Dense` — the per-example gradient itself, when it is cheap (biases,
  LayerNorm / GroupNorm / RMSNorm affine parameters, and the torch.func
  fallback).

Norms in the Gram form are checked for cancellation and recomputed in float64 where the
terms nearly cancel (ℓ − ℓ_pub with a good ℓ_pub), because float32 would lose the small
difference that clipping depends on.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn import functional as nnf

from featuredp.models.layers import ColumnLinear

__all__ = [
    "RULES",
    "Dense",
    "NotPerExampleError",
    "Outer",
    "Passes",
    "Rows",
    "abs_sum",
    "combine",
    "first_examples",
    "rule_for",
    "squared_norms",
    "term_bounds",
    "weighted_sum",
]

# Largest number of elements of one temporary block (Gram matrices or materialised per-example
# gradients) before the work is split over the batch: 2^24 floats = 64 MB in float32.
_BLOCK_ELEMENTS = 1 << 24


class NotPerExampleError(ValueError):
    """A supported layer saw an input whose first dimension is not the batch of examples."""


@dataclass
class Outer:
    """Per-example gradient Σ_t g[b, t, k]ᵀ a[b, t, k] for each group k: a (B, T, K, din), g (B, T, K, dout).

    With ``columns`` (K = 1 only), ``a`` holds just those input columns of a wider input whose other
    columns are zero (:class:`featuredp.models.layers.ColumnLinear`); the gradient's other columns are 0.
    """

    a: torch.Tensor
    g: torch.Tensor
    shape: torch.Size  # the parameter's shape; its elements are ordered (group, dout, din)
    columns: torch.Tensor | None = None


@dataclass
class Passes:
    """Per-example gradient Σ_p g_p a_pᵀ of a weight that several passes reach with one token each.

    FDP's ℓ(x) − ℓ_pub(x') sends every example through each Linear layer twice. The passes are kept
    apart instead of concatenated: the squared norm needs only row-wise dot products
    Σ_{p,q} (a_p·a_q)(g_p·g_q), and the clipped sum is one matmul per pass accumulated in place.
    """

    parts: list[Outer]  # each with T = K = 1
    shape: torch.Size


@dataclass
class Rows:
    """Per-example gradient of a (V, d) table: example[j] adds value[j] to row index[j]."""

    example: torch.Tensor  # (N,) int64
    index: torch.Tensor  # (N,) int64
    value: torch.Tensor  # (N, d)
    batch_size: int
    shape: torch.Size


@dataclass
class Dense:
    """The per-example gradient itself, shape (B, *param.shape)."""

    grad: torch.Tensor


Contribution = Outer | Passes | Rows | Dense


def combine(parts: Sequence[Contribution]) -> Contribution:
    """One contribution from several passes through the same parameter (all of one kind)."""
    first = parts[0]
    if len(parts) == 1:
        return first
    if any(type(p) is not type(first) for p in parts):
        raise TypeError("cannot combine contributions of different kinds for one parameter")
    if isinstance(first, Outer):
        if all(p.a.shape[1] == 1 and p.a.shape[2] == 1 for p in parts):
            return Passes(list(parts), first.shape)
        # Tokens of all passes side by side: Σ_k Σ_t g a ᵀ, cross terms included in the norm.
        return Outer(torch.cat([_full_a(p) for p in parts], 1), torch.cat([p.g for p in parts], 1), first.shape)
    if isinstance(first, Rows):
        return Rows(
            torch.cat([p.example for p in parts]),
            torch.cat([p.index for p in parts]),
            torch.cat([p.value for p in parts]),
            first.batch_size,
            first.shape,
        )
    total = first.grad
    for p in parts[1:]:
        total = total + p.grad
    return Dense(total)


def _full_a(c: Outer) -> torch.Tensor:
    """``c.a`` with the zero columns put back (the full input width)."""
    if c.columns is None:
        return c.a
    full = c.a.new_zeros((*c.a.shape[:-1], c.shape[-1]))
    return full.index_copy_(-1, c.columns, c.a)


def _chunks(n: int, per_item: int) -> list[slice]:
    step = max(1, _BLOCK_ELEMENTS // max(per_item, 1))
    return [slice(i, min(i + step, n)) for i in range(0, n, step)]


# Gram-form entries are float32 dot products with relative error up to ~d·2⁻²⁴ of ‖a_t‖‖a_s‖. Where the
# squared norm is below this fraction of its bound (Σ_t ‖a_t‖‖g_t‖)² — the terms of Σ_{t,s} cancel, as in
# ℓ(x) − ℓ_pub(x') when ℓ_pub predicts ℓ well — the example is recomputed in float64, so that cancellation
# can never hide a large gradient from clipping.
_CANCELLATION = 0.1


def _gram_sq_norms(a: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """Σ_k Σ_{t,s} (a_t·a_s)(g_t·g_s) for a (b, K, T, din), g (b, K, T, dout); float64 (b,)."""
    aa = torch.matmul(a, a.transpose(-1, -2))
    gg = torch.matmul(g, g.transpose(-1, -2))
    sq = (aa.to(torch.float64) * gg.to(torch.float64)).sum((1, 2, 3))
    if a.dtype == torch.float64:
        return sq
    diag = (aa.diagonal(dim1=-2, dim2=-1).clamp(min=0) * gg.diagonal(dim1=-2, dim2=-1).clamp(min=0)).sqrt()
    bound = diag.to(torch.float64).sum(-1).pow(2).sum(1)
    risky = (sq < _CANCELLATION * bound).nonzero().flatten()
    if risky.numel():
        a64 = a[risky].to(torch.float64)
        g64 = g[risky].to(torch.float64)
        sq[risky] = (torch.matmul(a64, a64.transpose(-1, -2)) * torch.matmul(g64, g64.transpose(-1, -2))).sum(
            (1, 2, 3)
        )
    return sq


NormCache = dict[tuple[int, tuple[int, ...], tuple[int, ...]], torch.Tensor]


def _row_sq(t: torch.Tensor, cache: NormCache | None) -> torch.Tensor:
    """‖t[i]‖² per row of a 2-d tensor in float64; remembered in ``cache`` (a layer's bias gradient is its
    output gradient g, whose norm the weight's ‖a‖·‖g‖ has already computed)."""
    key = (t.data_ptr(), tuple(t.shape), tuple(t.stride()))
    hit = None if cache is None else cache.get(key)
    if hit is None:
        hit = torch.linalg.vector_norm(t, dim=1).to(torch.float64).pow_(2)
        if cache is not None:
            cache[key] = hit
    return hit


def _outer_sq_norms(c: Outer, cache: NormCache | None = None) -> torch.Tensor:
    B, T, K, din = c.a.shape
    dout = c.g.shape[-1]
    if T == 1 and K == 1:
        return _row_sq(c.a.reshape(B, din), cache) * _row_sq(c.g.reshape(B, dout), cache)
    if T == 1:
        # ‖g aᵀ‖_F = ‖a‖·‖g‖ for a single token: no cancellation, and vector_norm is one fused pass.
        prod = torch.linalg.vector_norm(c.a, dim=-1) * torch.linalg.vector_norm(c.g, dim=-1)  # (B, 1, K)
        return prod.to(torch.float64).pow(2).sum((1, 2))
    out = torch.empty(B, dtype=torch.float64, device=c.a.device)
    # Gram form Σ_{t,s} (a_t·a_s)(g_t·g_s) costs T²(din+dout); materialising Σ_t g_t a_tᵀ costs T·din·dout.
    if T * T * (din + dout) <= T * din * dout:
        a = c.a.permute(0, 2, 1, 3)  # (B, K, T, din)
        g = c.g.permute(0, 2, 1, 3)
        for sl in _chunks(B, K * T * T):
            out[sl] = _gram_sq_norms(a[sl], g[sl])
    else:
        a = c.a.permute(0, 2, 1, 3)
        g = c.g.permute(0, 2, 3, 1)  # (B, K, dout, T)
        for sl in _chunks(B, K * din * dout):
            # Per-example gradients, one block at a time: as accurate as autograd's own float32 sums.
            per_example = torch.matmul(g[sl], a[sl])  # (b, K, dout, din)
            out[sl] = torch.linalg.vector_norm(per_example, dim=(-2, -1)).to(torch.float64).pow(2).sum(1)
    return out


def _row_dot(x: Outer, y: Outer, B: int) -> torch.Tensor:
    """a_x · a_y per example for single-token passes, either of which may hold a column subset."""
    a, b = x.a.reshape(B, -1), y.a.reshape(B, -1)
    if x.columns is None and y.columns is not None:  # only y's columns can be non-zero in the product
        a = a.index_select(1, y.columns)
    elif x.columns is not None and y.columns is None:
        b = b.index_select(1, x.columns)
    elif x.columns is not None and not (x.columns is y.columns or torch.equal(x.columns, y.columns)):
        a, b = _full_a(x).reshape(B, -1), _full_a(y).reshape(B, -1)
    return torch.linalg.vecdot(a, b)


def _passes_sq_norms_of(parts: list[Outer], B: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Σ_{p,q} (a_p·a_q)(g_p·g_q) in float64, and its bound (Σ_p ‖a_p‖‖g_p‖)²."""
    gs = [p.g.reshape(B, -1) for p in parts]
    an = [torch.linalg.vector_norm(p.a.reshape(B, -1), dim=1).to(torch.float64) for p in parts]
    gn = [torch.linalg.vector_norm(g, dim=1).to(torch.float64) for g in gs]
    sq = sum((x * y).pow(2) for x, y in zip(an, gn))
    for i in range(len(parts)):
        for j in range(i + 1, len(parts)):
            aa = _row_dot(parts[i], parts[j], B).to(torch.float64)
            sq = sq + 2 * aa * torch.linalg.vecdot(gs[i], gs[j]).to(torch.float64)
    bound = sum(x * y for x, y in zip(an, gn)).pow(2)
    return sq, bound


def _passes_sq_norms(c: Passes) -> torch.Tensor:
    B = c.parts[0].a.shape[0]
    sq, bound = _passes_sq_norms_of(c.parts, B)
    if c.parts[0].a.dtype == torch.float64:
        return sq
    # The same cancellation guard as the Gram form: examples whose passes nearly cancel are redone in float64.
    risky = (sq < _CANCELLATION * bound).nonzero().flatten()
    if risky.numel():
        parts64 = [
            Outer(p.a[risky].to(torch.float64), p.g[risky].to(torch.float64), p.shape, p.columns) for p in c.parts
        ]
        sq[risky] = _passes_sq_norms_of(parts64, int(risky.numel()))[0]
    return sq


def _rows_sq_norms(c: Rows) -> torch.Tensor:
    V = c.shape[0]
    out = torch.zeros(c.batch_size, dtype=torch.float64, device=c.value.device)
    if c.example.numel() == 0:
        return out
    # Tokens of one example that hit the same row add up before squaring: group by (example, row).
    keys = c.example * V + c.index
    uniq, inverse = torch.unique(keys, return_inverse=True)
    agg = torch.zeros(uniq.numel(), c.value.shape[1], dtype=torch.float64, device=c.value.device)
    agg.index_add_(0, inverse, c.value.to(torch.float64))
    out.index_add_(0, torch.div(uniq, V, rounding_mode="floor"), agg.pow(2).sum(1))
    return out


def squared_norms(c: Contribution, cache: NormCache | None = None) -> torch.Tensor:
    """Per-example squared gradient norms (float64, shape (B,)).

    ``cache`` (one dict per batch, shared by all contributions) lets contributions that hold the same
    tensor reuse its row norms.
    """
    if isinstance(c, Outer):
        return _outer_sq_norms(c, cache)
    if isinstance(c, Passes):
        return _passes_sq_norms(c)
    if isinstance(c, Rows):
        return _rows_sq_norms(c)
    # A sum of squares does not cancel: a float32 norm is accurate, and one fused pass.
    return _row_sq(c.grad.reshape(c.grad.shape[0], -1), cache)


def weighted_sum(c: Contribution, factors: torch.Tensor) -> torch.Tensor:
    """Σ_i factors[i] · (per-example gradient i), in the parameter's shape (one matmul for Outer)."""
    if isinstance(c, Passes):
        B = c.parts[0].a.shape[0]
        f = factors.to(c.parts[0].g.dtype).view(B, 1)
        total: torch.Tensor | None = None
        # Full-width passes first, so that the first matmul allocates the result.
        for p in sorted(c.parts, key=lambda p: p.columns is not None):
            gw = (p.g.reshape(B, -1) * f).t()
            a = p.a.reshape(B, -1)
            if p.columns is None:
                total = gw @ a if total is None else total.addmm_(gw, a)
            else:
                if total is None:
                    total = a.new_zeros(c.shape[0], c.shape[-1])
                total.index_add_(1, p.columns, gw @ a)
        assert total is not None
        return total.reshape(c.shape)
    if isinstance(c, Outer):
        B, T, K, din = c.a.shape
        dout = c.g.shape[-1]
        gw = c.g * factors.to(c.g.dtype).view(B, 1, 1, 1)
        if c.columns is not None:
            total = c.a.new_zeros(c.shape[0], c.shape[-1])
            return total.index_copy_(1, c.columns, gw.reshape(B * T, dout).t() @ c.a.reshape(B * T, din))
        if K == 1:
            total = gw.reshape(B * T, dout).t() @ c.a.reshape(B * T, din)
        else:
            a = c.a.reshape(B * T, K, din).transpose(0, 1)  # (K, BT, din)
            total = torch.bmm(gw.reshape(B * T, K, dout).permute(1, 2, 0), a)  # (K, dout, din)
        return total.reshape(c.shape)
    if isinstance(c, Rows):
        out = torch.zeros(c.shape, dtype=c.value.dtype, device=c.value.device)
        if c.example.numel():
            out.index_add_(0, c.index, c.value * factors.to(c.value.dtype)[c.example].unsqueeze(1))
        return out
    B = c.grad.shape[0]
    return torch.mv(c.grad.reshape(B, -1).t(), factors.to(c.grad.dtype)).reshape(c.grad.shape[1:])


def abs_sum(c: Contribution) -> torch.Tensor:
    """Σ_i |per-example gradient i| entrywise, bounding the terms (a scale for rounding tolerances)."""
    if isinstance(c, Passes):
        return sum(abs_sum(p) for p in c.parts)
    if isinstance(c, Outer):
        ones = torch.ones(c.a.shape[0], device=c.a.device)
        return weighted_sum(Outer(c.a.abs(), c.g.abs(), c.shape, c.columns), ones)
    if isinstance(c, Rows):
        return weighted_sum(Rows(c.example, c.index, c.value.abs(), c.batch_size, c.shape), torch.ones(c.batch_size))
    return c.grad.abs().sum(0)


def first_examples(c: Contribution, k: int) -> torch.Tensor:
    """The per-example gradients of the first ``k`` examples, materialised: shape (k, *param.shape).

    Used once per model by the separability cross-check, which compares them with gradients of each example
    computed on its own; k is small (a handful), so the (k, *shape) block is cheap.
    """
    if isinstance(c, Passes):
        return sum(first_examples(p, k) for p in c.parts)  # type: ignore[return-value]
    if isinstance(c, Outer):
        a, g = _full_a(c)[:k], c.g[:k]  # (k, T, K, din), (k, T, K, dout)
        return torch.einsum("btko,btki->bkoi", g, a).reshape(a.shape[0], *c.shape)
    if isinstance(c, Rows):
        keep = c.example < k
        out = torch.zeros((min(k, c.batch_size), *c.shape), dtype=c.value.dtype, device=c.value.device)
        out.index_put_((c.example[keep], c.index[keep]), c.value[keep], accumulate=True)
        return out
    return c.grad[:k]


def term_bounds(c: Contribution, k: int) -> torch.Tensor:
    """For each of the first ``k`` examples, a bound on its gradient norm without cancellation (float64, (k,)).

    Σ_t ‖a_t‖‖g_t‖ per group (outer products, passes), Σ_j ‖value_j‖ (rows), the norm itself (dense). Float32
    rounding scales with these terms, not with their possibly cancelling sum (ℓ − ℓ_pub), so tolerances that
    compare gradients computed in two ways are taken relative to them.
    """
    if isinstance(c, Passes):
        return sum(term_bounds(p, k) for p in c.parts)  # type: ignore[return-value]
    if isinstance(c, Outer):
        a, g = c.a[:k].to(torch.float64), c.g[:k].to(torch.float64)
        per_group = (torch.linalg.vector_norm(a, dim=-1) * torch.linalg.vector_norm(g, dim=-1)).sum(1)  # (k, K)
        return per_group.pow(2).sum(1).sqrt()
    if isinstance(c, Rows):
        keep = c.example < k
        out = torch.zeros(min(k, c.batch_size), dtype=torch.float64, device=c.value.device)
        return out.index_add_(0, c.example[keep], torch.linalg.vector_norm(c.value[keep].to(torch.float64), dim=1))
    g = c.grad[:k]
    return torch.linalg.vector_norm(g.reshape(g.shape[0], -1).to(torch.float64), dim=1)


# ---------------------------------------------------------------------------------------------------------
# Layer rules. A rule reads the forward hook's (args, kwargs) and the output gradient and returns
# {parameter attribute name: contribution}. ``batch_size`` is the number of examples B.


def _lead(t: torch.Tensor, batch_size: int, layer: str) -> None:
    if t.dim() == 0 or t.shape[0] != batch_size:
        raise NotPerExampleError(
            f"layer {layer!r} was called with an input of shape {tuple(t.shape)} whose first dimension is not "
            f"the batch of {batch_size} examples"
        )


def _linear(m: nn.Linear, args: tuple, kwargs: dict, grad: torch.Tensor, B: int, name: str) -> dict[str, Any]:
    x = args[0] if args else kwargs["input"]
    columns = args[1] if len(args) > 1 else kwargs.get("columns")  # ColumnLinear's column subset
    if x.dim() < 2:
        raise NotPerExampleError(f"layer {name!r} was called without a batch dimension (input {tuple(x.shape)})")
    _lead(x, B, name)
    a = x.reshape(B, -1, 1, x.shape[-1])
    g = grad.reshape(B, -1, 1, m.out_features)
    out: dict[str, Any] = {"weight": Outer(a, g, m.weight.shape, columns)}
    if m.bias is not None:
        out["bias"] = Dense(grad if grad.dim() == 2 else g.sum((1, 2)))  # one token: no sum, no copy
    return out


def _embedding_tokens(
    idx: torch.Tensor, g: torch.Tensor, example: torch.Tensor, padding_idx: int | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if padding_idx is not None:
        keep = idx != padding_idx  # PyTorch gives the padding row no gradient
        return example[keep], idx[keep], g[keep]
    return example, idx, g


def _embedding(m: nn.Embedding, args: tuple, kwargs: dict, grad: torch.Tensor, B: int, name: str) -> dict[str, Any]:
    idx = args[0] if args else kwargs["input"]
    _lead(idx, B, name)
    flat = idx.reshape(-1).long()
    per = flat.numel() // B
    example = torch.arange(B, device=flat.device).repeat_interleave(per)
    pad = m.padding_idx
    ex, ix, val = _embedding_tokens(flat, grad.reshape(-1, m.embedding_dim), example, pad)
    return {"weight": Rows(ex, ix, val, B, m.weight.shape)}


def _embedding_bag(
    m: nn.EmbeddingBag, args: tuple, kwargs: dict, grad: torch.Tensor, B: int, name: str
) -> dict[str, Any]:
    names = ("input", "offsets", "per_sample_weights")
    given = dict(zip(names, args))
    given.update({k: v for k, v in kwargs.items() if k in names})
    idx = given["input"]
    offsets = given.get("offsets")
    psw = given.get("per_sample_weights")
    if grad.shape[0] != B:
        raise NotPerExampleError(f"layer {name!r} produced {grad.shape[0]} bags for a batch of {B} examples")
    if idx.dim() == 2:
        flat = idx.reshape(-1).long()
        example = torch.arange(B, device=flat.device).repeat_interleave(idx.shape[1])
    else:
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
    if m.padding_idx is not None:
        keep = flat != m.padding_idx
        example, flat, weights = example[keep], flat[keep], weights[keep]
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


def _conv(m: nn.Conv1d | nn.Conv2d, args: tuple, kwargs: dict, grad: torch.Tensor, B: int, name: str) -> dict:
    x = args[0] if args else kwargs["input"]
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
    patches = nnf.unfold(x, kernel, dilation=dilation, padding=padding, stride=stride)  # (B, C·k, L)
    K = m.groups
    L = patches.shape[-1]
    a = patches.transpose(1, 2).reshape(B, L, K, -1)
    g = grad.reshape(B, m.out_channels, -1)
    if g.shape[-1] != L:
        raise NotPerExampleError(f"layer {name!r}: output positions {g.shape[-1]} != patches {L}")
    gt = g.transpose(1, 2).reshape(B, L, K, m.out_channels // K)
    out: dict[str, Any] = {"weight": Outer(a, gt, m.weight.shape)}
    if m.bias is not None:
        out["bias"] = Dense(g.sum(-1))
    return out


def _affine(
    normalise: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, grad: torch.Tensor, B: int, pshape: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    n = len(pshape)
    xhat = normalise(x)
    lead = (B, -1, *grad.shape[grad.dim() - n :])
    return (grad * xhat).reshape(lead).sum(1), grad.reshape(lead).sum(1)


def _layer_norm(m: nn.LayerNorm, args: tuple, kwargs: dict, grad: torch.Tensor, B: int, name: str) -> dict:
    x = args[0] if args else kwargs["input"]
    _lead(x, B, name)
    if x.dim() == len(m.normalized_shape):
        raise NotPerExampleError(f"layer {name!r} was called without a batch dimension")
    gw, gb = _affine(lambda t: nnf.layer_norm(t, m.normalized_shape, None, None, m.eps), x, grad, B, m.normalized_shape)
    out: dict[str, Any] = {}
    if m.weight is not None:
        out["weight"] = Dense(gw)
    if m.bias is not None:
        out["bias"] = Dense(gb)
    return out


def _rms_norm(m: nn.Module, args: tuple, kwargs: dict, grad: torch.Tensor, B: int, name: str) -> dict:
    x = args[0] if args else kwargs["x"] if "x" in kwargs else kwargs["input"]
    _lead(x, B, name)
    if x.dim() == len(m.normalized_shape):
        raise NotPerExampleError(f"layer {name!r} was called without a batch dimension")
    gw, _ = _affine(lambda t: nnf.rms_norm(t, m.normalized_shape, None, m.eps), x, grad, B, m.normalized_shape)
    return {"weight": Dense(gw)} if m.weight is not None else {}


def _group_norm(m: nn.GroupNorm, args: tuple, kwargs: dict, grad: torch.Tensor, B: int, name: str) -> dict:
    x = args[0] if args else kwargs["input"]
    _lead(x, B, name)
    if x.dim() < 2:
        raise NotPerExampleError(f"layer {name!r} needs a (B, C, ...) input, got {tuple(x.shape)}")
    xhat = nnf.group_norm(x, m.num_groups, None, None, m.eps)
    g = grad.reshape(B, m.num_channels, -1)
    out: dict[str, Any] = {}
    if m.weight is not None:
        out["weight"] = Dense((g * xhat.reshape(B, m.num_channels, -1)).sum(-1))
    if m.bias is not None:
        out["bias"] = Dense(g.sum(-1))
    return out


Rule = Callable[[Any, tuple, dict, torch.Tensor, int, str], dict[str, Any]]

#: Exact module types with a ghost rule (subclasses may override ``forward``, so they fall back).
RULES: dict[type, Rule] = {
    nn.Linear: _linear,
    ColumnLinear: _linear,
    nn.Embedding: _embedding,
    nn.EmbeddingBag: _embedding_bag,
    nn.Conv1d: _conv,
    nn.Conv2d: _conv,
    nn.LayerNorm: _layer_norm,
    nn.GroupNorm: _group_norm,
}
if hasattr(nn, "RMSNorm"):
    RULES[nn.RMSNorm] = _rms_norm


def rule_for(module: nn.Module) -> tuple[Rule | None, str]:
    """The rule for ``module`` and, when there is none, the reason (for the fallback report)."""
    rule = RULES.get(type(module))
    if rule is None:
        return None, "no ghost rule for this layer type"
    if isinstance(module, nn.Embedding) and module.scale_grad_by_freq:
        return None, "scale_grad_by_freq"
    if isinstance(module, nn.EmbeddingBag) and (module.mode == "max" or module.scale_grad_by_freq):
        return None, f"mode={module.mode!r}" if module.mode == "max" else "scale_grad_by_freq"
    return rule, ""
