"""The reference for the lazy noise transform: a word stream laid out as the samplers draw it, through the
three-word ``normals_from_words``."""

from __future__ import annotations

import torch

from featuredp.noise.sources import REFINE_BELOW, normals_from_words


def reference_normals(stream: torch.Tensor, pairs: int) -> torch.Tensor:
    """What one block of ``pairs`` pairs drawn as ``stream`` (``2·pairs + R`` words: angles, high radius words, then
    the low words in order of the pairs that need one) must give: the reference transform of the three rows, each
    pair that needs no low word taking the word 0 (any word gives the same result for it)."""
    angle, high, low = stream[:pairs], stream[pairs : 2 * pairs], stream[2 * pairs :]
    need = high < REFINE_BELOW
    w2 = torch.zeros(pairs, dtype=torch.int64)
    w2[need] = low[: int(need.sum())]
    return normals_from_words(torch.stack([angle, high, w2]))
