"""Per-layer rules for ghost (book-keeping) clipping, and the contributions they return.

Each supported layer turns what its forward hook saw (inputs, output) and the
gradient of the summed loss with respect to that output into *contributions*
to the per-example gradient of each of its parameters, without materialising
per-example gradients where that is expensive. A contribution is a
:class:`Contribution`: it knows its per-example squared norms, its weighted sum
Σ_i c_i g_i, and the few other reductions ghost clipping needs, so that
:mod:`featuredp.clipping.ghost` never asks what kind it holds. Four kinds cover
every supported layer:

* :class:`Outer` — the per-example gradient is Σ_t g_t a_tᵀ over "tokens" t
  (Linear over any number of leading dims, Conv via im2col), optionally in
  independent groups (grouped convolutions). Several passes through the same
  layer (FDP's ℓ(x) − ℓ(x_padded)) simply add tokens, which is exactly where
  the cross terms 2(a₁·a₂)(g₁·g₂) of the squared norm come from.
* :class:`Passes` — several single-token :class:`Outer` passes kept apart (FDP's
  two passes through a Linear layer on flat inputs): row-wise dot products
  instead of concatenated tokens.
* :class:`Rows` — the per-example gradient of a (V, d) table is sparse: row
  ``index[j]`` of example ``example[j]`` receives ``value[j]`` (Embedding,
  EmbeddingBag with ragged bags, per-sample weights, padding).
* :class:`Dense` — the per-example gradient itself, when it is cheap (biases,
  LayerNorm / GroupNorm / RMSNorm affine parameters, and the torch.func
  fallback).

A parameter that layers of different kinds reach — a token embedding tied to the output
head gets :class:`Rows` from the lookups and :class:`Outer` from the head — is one
:class:`Mixed` contribution: each kind's parts combined by that kind, plus the cross terms
2⟨c_k,i, c_l,i⟩ of its squared norm from a formula per pair of kinds (Rows × Outer without
forming the (V, d) gradient per example), or, for a pair without one, from per-example
gradients materialised a block of examples at a time.

Norms in the Gram form are checked for cancellation and recomputed in float64 where the
terms nearly cancel (ℓ − ℓ_pub with a good ℓ_pub), because float32 would lose the small
difference that clipping depends on.

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

A new *kind* of contribution is one subclass of :class:`Contribution` in this file
implementing its abstract methods (the registry contract tests in
``tests/clipping/test_contract.py`` then cover it through the layers that return it).

>>> from torch import nn
>>> rule, reason = rule_for(nn.Linear(3, 2))
>>> rule is not None, reason
(True, '')
>>> rule_for(nn.PReLU())[1]
'no ghost rule for this layer type'
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from torch import nn
from torch.nn import functional as nnf

from featuredp.clipping.base import add_up
from featuredp.models.layers import ColumnLinear

__all__ = [
    "RULES",
    "Contribution",
    "Dense",
    "LayerRule",
    "Mixed",
    "NormCache",
    "NotPerExampleError",
    "Outer",
    "Passes",
    "Rows",
    "Rule",
    "combine",
    "register_rule",
    "rule_for",
]

# Largest number of elements of one temporary block (Gram matrices or materialised per-example
# gradients) before the work is split over the batch: 2^24 floats = 64 MB in float32.
_BLOCK_ELEMENTS = 1 << 24

# Gram-form entries are float32 dot products with relative error up to ~d·2⁻²⁴ of ‖a_t‖‖a_s‖. Where the
# squared norm is below this fraction of its bound (Σ_t ‖a_t‖‖g_t‖)² — the terms of Σ_{t,s} cancel, as in
# ℓ(x) − ℓ_pub(x') when ℓ_pub predicts ℓ well — the example is recomputed in float64, so that cancellation
# can never hide a large gradient from clipping.
_CANCELLATION = 0.1

#: Row norms already computed in one batch, keyed by (data pointer, shape, strides) of the tensor.
NormCache = dict[tuple[int, tuple[int, ...], tuple[int, ...]], torch.Tensor]


class NotPerExampleError(ValueError):
    """A supported layer saw an input whose first dimension is not the batch of examples."""


_C = TypeVar("_C", bound="Contribution")


class Contribution(ABC):
    """One call's (or several calls') share of one parameter's per-example gradients, in a compact form.

    Every reduction ghost clipping needs is a method, so a new kind of contribution is one subclass.
    B below is the number of examples; "the per-example gradient i" has the parameter's shape.
    """

    @abstractmethod
    def squared_norms(self, cache: NormCache | None = None) -> torch.Tensor:
        """Per-example squared gradient norms (float64, shape (B,)).

        ``cache`` (one dict per batch, shared by all contributions) lets contributions that hold the same
        tensor reuse its row norms.
        """

    @abstractmethod
    def weighted_sum(self, factors: torch.Tensor) -> torch.Tensor:
        """Σ_i factors[i] · (per-example gradient i), in the parameter's shape."""

    @abstractmethod
    def abs_sum(self) -> torch.Tensor:
        """Σ_i |per-example gradient i| entrywise, bounding the terms (a scale for rounding tolerances)."""

    @abstractmethod
    def examples(self, rows: torch.Tensor) -> torch.Tensor:
        """The per-example gradients of the examples ``rows`` (int64 indices), materialised: (k, *param.shape).

        Used by the separability cross-check on every step, which compares them with gradients of each
        example computed on its own; k is small (a handful), so the (k, *shape) block is cheap.
        """

    @abstractmethod
    def term_bounds(self, rows: torch.Tensor) -> torch.Tensor:
        """For each example of ``rows``, a bound on its gradient norm without cancellation (float64).

        Float32 rounding scales with these terms, not with their possibly cancelling sum (ℓ − ℓ_pub), so
        tolerances that compare gradients computed in two ways are taken relative to them.
        """

    @abstractmethod
    def without(self, drop: torch.Tensor) -> Contribution:
        """This contribution with the examples where the boolean mask ``drop`` (B,) is true set to zero.

        A non-finite per-example gradient gets clip factor 0, but 0 · NaN is NaN: its recorded rows must be
        zero before any weighted sum (ARCHITECTURE rule 14).
        """

    @classmethod
    @abstractmethod
    def combine(cls: type[_C], parts: Sequence[_C]) -> Contribution:
        """One contribution from several passes through the same parameter (at least two, all of this kind)."""


