"""The compact reductions the cheaper ghost checks rely on, against materialised per-example gradients.

``compare(rows, ref)`` gives (‖x_j‖², ⟨x_j, ref_j⟩) from Gram forms and inner products without forming x_j, and
``select(rows)`` keeps the examples ``rows`` (the chunk check's weighted sum over its rows). Both must equal what
the materialised gradients give, for every kind of contribution, or the checks would compare the wrong thing.
"""

from __future__ import annotations

import pytest
import torch

from featuredp.clipping.contributions import Contribution, Dense, Outer, Passes, Rows
from featuredp.clipping.mixed import Mixed

B = 5


def _g() -> torch.Generator:
    return torch.Generator().manual_seed(0)


def outer_one_token() -> Contribution:
    g = _g()
    return Outer(torch.randn(B, 1, 1, 7, generator=g), torch.randn(B, 1, 1, 4, generator=g), torch.Size([4, 7]))


def outer_tokens_groups() -> Contribution:
    g = _g()
    return Outer(torch.randn(B, 3, 2, 6, generator=g), torch.randn(B, 3, 2, 4, generator=g), torch.Size([8, 6]))


def outer_columns() -> Contribution:
    g = _g()
    cols = torch.tensor([0, 3, 5])
    return Outer(torch.randn(B, 1, 1, 3, generator=g), torch.randn(B, 1, 1, 4, generator=g), torch.Size([4, 7]), cols)


def passes() -> Contribution:
    g = _g()
    full = Outer(torch.randn(B, 1, 1, 7, generator=g), torch.randn(B, 1, 1, 4, generator=g), torch.Size([4, 7]))
    public = Outer(torch.randn(B, 1, 1, 2, generator=g), torch.randn(B, 1, 1, 4, generator=g), torch.Size([4, 7]),
                   torch.tensor([1, 6]))  # fmt: skip
    return Passes([full, public], torch.Size([4, 7]))


def rows() -> Contribution:
    g = _g()
    example = torch.tensor([0, 0, 1, 3, 3, 3, 4])
    index = torch.tensor([2, 2, 0, 1, 4, 1, 3])
    return Rows(example, index, torch.randn(7, 6, generator=g), B, torch.Size([5, 6]))


def dense() -> Contribution:
    return Dense(torch.randn(B, 4, 3, generator=_g()))


def mixed() -> Contribution:
    g = _g()
    table = rows()
    head = Outer(torch.randn(B, 2, 1, 6, generator=g), torch.randn(B, 2, 1, 5, generator=g), torch.Size([5, 6]))
    return Mixed([table, head])


KINDS = {"outer_one_token": outer_one_token, "outer_tokens_groups": outer_tokens_groups,
         "outer_columns": outer_columns, "passes": passes, "rows": rows, "dense": dense, "mixed": mixed}  # fmt: skip


@pytest.mark.parametrize("kind", KINDS)
def test_compare_equals_the_materialised_norms_and_inner_products(kind):
    c = KINDS[kind]()
    picked = torch.tensor([3, 0])
    x = c.examples(picked).to(torch.float64)
    ref = torch.randn(x.shape, generator=torch.Generator().manual_seed(1))
    sq, dot = c.compare(picked, ref)
    assert sq.dtype == dot.dtype == torch.float64
    torch.testing.assert_close(sq, x.reshape(2, -1).square().sum(1), rtol=1e-5, atol=1e-9)
    torch.testing.assert_close(dot, (x * ref.to(torch.float64)).reshape(2, -1).sum(1), rtol=1e-5, atol=1e-9)
    # the distance the check uses, ‖x − ref‖² = ‖x‖² − 2⟨x, ref⟩ + ‖ref‖², is the materialised one
    dist = sq - 2 * dot + ref.to(torch.float64).reshape(2, -1).square().sum(1)
    torch.testing.assert_close(dist, (x - ref).reshape(2, -1).square().sum(1), rtol=1e-5, atol=1e-9)


@pytest.mark.parametrize("kind", KINDS)
def test_select_keeps_exactly_the_chosen_examples(kind):
    c = KINDS[kind]()
    picked = torch.tensor([4, 1, 2])
    w = torch.tensor([0.5, -1.5, 2.0])
    full = torch.zeros(B)
    full[picked] = w
    torch.testing.assert_close(c.select(picked).weighted_sum(w), c.weighted_sum(full), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(c.select(picked).examples(torch.arange(3)), c.examples(picked))


def test_the_flat_comparison_equals_the_compact_one_on_every_kind():
    """Small models compare materialised rows (distances.flat): it must give the compact forms' distances, or the
    every-step check would compare something else on them."""
    from featuredp.clipping import distances

    combined = {kind: make() for kind, make in KINDS.items()}
    picked = torch.tensor([3, 0])
    gen = torch.Generator().manual_seed(2)
    alone = {kind: c.examples(picked) + 0.1 * torch.randn(c.examples(picked).shape, generator=gen)
             for kind, c in combined.items()}  # fmt: skip
    alone["absent"] = torch.randn(2, 3, generator=gen)  # a parameter no ghost gradient reached
    err_sq, ref_sq, _ = distances.compact(combined, picked, alone)
    flat_err, flat_ref = distances.flat(combined, picked, alone)
    torch.testing.assert_close(flat_err, err_sq, rtol=1e-5, atol=1e-9)
    torch.testing.assert_close(flat_ref, ref_sq, rtol=1e-9, atol=0.0)
