"""Where fetched and derived datasets are cached, and how files get there.

Order: an explicit ``cache_dir`` argument, then the ``FEATUREDP_CACHE``
environment variable, then ``$XDG_CACHE_HOME/featuredp`` (default
``~/.cache/featuredp``).

Datasets that are not bundled fetch themselves on first use (:func:`download`:
a progress bar on a terminal, the sha256 checked before anything is kept, the file
written atomically). ``FEATUREDP_OFFLINE=1`` (``--offline`` on the command line)
forbids every download: a dataset missing from the cache is then an error that
names the command that fetches it (:func:`check_online`).
"""

from __future__ import annotations

import hashlib
import os
import sys
import urllib.request
from pathlib import Path

from featuredp._io import atomic_path
from featuredp.errors import DataValidationError

CACHE_ENV = "FEATUREDP_CACHE"
OFFLINE_ENV = "FEATUREDP_OFFLINE"
_CHUNK = 1 << 16


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


def offline() -> bool:
    """Whether downloads are forbidden (``FEATUREDP_OFFLINE`` set to 1/true/yes/on)."""
    return os.environ.get(OFFLINE_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def check_online(what: str, command: str, folder: str | os.PathLike[str]) -> None:
    """FileNotFoundError naming ``command`` if downloads are off; ``what`` is missing from ``folder``."""
    if offline():
        raise FileNotFoundError(
            f"{what} is not in the cache {str(folder)!r} and downloads are off ({OFFLINE_ENV}=1 / --offline); "
            f"run `{command}` once while online (or point {CACHE_ENV} / --cache-dir at a cache that has it)"
        )


def download(url: str, dest: str | os.PathLike[str], *, sha256: str, progress: bool | None = None,
             what: str | None = None, timeout: float = 60.0) -> Path:  # fmt: skip
    """Fetch ``url`` into ``dest``: streamed, sha256-checked, atomic; return ``dest``.

    The bytes go to a temporary file next to ``dest`` and replace it only once their sha256
    equals ``sha256``; on a mismatch (DataValidationError naming both digests), a network
    error or an interrupt, nothing is left behind. ``progress`` (default: when stderr is a
    terminal) shows a tqdm bar on stderr; otherwise one line says what is being fetched.
    ``file://`` URLs work too (tests, local mirrors).
    """
    from tqdm.auto import tqdm  # a dependency; imported here to keep `import featuredp.data` light

    target = Path(dest)
    label = what or target.name
    show = sys.stderr.isatty() if progress is None else progress
    if offline():
        raise FileNotFoundError(f"downloads are off ({OFFLINE_ENV}=1 / --offline): not fetching {url}")
    digest = hashlib.sha256()
    with atomic_path(target) as tmp, urllib.request.urlopen(url, timeout=timeout) as response:
        total = int(response.headers.get("Content-Length") or 0) or None
        if not show:
            size = f" ({total / 1e6:.1f} MB)" if total else ""
            print(f"featuredp: fetching {label}{size} from {url}", file=sys.stderr)
        with open(tmp, "wb") as fh, tqdm(total=total, unit="B", unit_scale=True, desc=f"fetching {label}",
                                         disable=not show, file=sys.stderr, leave=False) as bar:  # fmt: skip
            for chunk in iter(lambda: response.read(_CHUNK), b""):
                fh.write(chunk)
                digest.update(chunk)
                bar.update(len(chunk))
        got = digest.hexdigest()
        if got != sha256:
            raise DataValidationError(
                f"sha256 of {label} from {url} is {got}, expected {sha256}; refusing it (nothing was written)"
            )
    return target
