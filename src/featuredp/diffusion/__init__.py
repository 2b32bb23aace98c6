"""Feature-DP diffusion models: the blurred image is public, the detail is private (SPEC §4.4).

Modules: :mod:`~featuredp.diffusion.unet` (class-conditional GroupNorm U-Net),
:mod:`~featuredp.diffusion.schedule` (DDPM schedules), :mod:`~featuredp.diffusion.sampler` (DDIM, DDPM),
:mod:`~featuredp.diffusion.losses` (the diffusion loss split with common random numbers),
:mod:`~featuredp.diffusion.rejection` (post-processing that drops blurry samples),
:mod:`~featuredp.diffusion.grid` (PNG sample grids), :mod:`~featuredp.experiments.diffusion`
(the five-method comparison; ``run_compare``). Training goes through :class:`featuredp.engine.Trainer`.
"""

import importlib
from typing import Any

# Names resolve lazily (PEP 562) so that ``featuredp.experiments.diffusion`` can register its CLI
# options without importing torch: every ``featuredp`` command builds the full parser.
_EXPORTS = {
    "DiffusionLoss": "losses",
    "denoising_loss": "losses",
    "laplacian_variance": "rejection",
    "public_threshold": "rejection",
    "rejection_sample": "rejection",
    "ddim_sample": "sampler",
    "ddpm_sample": "sampler",
    "generate": "sampler",
    "NoiseSchedule": "schedule",
    "PRESETS": "unet",
    "UNet": "unet",
    "UNetConfig": "unet",
    "build_unet": "unet",
    "count_parameters": "unet",
}


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