def _shape_of(c: Contribution) -> torch.Size | None:
    """The parameter's shape, for the kinds that record it (None for a kind that does not)."""
    if isinstance(c, Dense):
        return c.grad.shape[1:]
    shape = getattr(c, "shape", None)
    return None if shape is None else torch.Size(shape)


def combine(parts: Sequence[Contribution]) -> Contribution:
    """One contribution from all the calls that reached one parameter.

    Parts of one kind are combined by that kind (tokens side by side, passes kept apart, ...); a parameter
    reached by layers of different kinds (a token embedding tied to the output head: :class:`Rows` and
    :class:`Outer`) becomes a :class:`Mixed` of one combined part per kind, whose norm adds the cross terms.
    """
    first = parts[0]
    if len(parts) == 1:
        return first
    shapes = [_shape_of(p) for p in parts]
    known = {s for s in shapes if s is not None}
    if len(known) > 1:
        kinds = "different kinds" if len({type(p) for p in parts}) > 1 else "one kind"
        listed = ", ".join(f"{type(p).__name__} {tuple(s) if s is not None else '?'}" for p, s in zip(parts, shapes))
        raise TypeError(f"cannot combine contributions of {kinds} for one parameter of different shapes: {listed}")
    by_kind: dict[type[Contribution], list[Contribution]] = {}
    for p in parts:
        # Flatten what an earlier combine grouped, so that each kind is combined once, by its own rule.
        flat = p.parts if isinstance(p, (Mixed, Passes)) else [p]
        for q in flat:
            by_kind.setdefault(type(q), []).append(q)
    merged = [ps[0] if len(ps) == 1 else kind.combine(ps) for kind, ps in by_kind.items()]
    return merged[0] if len(merged) == 1 else Mixed(merged)


