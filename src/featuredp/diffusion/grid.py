"""Sample grids as PNG files (written atomically)."""

from __future__ import annotations

import os

import numpy as np
import torch

from featuredp._io import atomic_path
from featuredp._validate import check_int

__all__ = ["make_grid", "save_grid", "to_uint8"]


def to_uint8(images: torch.Tensor | np.ndarray) -> np.ndarray:
    """uint8 (N, C, H, W) from float images in [-1, 1] (or uint8, passed through)."""
    x = images.detach().cpu().numpy() if isinstance(images, torch.Tensor) else np.asarray(images)
    if x.dtype == np.uint8:
        return x
    return np.clip(np.rint((x + 1.0) * 127.5), 0, 255).astype(np.uint8)


def make_grid(images: torch.Tensor | np.ndarray, nrow: int = 10, pad: int = 2) -> np.ndarray:
    """Tile images (N, C, H, W) into one (H', W') or (H', W', 3) uint8 array, ``nrow`` per row.

    >>> make_grid(torch.zeros(3, 1, 4, 4), nrow=2).shape  # 2 rows of 2 tiles, 2-pixel gaps
    (14, 14)
    """
    x = to_uint8(images)
    if x.ndim != 4 or len(x) == 0:
        raise ValueError(f"images must be a non-empty (N, C, H, W) batch, got shape {x.shape}")
    nrow = check_int("nrow", nrow, minimum=1)
    n, c, h, w = x.shape
    rows = -(-n // nrow)
    cols = min(nrow, n)
    grid = np.full((c, rows * (h + pad) + pad, cols * (w + pad) + pad), 255, np.uint8)
    for i in range(n):
        r, k = divmod(i, nrow)
        grid[:, pad + r * (h + pad): pad + r * (h + pad) + h, pad + k * (w + pad): pad + k * (w + pad) + w] = x[i]
    return grid[0] if c == 1 else grid.transpose(1, 2, 0)


def save_grid(images: torch.Tensor | np.ndarray, path: str | os.PathLike[str], nrow: int = 10) -> None:
    """Write a PNG sample grid atomically (grayscale or RGB)."""
    # matplotlib.image, not pyplot: writing a PNG needs no GUI backend, so the caller's backend is left alone.
    # Imported here because matplotlib is slow to import and only this function needs it.
    from matplotlib import image as mpimg

    grid = make_grid(images, nrow)
    with atomic_path(path) as tmp:
        mpimg.imsave(tmp, grid, cmap="gray" if grid.ndim == 2 else None, vmin=0, vmax=255, format="png")
