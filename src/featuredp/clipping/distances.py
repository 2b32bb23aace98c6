"""The separability check's distance: how far ghost's gradients of a few rows are from the same rows computed alone.

Per checked example, over all parameters at once (the sensitivity is about a whole example's gradient), in float64:

* :func:`compact` takes ‖ghost − alone‖² = ‖ghost‖² − 2⟨ghost, alone⟩ + ‖alone‖² from each contribution's Gram form
  and inner products (:meth:`~featuredp.clipping.contributions.Contribution.compare`): ghost's per-example gradient
  is never formed, so a large layer (an embedding table) costs no more than its compact form;
* :func:`flat` forms ghost's rows and subtracts, for models whose checked rows are small (:data:`FLAT_ELEMENTS`):
  three operations instead of a few dozen per parameter, which on a small model cost more than the step's own work.

Both give the same distance (``tests/clipping/test_contributions_compare.py``), and the check refuses the same
models with either (``tests/clipping/test_ghost_every_step.py``).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from featuredp.clipping.contributions import Contribution

__all__ = ["FLAT_ELEMENTS", "compact", "flat", "of_parameter"]

#: Up to this many elements in the checked rows' gradients (k × the trainable parameters) the check uses
#: :func:`flat`; above it :func:`compact`. Measured on one thread (two rows of a Linear layer): 65 against 127 µs at
#: 7k parameters, 125 against 176 at 30k, but 1.8 ms against 0.37 at 180k, where fresh float64 blocks of that size
#: cost more than the compact forms' operations.
FLAT_ELEMENTS = 1 << 16


def of_parameter(terms: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """(‖ghost − alone‖, ‖alone‖) of one parameter from its :func:`compact` terms (‖ghost‖², ⟨ghost, alone⟩,
    ‖alone‖²), or from (‖alone‖²,) where no ghost gradient reached it."""
    if len(terms) == 1:
        return terms[0].sqrt(), terms[0].sqrt()
    m_sq, dot, r_sq = terms
    return (m_sq - 2 * dot + r_sq).clamp(min=0).sqrt(), r_sq.sqrt()


def compact(
    combined: dict[str, Contribution], rows: torch.Tensor, alone: Mapping[str, torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor, dict[str, tuple[torch.Tensor, ...]]]:
    """Per example of ``rows``: ‖ghost − alone‖² and ‖alone‖² (float64, (k,)), and each parameter's terms for
    :func:`of_parameter`.

    Each term comes from the contribution's compact form in float64; the difference of nearly equal terms keeps
    ~1e-8 of their size. ``alone`` holds every parameter's (k, *shape) gradients; a parameter absent from
    ``combined`` got no ghost gradient (its distance is its whole alone gradient)."""
    k = len(rows)
    mine_sq = torch.zeros(k, dtype=torch.float64, device=rows.device)
    inner, ref_sq = torch.zeros_like(mine_sq), torch.zeros_like(mine_sq)
    terms: dict[str, tuple[torch.Tensor, ...]] = {}
    for pname, ref in alone.items():
        r_sq = torch.linalg.vector_norm(ref.reshape(k, -1), dim=1, dtype=torch.float64).square()
        ref_sq += r_sq
        if pname in combined:
            m_sq, dot = combined[pname].compare(rows, ref)
            mine_sq += m_sq
            inner += dot
            terms[pname] = (m_sq, dot, r_sq)
        else:
            terms[pname] = (r_sq,)
    return mine_sq - 2 * inner + ref_sq, ref_sq, terms


def flat(
    combined: dict[str, Contribution], rows: torch.Tensor, alone: Mapping[str, torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`compact`'s (‖ghost − alone‖², ‖alone‖²) with ghost's gradients of ``rows`` formed: every parameter's
    rows in one (k, P) block. Each ghost row is formed in its parameter's dtype (one rounding per entry, ~1e-7 of the
    terms, as the alone gradient has) and the difference taken in float64, so the check's tolerances hold as they
    are."""
    k = len(rows)
    mine, ref = [], []
    for pname, r in alone.items():
        ref.append(r.reshape(k, -1))
        mine.append(combined[pname].examples(rows).reshape(k, -1) if pname in combined else torch.zeros_like(ref[-1]))
    theirs = torch.cat(ref, 1).to(torch.float64)
    return torch.cat(mine, 1).to(torch.float64).sub_(theirs).square_().sum(1), theirs.square_().sum(1)
