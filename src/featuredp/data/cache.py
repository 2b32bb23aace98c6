"""Where fetched and derived datasets are cached.

Order: an explicit ``cache_dir`` argument, then the ``FEATUREDP_CACHE``
environment variable, then ``$XDG_CACHE_HOME/featuredp`` (default
``~/.cache/featuredp``).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

CACHE_ENV = "FEATUREDP_CACHE"


def cache_dir(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The featuredp cache directory (not created)."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "featuredp"


def sha256_file(path: str | os.PathLike[str]) -> str:
    """Hex sha256 of a file, read in chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
