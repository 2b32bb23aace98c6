"""Deprecated import path (one release): use :mod:`featuredp.features` (``featuredp.features.image``)."""

import warnings

from featuredp.features.image import BoxMask, GaussianBlur, ImageFeatureMap, Pixelate, gaussian_kernel1d  # noqa: F401

warnings.warn("featuredp.image_features is deprecated: import the image maps from featuredp.features",
              DeprecationWarning, stacklevel=2)