def _chunks(n: int, per_item: int) -> list[slice]:
    step = max(1, _BLOCK_ELEMENTS // max(per_item, 1))
    return [slice(i, min(i + step, n)) for i in range(0, n, step)]


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


@dataclass(eq=False)
class Outer(Contribution):
    """Per-example gradient Σ_t g[b, t, k]ᵀ a[b, t, k] for each group k: a (B, T, K, din), g (B, T, K, dout).

    With ``columns`` (K = 1 only), ``a`` holds just those input columns of a wider input whose other
    columns are zero (:class:`featuredp.models.layers.ColumnLinear`); the gradient's other columns are 0.
    """

    a: torch.Tensor
    g: torch.Tensor
    shape: torch.Size  # the parameter's shape; its elements are ordered (group, dout, din)
    columns: torch.Tensor | None = None

    def full_a(self) -> torch.Tensor:
        """``a`` with the zero columns put back (the full input width)."""
        if self.columns is None:
            return self.a
        full = self.a.new_zeros((*self.a.shape[:-1], self.shape[-1]))
        return full.index_copy_(-1, self.columns, self.a)

    def squared_norms(self, cache: NormCache | None = None) -> torch.Tensor:
        """Per-example ‖Σ_t g_t a_tᵀ‖² (float64, (B,)): ‖a‖·‖g‖ for one token, else the Gram form or the
        materialised per-example block, whichever is cheaper."""
        B, T, K, din = self.a.shape
        dout = self.g.shape[-1]
        if T == 1 and K == 1:
            return _row_sq(self.a.reshape(B, din), cache) * _row_sq(self.g.reshape(B, dout), cache)
        if T == 1:
            # ‖g aᵀ‖_F = ‖a‖·‖g‖ for a single token: no cancellation, and vector_norm is one fused pass.
            prod = torch.linalg.vector_norm(self.a, dim=-1) * torch.linalg.vector_norm(self.g, dim=-1)  # (B, 1, K)
            return prod.to(torch.float64).pow(2).sum((1, 2))
        out = torch.empty(B, dtype=torch.float64, device=self.a.device)
        # Gram form Σ_{t,s} (a_t·a_s)(g_t·g_s) costs T²(din+dout); materialising Σ_t g_t a_tᵀ costs T·din·dout.
        if T * T * (din + dout) <= T * din * dout:
            a = self.a.permute(0, 2, 1, 3)  # (B, K, T, din)
            g = self.g.permute(0, 2, 1, 3)
            for sl in _chunks(B, K * T * T):
                out[sl] = _gram_sq_norms(a[sl], g[sl])
        else:
            a = self.a.permute(0, 2, 1, 3)
            g = self.g.permute(0, 2, 3, 1)  # (B, K, dout, T)
            for sl in _chunks(B, K * din * dout):
                # Per-example gradients, one block at a time: as accurate as autograd's own float32 sums.
                per_example = torch.matmul(g[sl], a[sl])  # (b, K, dout, din)
                out[sl] = torch.linalg.vector_norm(per_example, dim=(-2, -1)).to(torch.float64).pow(2).sum(1)
        return out

    def weighted_sum(self, factors: torch.Tensor) -> torch.Tensor:
        """Σ_i factors[i] Σ_t g_it a_itᵀ: one matmul (one batched matmul over groups)."""
        B, T, K, din = self.a.shape
        dout = self.g.shape[-1]
        gw = self.g * factors.to(self.g.dtype).view(B, 1, 1, 1)
        if self.columns is not None:
            total = self.a.new_zeros(self.shape[0], self.shape[-1])
            return total.index_copy_(1, self.columns, gw.reshape(B * T, dout).t() @ self.a.reshape(B * T, din))
        if K == 1:
            total = gw.reshape(B * T, dout).t() @ self.a.reshape(B * T, din)
        else:
            a = self.a.reshape(B * T, K, din).transpose(0, 1)  # (K, BT, din)
            total = torch.bmm(gw.reshape(B * T, K, dout).permute(1, 2, 0), a)  # (K, dout, din)
        return total.reshape(self.shape)

    def abs_sum(self) -> torch.Tensor:
        """Σ_i Σ_t |g_it| |a_it|ᵀ (bounds Σ_i |Σ_t g_it a_itᵀ| entrywise)."""
        ones = torch.ones(self.a.shape[0], device=self.a.device)
        return Outer(self.a.abs(), self.g.abs(), self.shape, self.columns).weighted_sum(ones)

    def examples(self, rows: torch.Tensor) -> torch.Tensor:
        """Σ_t g_t a_tᵀ of the examples ``rows``, (k, *param.shape)."""
        a, g = self.full_a()[rows], self.g[rows]  # (k, T, K, din), (k, T, K, dout)
        return torch.einsum("btko,btki->bkoi", g, a).reshape(a.shape[0], *self.shape)

    def term_bounds(self, rows: torch.Tensor) -> torch.Tensor:
        """(Σ_k (Σ_t ‖a_t‖‖g_t‖)²)^½ per example: the norm if no token cancelled another."""
        a, g = self.a[rows].to(torch.float64), self.g[rows].to(torch.float64)
        per_group = (torch.linalg.vector_norm(a, dim=-1) * torch.linalg.vector_norm(g, dim=-1)).sum(1)  # (k, K)
        return per_group.pow(2).sum(1).sqrt()

    def without(self, drop: torch.Tensor) -> Outer:
        """Zero activations and output gradients of the dropped examples."""
        keep = ~drop.view(-1, 1, 1, 1)
        return Outer(torch.where(keep, self.a, 0), torch.where(keep, self.g, 0), self.shape, self.columns)

    @classmethod
    def combine(cls, parts: Sequence[Outer]) -> Contribution:
        """Single-token passes stay apart (:class:`Passes`); otherwise the tokens of all passes side by side."""
        if all(p.a.shape[1] == 1 and p.a.shape[2] == 1 for p in parts):
            return Passes(list(parts), parts[0].shape)
        # Σ_k Σ_t g aᵀ over the tokens of every pass: the cross terms are in the norm.
        return Outer(torch.cat([p.full_a() for p in parts], 1), torch.cat([p.g for p in parts], 1), parts[0].shape)


def _row_dot(x: Outer, y: Outer, B: int) -> torch.Tensor:
    """a_x · a_y per example for single-token passes, either of which may hold a column subset."""
    a, b = x.a.reshape(B, -1), y.a.reshape(B, -1)
    xc, yc = x.columns, y.columns
    if xc is None and yc is not None:  # only y's columns can be non-zero in the product
        a = a.index_select(1, yc)
    elif xc is not None and yc is None:
        b = b.index_select(1, xc)
    elif xc is not None and yc is not None and not (xc is yc or torch.equal(xc, yc)):
        a, b = x.full_a().reshape(B, -1), y.full_a().reshape(B, -1)
    return torch.linalg.vecdot(a, b)


def _passes_sq_norms_of(parts: Sequence[Outer], B: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Σ_{p,q} (a_p·a_q)(g_p·g_q) in float64, and its bound (Σ_p ‖a_p‖‖g_p‖)²."""
    gs = [p.g.reshape(B, -1) for p in parts]
    an = [torch.linalg.vector_norm(p.a.reshape(B, -1), dim=1).to(torch.float64) for p in parts]
    gn = [torch.linalg.vector_norm(g, dim=1).to(torch.float64) for g in gs]
    sq = add_up([(x * y).pow(2) for x, y in zip(an, gn)])
    for i in range(len(parts)):
        for j in range(i + 1, len(parts)):
            aa = _row_dot(parts[i], parts[j], B).to(torch.float64)
            sq = sq + 2 * aa * torch.linalg.vecdot(gs[i], gs[j]).to(torch.float64)
    bound = add_up([x * y for x, y in zip(an, gn)]).pow(2)
    return sq, bound


class _SumOfParts(Contribution):
    """A contribution whose per-example gradient is the sum of its ``parts``' (the reductions that add up)."""

    parts: Sequence[Contribution]

    def abs_sum(self) -> torch.Tensor:
        """The parts' entrywise bounds added up."""
        return add_up([p.abs_sum() for p in self.parts])

    def examples(self, rows: torch.Tensor) -> torch.Tensor:
        """The parts' per-example gradients added up, (k, *param.shape)."""
        return add_up([p.examples(rows) for p in self.parts])

    def term_bounds(self, rows: torch.Tensor) -> torch.Tensor:
        """The parts' bounds added up (for passes: Σ_p ‖a_p‖‖g_p‖ per example)."""
        return add_up([p.term_bounds(rows) for p in self.parts])


@dataclass(eq=False)
class Passes(_SumOfParts):
    """Per-example gradient Σ_p g_p a_pᵀ of a weight that several passes reach with one token each.

    FDP's ℓ(x) − ℓ_pub(x') sends every example through each Linear layer twice. The passes are kept
    apart instead of concatenated: the squared norm needs only row-wise dot products
    Σ_{p,q} (a_p·a_q)(g_p·g_q), and the clipped sum is one matmul per pass accumulated in place.
    """

    parts: list[Outer]  # each with T = K = 1
    shape: torch.Size

    def squared_norms(self, cache: NormCache | None = None) -> torch.Tensor:
        """Σ_{p,q} (a_p·a_q)(g_p·g_q) per example (float64), redone in float64 where the passes nearly cancel."""
        B = self.parts[0].a.shape[0]
        sq, bound = _passes_sq_norms_of(self.parts, B)
        if self.parts[0].a.dtype == torch.float64:
            return sq
        # The same cancellation guard as the Gram form: examples whose passes nearly cancel are redone in float64.
        risky = (sq < _CANCELLATION * bound).nonzero().flatten()
        if risky.numel():
            parts64 = [
                Outer(p.a[risky].to(torch.float64), p.g[risky].to(torch.float64), p.shape, p.columns)
                for p in self.parts
            ]
            sq[risky] = _passes_sq_norms_of(parts64, int(risky.numel()))[0]
        return sq

    def weighted_sum(self, factors: torch.Tensor) -> torch.Tensor:
        """Σ_p (g_p ∘ factors)ᵀ a_p: one matmul per pass, accumulated in place."""
        B = self.parts[0].a.shape[0]
        f = factors.to(self.parts[0].g.dtype).view(B, 1)
        total: torch.Tensor | None = None
        # Full-width passes first, so that the first matmul allocates the result.
        for p in sorted(self.parts, key=lambda p: p.columns is not None):
            gw = (p.g.reshape(B, -1) * f).t()
            a = p.a.reshape(B, -1)
            if p.columns is None:
                total = gw @ a if total is None else total.addmm_(gw, a)
            else:
                if total is None:
                    total = a.new_zeros(self.shape[0], self.shape[-1])
                total.index_add_(1, p.columns, gw @ a)
        assert total is not None  # parts is never empty
        return total.reshape(self.shape)

    def without(self, drop: torch.Tensor) -> Contribution:
        """Every pass without the dropped examples."""
        return Passes([p.without(drop) for p in self.parts], self.shape)

    @classmethod
    def combine(cls, parts: Sequence[Passes]) -> Contribution:
        """All the passes of all the parts."""
        return Passes([q for p in parts for q in p.parts], parts[0].shape)


@dataclass(eq=False)
class Rows(Contribution):
    """Per-example gradient of a (V, d) table: example[j] adds value[j] to row index[j]."""

    example: torch.Tensor  # (N,) int64
    index: torch.Tensor  # (N,) int64
    value: torch.Tensor  # (N, d)
    batch_size: int
    shape: torch.Size

    def aggregated(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(example, row, summed value in float64) per distinct (example, row), sorted by example then row.

        Tokens of one example that hit the same row add up first (in float64: FDP's two passes mostly hit the
        same rows with nearly cancelling values).
        """
        V = self.shape[0]
        keys = self.example * V + self.index
        uniq, inverse = torch.unique(keys, return_inverse=True)
        agg = torch.zeros(uniq.numel(), self.value.shape[1], dtype=torch.float64, device=self.value.device)
        agg.index_add_(0, inverse, self.value.to(torch.float64))
        return torch.div(uniq, V, rounding_mode="floor"), torch.remainder(uniq, V), agg

    def squared_norms(self, cache: NormCache | None = None) -> torch.Tensor:
        """Per-example squared norms (float64); tokens of one example that hit the same row add up first."""
        out = torch.zeros(self.batch_size, dtype=torch.float64, device=self.value.device)
        if self.example.numel() == 0:
            return out
        example, _, agg = self.aggregated()
        out.index_add_(0, example, agg.pow(2).sum(1))
        return out

    def weighted_sum(self, factors: torch.Tensor) -> torch.Tensor:
        """Σ_j factors[example[j]] · value[j] added to row index[j] (a dense (V, d) tensor)."""
        out = torch.zeros(self.shape, dtype=self.value.dtype, device=self.value.device)
        if self.example.numel():
            out.index_add_(0, self.index, self.value * factors.to(self.value.dtype)[self.example].unsqueeze(1))
        return out

    def abs_sum(self) -> torch.Tensor:
        """Σ_j |value[j]| added to row index[j]."""
        ones = torch.ones(self.batch_size, device=self.value.device)
        return Rows(self.example, self.index, self.value.abs(), self.batch_size, self.shape).weighted_sum(ones)

    def _positions(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The tokens of the examples ``rows`` and, for each, its example's position in ``rows``."""
        where = torch.full((self.batch_size,), -1, dtype=torch.int64, device=self.example.device)
        where[rows.to(self.example.device)] = torch.arange(len(rows), device=self.example.device)
        pos = where[self.example]
        keep = pos >= 0
        return keep, pos[keep]

    def examples(self, rows: torch.Tensor) -> torch.Tensor:
        """The dense (V, d) gradients of the examples ``rows``."""
        keep, pos = self._positions(rows)
        out = torch.zeros((len(rows), *self.shape), dtype=self.value.dtype, device=self.value.device)
        out.index_put_((pos, self.index[keep]), self.value[keep], accumulate=True)
        return out

    def term_bounds(self, rows: torch.Tensor) -> torch.Tensor:
        """Σ_j ‖value_j‖ over each example's tokens."""
        keep, pos = self._positions(rows)
        out = torch.zeros(len(rows), dtype=torch.float64, device=self.value.device)
        return out.index_add_(0, pos, torch.linalg.vector_norm(self.value[keep].to(torch.float64), dim=1))

    def without(self, drop: torch.Tensor) -> Contribution:
        """The dropped examples' tokens add zero."""
        keep = ~drop.to(self.example.device)[self.example].view(-1, 1)
        return Rows(self.example, self.index, torch.where(keep, self.value, 0), self.batch_size, self.shape)

    @classmethod
    def combine(cls, parts: Sequence[Rows]) -> Contribution:
        """The tokens of all passes together (rows hit twice by one example add up in the norm)."""
        return Rows(
            torch.cat([p.example for p in parts]),
            torch.cat([p.index for p in parts]),
            torch.cat([p.value for p in parts]),
            parts[0].batch_size,
            parts[0].shape,
        )


@dataclass(eq=False)
class Dense(Contribution):
    """The per-example gradient itself, shape (B, *param.shape)."""

    grad: torch.Tensor

    def squared_norms(self, cache: NormCache | None = None) -> torch.Tensor:
        """Row norms squared (float64); a sum of squares does not cancel, so one fused float32 pass is accurate."""
        return _row_sq(self.grad.reshape(self.grad.shape[0], -1), cache)

    def weighted_sum(self, factors: torch.Tensor) -> torch.Tensor:
        """Σ_i factors[i] grad[i] (one matrix-vector product)."""
        B = self.grad.shape[0]
        return torch.mv(self.grad.reshape(B, -1).t(), factors.to(self.grad.dtype)).reshape(self.grad.shape[1:])

    def abs_sum(self) -> torch.Tensor:
        """Σ_i |grad[i]|."""
        return self.grad.abs().sum(0)

    def examples(self, rows: torch.Tensor) -> torch.Tensor:
        """grad[rows]."""
        return self.grad[rows]

    def term_bounds(self, rows: torch.Tensor) -> torch.Tensor:
        """The norms themselves (nothing cancels in a materialised gradient)."""
        g = self.grad[rows]
        return torch.linalg.vector_norm(g.reshape(g.shape[0], -1).to(torch.float64), dim=1)

    def without(self, drop: torch.Tensor) -> Contribution:
        """The dropped examples' gradients set to zero."""
        return Dense(torch.where(~drop.view(-1, *[1] * (self.grad.dim() - 1)), self.grad, 0))

    @classmethod
    def combine(cls, parts: Sequence[Dense]) -> Contribution:
        """The per-example gradients added up."""
        return Dense(add_up([p.grad for p in parts]))


# ---------------------------------------------------------------------------------------------------------
# One parameter reached by layers of different kinds (tied weights).

#: ``cross(x, y) -> (B,) float64``: Σ over the parameter's entries of x's and y's per-example gradients (their
#: inner product per example), for one ordered pair of kinds.
CrossTerm = Callable[[Any, Any], torch.Tensor]


def _rows_outer_cross(rows: Rows, outer: Outer) -> torch.Tensor:
    """⟨Rows_i, Outer_i⟩ = Σ_j Σ_t g_t[index_j] (a_t · value_j) over example i's distinct rows j and tokens t.

    The rows an example's tokens hit are few (at most its number of tokens), so this costs T·n·d per example
    for n distinct rows instead of the T·V·d of materialising the (V, d) gradient; it is computed in float64
    (cheap next to the model's own forward), so its rounding never competes with the norm it corrects.
    """
    B = rows.batch_size
    out = torch.zeros(B, dtype=torch.float64, device=rows.value.device)
    if rows.example.numel() == 0:
        return out
    if outer.a.shape[2] != 1 or len(outer.shape) != 2:  # groups: only a dense comparison is simple
        return _materialised_cross(rows, outer, B, out.device)
    example, row, agg = rows.aggregated()
    counts = torch.bincount(example, minlength=B)
    n = int(counts.max())
    slot = torch.arange(example.numel(), device=example.device) - (torch.cumsum(counts, 0) - counts)[example]
    # Each example's distinct rows side by side, padded with zero values (which add nothing).
    value = agg.new_zeros(B, n, agg.shape[1]).index_put_((example, slot), agg)
    index = row.new_zeros(B, n).index_put_((example, slot), row)
    a, g = outer.full_a(), outer.g
    T = a.shape[1]
    a, g = a.reshape(B, T, -1), g.reshape(B, T, -1)
    for sl in _chunks(B, T * (n + a.shape[-1])):
        dots = torch.matmul(a[sl].to(torch.float64), value[sl].transpose(1, 2))  # (b, T, n): a_t · value_j
        picked = torch.gather(g[sl], 2, index[sl].unsqueeze(1).expand(-1, T, -1))  # (b, T, n): g_t[index_j]
        out[sl] = (dots * picked.to(torch.float64)).sum((1, 2))
    return out


def _rows_passes_cross(rows: Rows, passes: Passes) -> torch.Tensor:
    """The cross term with each single-token pass, added up."""
    return add_up([_rows_outer_cross(rows, p) for p in passes.parts])


_CROSS_TERMS: dict[tuple[type[Contribution], type[Contribution]], CrossTerm] = {
    (Rows, Outer): _rows_outer_cross,
    (Rows, Passes): _rows_passes_cross,
}


def _materialised_cross(x: Contribution, y: Contribution, B: int, device: torch.device) -> torch.Tensor:
    """⟨x_i, y_i⟩ from materialised per-example gradients, a block of examples at a time (the fallback for
    pairs of kinds without a formula in ``_CROSS_TERMS``; as accurate as autograd's own float32 gradients)."""
    shape = _shape_of(x) or _shape_of(y)
    per_item = 2 * shape.numel() if shape is not None else _BLOCK_ELEMENTS
    out = torch.zeros(B, dtype=torch.float64, device=device)
    for sl in _chunks(B, per_item):
        rows = torch.arange(sl.start, sl.stop, device=device)
        ex, ey = x.examples(rows), y.examples(rows)
        out[sl] = (ex.to(torch.float64) * ey.to(torch.float64)).reshape(len(rows), -1).sum(1).to(device)
    return out


def _cross(x: Contribution, y: Contribution, B: int, device: torch.device) -> torch.Tensor:
    """⟨x_i, y_i⟩ per example (float64, (B,)): by formula where one is known for the two kinds."""
    f = _CROSS_TERMS.get((type(x), type(y)))
    if f is not None:
        return f(x, y)
    f = _CROSS_TERMS.get((type(y), type(x)))
    if f is not None:
        return f(y, x)
    return _materialised_cross(x, y, B, device)


@dataclass(eq=False)
class Mixed(_SumOfParts):
    """A parameter reached by layers of different kinds: the per-example gradient is Σ_k (part k's).

    A token embedding tied to the output head (GPT-2) gives the same (V, d) table a :class:`Rows` part (the
    lookups) and an :class:`Outer` part (the head's matmul). The squared norm of their sum is
    Σ_k ‖c_k,i‖² + 2 Σ_{k<l} ⟨c_k,i, c_l,i⟩; each part keeps its own (cancellation-guarded) norm, and the
    cross terms come from a formula per pair of kinds (Rows × Outer and Rows × Passes) without forming the
    (V, d) gradient per example. A pair without a formula materialises per-example gradients a block of
    examples at a time (``_BLOCK_ELEMENTS``). Examples whose parts nearly cancel each other
    (Σ_k ‖c_k‖² + cross ≪ (Σ_k ‖c_k‖)²) are recomputed from their materialised gradients, as accurate as
    autograd's; that does not happen for ordinary models, whose embedding and head gradients are far from
    opposite.
    """

    parts: list[Contribution]  # at least two, of different kinds, for one parameter

    @property
    def shape(self) -> torch.Size | None:
        """The parameter's shape (None if no part records it)."""
        return next((s for s in map(_shape_of, self.parts) if s is not None), None)

    def squared_norms(self, cache: NormCache | None = None) -> torch.Tensor:
        """Σ_k ‖c_k‖² + 2 Σ_{k<l} ⟨c_k, c_l⟩ per example (float64)."""
        own = [p.squared_norms(cache) for p in self.parts]
        sq = add_up(own)
        B = sq.shape[0]
        for i in range(len(self.parts)):
            for j in range(i + 1, len(self.parts)):
                sq = sq + 2 * _cross(self.parts[i], self.parts[j], B, sq.device).to(sq.device)
        bound = add_up([o.clamp(min=0).sqrt() for o in own]).pow(2)
        risky = (sq < _CANCELLATION * bound).nonzero().flatten()
        if risky.numel():
            shape = self.shape
            per_item = (len(self.parts) + 1) * (shape.numel() if shape is not None else _BLOCK_ELEMENTS)
            for sl in _chunks(int(risky.numel()), per_item):
                rows = risky[sl]
                grads = self.examples(rows)
                sq[rows] = torch.linalg.vector_norm(grads.reshape(len(rows), -1), dim=1).to(torch.float64).pow(2)
        return sq

    def weighted_sum(self, factors: torch.Tensor) -> torch.Tensor:
        """Σ_k (part k's weighted sum)."""
        return add_up([p.weighted_sum(factors) for p in self.parts])

    def without(self, drop: torch.Tensor) -> Contribution:
        """Every part without the dropped examples."""
        return Mixed([p.without(drop) for p in self.parts])

    @classmethod
    def combine(cls, parts: Sequence[Mixed]) -> Contribution:
        """The parts of all, regrouped by kind (:func:`combine`)."""
        return combine(parts)


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
    entry = RULES.get(type(module))
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


@register_rule(nn.Linear, ColumnLinear)
def _linear(
    m: nn.Linear, args: tuple[Any, ...], kwargs: dict[str, Any], grad: torch.Tensor, B: int, name: str
) -> dict[str, Contribution]:
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
    patches = nnf.unfold(
        x, tuple(kernel), dilation=tuple(dilation), padding=tuple(padding), stride=tuple(stride)
    )  # (B, C·k, L)
    K = m.groups
    L = patches.shape[-1]
    a = patches.transpose(1, 2).reshape(B, L, K, -1)
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
