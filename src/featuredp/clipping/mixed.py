"""One parameter reached by layers of different kinds (tied weights): :func:`combine` and :class:`Mixed`.

A parameter that layers of different kinds reach — a token embedding tied to the output head gets
:class:`~featuredp.clipping.contributions.Rows` from the lookups and
:class:`~featuredp.clipping.contributions.Outer` from the head — is one :class:`Mixed`
contribution: each kind's parts combined by that kind, plus the cross terms
2⟨c_k,i, c_l,i⟩ of its squared norm from a formula per pair of kinds (Rows × Outer without
forming the (V, d) gradient per example), or, for a pair without one, from per-example
gradients materialised a block of examples at a time.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from featuredp.clipping.base import add_up
from featuredp.clipping.contributions import (
    _BLOCK_ELEMENTS,
    _CANCELLATION,
    Contribution,
    NormCache,
    Outer,
    Passes,
    Rows,
    _chunks,
    _shape_of,
    _SumOfParts,
)

__all__ = ["CrossTerm", "Mixed", "combine"]


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

    def select(self, rows: torch.Tensor) -> Contribution:
        """Every part's examples ``rows``."""
        return Mixed([p.select(rows) for p in self.parts])

    def compare(self, rows: torch.Tensor, ref: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Σ_k ‖c_k‖² + 2 Σ_{k<l} ⟨c_k, c_l⟩ and Σ_k ⟨c_k, ref⟩ from the parts' own compact forms and the cross
        terms' formulas, all in float64 (no (V, d) gradient per example where the pair of kinds has a formula)."""
        parts = [p.select(rows) for p in self.parts]
        k = len(rows)
        here = torch.arange(k, device=rows.device)
        own = [p.compare(here, ref) for p in parts]
        sq, inner = add_up([o[0] for o in own]), add_up([o[1] for o in own])
        for i in range(len(parts)):
            for j in range(i + 1, len(parts)):
                sq = sq + 2 * _cross(parts[i], parts[j], k, sq.device).to(sq.device)
        return sq, inner

    @classmethod
    def combine(cls, parts: Sequence[Mixed]) -> Contribution:
        """The parts of all, regrouped by kind (:func:`combine`)."""
        return combine(parts)
