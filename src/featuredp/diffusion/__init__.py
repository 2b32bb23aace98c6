"""Feature-DP diffusion models: the blurred image is public, the detail is private (SPEC §4.4).

Modules: :mod:`~featuredp.diffusion.unet` (class-conditional GroupNorm U-Net),
:mod:`~featuredp.diffusion.schedule` (DDPM schedules), :mod:`~featuredp.diffusion.sampler` (DDIM, DDPM),
:mod:`~featuredp.diffusion.losses` (the diffusion loss split with common random numbers),
:mod:`~featuredp.diffusion.rejection` (post-processing that drops blurry samples),
:mod:`~featuredp.diffusion.grid` (PNG sample grids), :mod:`~featuredp.diffusion.experiments`
(the five-method comparison; ``run_compare``). Training goes through :class:`featuredp.engine.Trainer`.
"""

from featuredp.diffusion.losses import DiffusionLoss, denoising_loss
from featuredp.diffusion.rejection import laplacian_variance, public_threshold, rejection_sample
from featuredp.diffusion.sampler import ddim_sample, ddpm_sample, generate
from featuredp.diffusion.schedule import NoiseSchedule
from featuredp.diffusion.unet import PRESETS, UNet, UNetConfig, build_unet, count_parameters

__all__ = [
    "PRESETS",
    "DiffusionLoss",
    "NoiseSchedule",
    "UNet",
    "UNetConfig",
    "build_unet",
    "count_parameters",
    "ddim_sample",
    "ddpm_sample",
    "denoising_loss",
    "generate",
    "laplacian_variance",
    "public_threshold",
    "rejection_sample",
]
