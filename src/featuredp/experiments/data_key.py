"""A keyed digest of a dataset's contents, for caches (``compare`` cells and grid tuning files).

Cached results must be keyed by what the data *is*, not by its path: a CSV edited in place must never have its
new row counts printed next to accuracies from the old contents. A plain hash of private data published in a
results folder would let anyone confirm a guess of the whole dataset, so the digest is an HMAC-SHA256 under a
secret key of this user's (32 bytes from ``os.urandom``, created once, owner-only, in the private folder of
:func:`featuredp.experiments.runs.private_root`): equal data gives equal keys on this machine, and the key
reveals nothing checkable to whoever reads the results.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import tempfile
from typing import Any

import numpy as np

from featuredp._io import private_dir
from featuredp.batches import as_batch
from featuredp.experiments.runs import private_root
from featuredp.run_state import data_fingerprint

__all__ = ["data_key"]

_KEY_FILE = "cache-key"


def _secret() -> bytes:
    root = private_root()
    path = root / _KEY_FILE
    if not path.is_file():
        private_dir(root)
        fd, tmp = tempfile.mkstemp(prefix=f".{_KEY_FILE}.", dir=root)  # mode 0600
        try:
            os.write(fd, os.urandom(32))
            os.fsync(fd)
            os.close(fd)
            # A hard link appears whole or not at all, and never replaces another process's key.
            with contextlib.suppress(FileExistsError):
                os.link(tmp, path)
        finally:
            os.unlink(tmp)
    key = path.read_bytes()
    if len(key) != 32:
        raise ValueError(f"the cache key {path} is damaged (expected 32 bytes, got {len(key)}); delete it")
    return key


def data_key(*datasets: Any) -> str:
    """A 16-hex-digit keyed digest of the datasets' contents (``None`` entries count as absent).

    >>> import numpy as np
    >>> a = {"x": np.zeros((3, 2), dtype=np.float32), "y": np.zeros(3, dtype=np.int64)}
    >>> data_key(a) == data_key(dict(a)) and data_key(a) != data_key({**a, "y": np.ones(3, dtype=np.int64)})
    True
    """
    prints = ["-" if d is None else _contents(d) for d in datasets]
    return hmac.new(_secret(), "|".join(prints).encode(), hashlib.sha256).hexdigest()[:16]


def _contents(dataset: Any) -> str:
    """The engine's fingerprint of a table or a dict of tensors; for other datasets (images), a SHA-256 of their
    numpy arrays with their names, dtypes and shapes."""
    if isinstance(dataset, dict) or (hasattr(dataset, "X") and hasattr(dataset, "y")):
        return data_fingerprint(as_batch(dataset))
    h = hashlib.sha256()
    arrays = {k: v for k, v in sorted(vars(dataset).items()) if isinstance(v, np.ndarray)}
    if not arrays:
        raise TypeError(f"data_key needs a table, a dict of tensors or a dataset of numpy arrays, got "
                        f"{type(dataset).__name__}")  # fmt: skip
    for name, arr in arrays.items():
        h.update(f"{name}:{arr.dtype.str}:{arr.shape};".encode())
        h.update(np.ascontiguousarray(arr).tobytes())
    return h.hexdigest()
