"""The convolution rule's input patches are exactly ``unfold``'s, for every kernel, dilation, padding and stride.

Ghost's per-example convolution gradients are Σ_t g_t a_tᵀ over these patches; a patch in the wrong order or place
would give every norm and clipped sum of a convolution wrongly (tests/clipping/test_contract.py checks the sums
end to end; this pins the layout itself, including the shapes the contract's zoo does not have).
"""

from __future__ import annotations

import itertools

import pytest
import torch
from torch.nn import functional as nnf

from featuredp.clipping.rules import _patches

SHAPES = [(3, 7, 9), (4, 8, 8), (2, 1, 11)]
KERNELS = [(1, 1), (3, 3), (2, 3), (1, 5)]
DILATIONS = [(1, 1), (2, 1), (1, 3)]
PADDINGS = [(0, 0), (1, 2), (2, 1)]
STRIDES = [(1, 1), (2, 1), (3, 2)]
CASES = list(itertools.product(SHAPES, KERNELS, DILATIONS, PADDINGS, STRIDES))


@pytest.mark.parametrize("shape", SHAPES)
def test_patches_equal_unfold_transposed(shape):
    x = torch.randn(2, *shape, generator=torch.Generator().manual_seed(0))
    checked = 0
    for _, kernel, dilation, padding, stride in (c for c in CASES if c[0] == shape):
        try:
            want = nnf.unfold(x, kernel, dilation=dilation, padding=padding, stride=stride).transpose(1, 2)
        except RuntimeError:  # the kernel does not fit: the convolution itself refuses the input
            continue
        got = _patches(x, kernel, dilation, padding, stride)
        assert got.shape == want.shape and torch.equal(got, want), (shape, kernel, dilation, padding, stride)
        checked += 1
    assert checked >= 20


def test_patches_of_a_strided_input_are_those_of_its_contiguous_copy():
    x = torch.randn(2, 8, 6, 3).permute(0, 3, 1, 2)  # channels-last storage
    assert torch.equal(_patches(x, (3, 3), (1, 1), (1, 1), (1, 1)),
                       _patches(x.contiguous(), (3, 3), (1, 1), (1, 1), (1, 1)))  # fmt: skip
