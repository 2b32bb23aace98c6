"""``--device``, shared by the commands that train (``train``, ``demo``, ``compare``, ``benchmark``)."""

from __future__ import annotations

import argparse


def add_device_argument(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """Add ``--device`` (default None: the CPU, where the model is built)."""
    parser.add_argument(
        "--device", default=None, metavar="DEVICE",
        help="where to train: cpu (default), cuda, cuda:N, mps or auto (a GPU if there is one); a device this "
        "machine does not have is an error before any work",
    )  # fmt: skip


def check_device(device: str | None) -> None:
    """Refuse a device that is not there (a one-line ValueError: exit 2) before any data is loaded."""
    if device is None:
        return
    from featuredp.batches import resolve_device  # imports torch: only when a command runs

    resolve_device(device)
