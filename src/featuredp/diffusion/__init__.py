"""Feature-DP diffusion models: the blurred image is public, the detail is private (paper §6.3).

Modules: :mod:`~featuredp.diffusion.unet` (class-conditional GroupNorm U-Net),
:mod:`~featuredp.diffusion.schedule` (DDPM schedules), :mod:`~featuredp.diffusion.sampler` (DDIM, DDPM),
:mod:`~featuredp.diffusion.losses` (the diffusion loss split with common random numbers),
:mod:`~featuredp.diffusion.rejection` (post-processing that drops blurry samples),
:mod:`~featuredp.diffusion.grid` (PNG sample grids). Training goes through :class:`featuredp.engine.Trainer`;
the five-method comparison (``run_compare``) is the application :mod:`featuredp.experiments.diffusion`.

Every module here needs torch, so the names are imported plainly: code that must stay torch-free
(the CLI parser) imports none of this package.
"""

from featuredp.diffusion.grid import make_grid, save_grid, to_uint8
from featuredp.diffusion.losses import DiffusionLoss, TimestepWeight, denoising_loss
from featuredp.diffusion.rejection import RejectionResult, laplacian_variance, public_threshold, rejection_sample
from featuredp.diffusion.sampler import ddim_sample, ddpm_sample, generate
from featuredp.diffusion.schedule import NoiseSchedule
from featuredp.diffusion.unet import PRESETS, UNet, UNetConfig, build_unet, count_parameters

__all__ = [
    "PRESETS",
    "DiffusionLoss",
    "NoiseSchedule",
    "RejectionResult",
    "TimestepWeight",
    "UNet",
    "UNetConfig",
    "build_unet",
    "count_parameters",
    "ddim_sample",
    "ddpm_sample",
    "denoising_loss",
    "generate",
    "laplacian_variance",
    "make_grid",
    "public_threshold",
    "rejection_sample",
    "save_grid",
    "to_uint8",
]
