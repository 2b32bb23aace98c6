"""Tests of featuredp.experiments.

A package, so that test_grid.py may share its basename with tests/diffusion/test_grid.py.
"""
