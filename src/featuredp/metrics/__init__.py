"""Sample-quality metrics: Fréchet distance (FID), KID, Inception features, a domain classifier."""

from featuredp.metrics.frechet import feature_statistics, frechet_distance, frechet_from_features, kernel_distance

__all__ = ["feature_statistics", "frechet_distance", "frechet_from_features", "kernel_distance"]
