"""The algebra of per-example contributions: compact forms of one parameter's per-example gradients.

A layer rule (:mod:`featuredp.clipping.rules`) turns what one call of a layer saw into
*contributions* to the per-example gradient of each of its parameters, without materialising
per-example gradients where that is expensive. A contribution is a :class:`Contribution`: it
knows its per-example squared norms, its weighted sum Σ_i c_i g_i, and the few other reductions
ghost clipping needs, so that :mod:`featuredp.clipping.ghost` never asks what kind it holds.
Four kinds cover every supported layer:

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

Parts that reach one parameter are joined by :func:`featuredp.clipping.mixed.combine`
(kinds combine by their own rule; different kinds become a
:class:`~featuredp.clipping.mixed.Mixed` with cross terms).

Norms in the Gram form are checked for cancellation and recomputed in float64 where the
terms nearly cancel (ℓ − ℓ_pub with a good ℓ_pub), because float32 would lose the small
difference that clipping depends on.

The separability checks of :mod:`featuredp.clipping.ghost_checks` read contributions too:
:meth:`Contribution.compare` gives the squared norms and inner products with a reference gradient
(Gram forms, no per-example gradient formed where the kind has a compact form) and
:meth:`Contribution.select` keeps a few examples for a weighted sum over them.

A new *kind* of contribution is one subclass of :class:`Contribution` in this file
implementing its abstract methods (the registry contract tests in
``tests/clipping/test_contract.py`` then cover it through the layers that return it, and
``tests/clipping/test_contributions_compare.py`` checks its reductions against materialised gradients).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

import torch

from featuredp.clipping.base import add_up

__all__ = [
    "Contribution",
    "Dense",
    "NormCache",
    "Outer",
    "Passes",
    "Rows",
]

# Largest number of elements of one temporary block (Gram matrices or materialised per-example
# gradients) before the work is split over the batch: 2^24 floats = 64 MB in float32.
_BLOCK_ELEMENTS = 1 << 24

# Gram-form entries are float32 dot products with relative error up to ~d·2⁻²⁴ of ‖a_t‖‖a_s‖. Where the
# squared norm is below this fraction of its bound (Σ_t ‖a_t‖‖g_t‖)² — the terms of Σ_{t,s} cancel, as in
# ℓ(x) − ℓ_pub(x') when ℓ_pub predicts ℓ well — the example is recomputed in float64, so that cancellation
# can never hide a large gradient from clipping.
_CANCELLATION = 0.1
# The Gram form's cost per multiply-add of its two Gram matrices, against materialising the per-example gradient:
# it also forms their float64 product, the bound above and, where terms cancel, the whole form again in float64.
# A conv after GroupNorm(C, C) (Opacus's ModuleValidator.fix of a BatchNorm) cancels on every row: its output
# gradients sum to ~0 over the positions. Materialising is never less accurate (a sum of squares does not cancel).
_GRAM_COST = 2.0

#: Row norms already computed in one batch, keyed by (data pointer, shape, strides) of the tensor.
NormCache = dict[tuple[int, tuple[int, ...], tuple[int, ...]], torch.Tensor]

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
    def select(self, rows: torch.Tensor) -> Contribution:
        """The contribution of the examples ``rows`` only (example j of the result is example rows[j])."""

    def compare(self, rows: torch.Tensor, ref: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(‖x_j‖², ⟨x_j, ref_j⟩) in float64 for the per-example gradients x_j of the examples ``rows`` and
        ``ref`` (k, *param.shape): with ‖ref_j‖² they give ‖x_j − ref_j‖², the separability check's distance.

        This default materialises the k gradients; kinds with a compact form override it with Gram forms
        and inner products (float64 throughout: the distance is a difference of nearly equal terms).
        """
        k = len(rows)
        mine = self.examples(rows).reshape(k, -1).to(torch.float64)
        theirs = ref.reshape(k, -1).to(torch.float64)
        return mine.square().sum(1), (mine * theirs).sum(1)

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
        if _GRAM_COST * T * T * (din + dout) <= T * din * dout:
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

    def select(self, rows: torch.Tensor) -> Outer:
        """The examples ``rows``' activations and output gradients."""
        return Outer(self.a[rows], self.g[rows], self.shape, self.columns)

    def compare(self, rows: torch.Tensor, ref: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Gram form Σ_{t,s} (a_t·a_s)(g_t·g_s) and Σ_t g_tᵀ ref a_t, in float64, without forming g aᵀ."""
        a, g = self.a[rows].to(torch.float64), self.g[rows].to(torch.float64)  # (k, T, K, din), (k, T, K, dout)
        k, T, K, _ = a.shape
        r = ref.reshape(k, K, g.shape[-1], -1)  # elements ordered (group, dout, din)
        if self.columns is not None:
            r = r.index_select(-1, self.columns)
        r = r.to(torch.float64)
        if T == 1 and K == 1:  # one token: ‖g aᵀ‖² = ‖a‖²‖g‖², and gᵀ r a is one matrix-vector product
            a1, g1 = a.reshape(k, -1), g.reshape(k, -1)
            r2 = r.reshape(k, *r.shape[-2:])
            # One matrix-vector product per example: float64 bmm of (k, dout, din) by vectors is ~5x slower.
            inner = torch.stack([torch.dot(torch.mv(r2[j], a1[j]), g1[j]) for j in range(k)])
            return a1.square().sum(1) * g1.square().sum(1), inner
        inner = (torch.einsum("bkoi,btki->btko", r, a) * g).sum((1, 2, 3))
        return _gram_sq_norms(a.permute(0, 2, 1, 3), g.permute(0, 2, 1, 3)), inner

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

    def select(self, rows: torch.Tensor) -> Passes:
        """Every pass's rows ``rows``."""
        return Passes([p.select(rows) for p in self.parts], self.shape)

    def compare(self, rows: torch.Tensor, ref: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Σ_{p,q} (a_p·a_q)(g_p·g_q) and Σ_p g_pᵀ ref a_p in float64, without forming Σ_p g_p a_pᵀ."""
        wide = [Outer(p.a[rows].to(torch.float64), p.g[rows].to(torch.float64), p.shape, p.columns)
                for p in self.parts]  # fmt: skip
        inner = add_up([p.compare(torch.arange(len(rows), device=rows.device), ref)[1] for p in wide])
        return _passes_sq_norms_of(wide, len(rows))[0], inner

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

    def select(self, rows: torch.Tensor) -> Rows:
        """The tokens of the examples ``rows``, renumbered by their position in ``rows``."""
        keep, pos = self._positions(rows)
        return Rows(pos, self.index[keep], self.value[keep], len(rows), self.shape)

    def compare(self, rows: torch.Tensor, ref: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Norms from the aggregated rows and Σ_j value_j · ref[index_j], in float64: the (V, d) gradients of
        the examples are never formed (a tied GPT-2 table is 38M numbers per example)."""
        sel = self.select(rows)
        k = len(rows)
        inner = torch.zeros(k, dtype=torch.float64, device=self.value.device)
        if sel.example.numel():
            hit = ref.reshape(k, *self.shape)[sel.example.to(ref.device), sel.index.to(ref.device)]
            inner.index_add_(0, sel.example, (sel.value.to(torch.float64) * hit.to(torch.float64)).sum(1))
        return sel.squared_norms(), inner

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

    def select(self, rows: torch.Tensor) -> Dense:
        """grad[rows]."""
        return Dense(self.grad[rows])

    def without(self, drop: torch.Tensor) -> Contribution:
        """The dropped examples' gradients set to zero."""
        return Dense(torch.where(~drop.view(-1, *[1] * (self.grad.dim() - 1)), self.grad, 0))

    @classmethod
    def combine(cls, parts: Sequence[Dense]) -> Contribution:
        """The per-example gradients added up."""
        return Dense(add_up([p.grad for p in parts]))


def _shape_of(c: Contribution) -> torch.Size | None:
    """The parameter's shape, for the kinds that record it (None for a kind that does not)."""
    if isinstance(c, Dense):
        return c.grad.shape[1:]
    shape = getattr(c, "shape", None)
    return None if shape is None else torch.Size(shape)
