"""Helpers for the user's own loop, at the paths Opacus users know (``featuredp.utils.batch_memory_manager``)."""
