"""Sample grids: tiling and the PNG writer (which leaves the matplotlib backend alone)."""

from __future__ import annotations

import matplotlib
import numpy as np
import pytest
import torch
from matplotlib import image as mpimg

from featuredp.diffusion.grid import make_grid, save_grid, to_uint8


def test_to_uint8_and_tiling() -> None:
    x = torch.tensor([-1.0, 0.0, 1.0]).view(1, 1, 1, 3)
    assert to_uint8(x).tolist() == [[[[0, 128, 255]]]]
    grid = make_grid(torch.zeros(5, 3, 4, 4), nrow=2, pad=1)
    assert grid.shape == (3 * 5 + 1, 2 * 5 + 1, 3) and grid.dtype == np.uint8
    with pytest.raises(ValueError, match="non-empty"):
        make_grid(torch.zeros(0, 1, 4, 4))


def test_save_grid_writes_a_png_and_keeps_the_backend(tmp_path) -> None:
    backend = matplotlib.get_backend()
    images = torch.linspace(-1, 1, 2 * 16).view(2, 1, 4, 4)
    path = tmp_path / "grid.png"
    save_grid(images, path, nrow=2)
    back = mpimg.imread(path)
    assert back.shape[:2] == make_grid(images, 2).shape and matplotlib.get_backend() == backend
    assert [p.name for p in tmp_path.iterdir()] == ["grid.png"]  # written atomically: no temporary left
