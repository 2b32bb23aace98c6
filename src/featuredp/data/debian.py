"""Debian packages without root: ``apt-get download`` as the current user, the files of a ``.deb`` in Python.

Some public datasets are packaged by Debian (``dataset-fashion-mnist``). Installing them needs
root; *downloading* them does not: ``apt-get download NAME=VERSION`` fetches the ``.deb`` into the
current folder as any user, verified by apt against the signed archive index. A ``.deb`` is an
``ar`` archive holding ``debian-binary``, ``control.tar.*`` and ``data.tar.*``;
:func:`deb_files` parses the ``ar`` container, opens the data tarball (xz, gzip, bzip2 or
uncompressed; zstd where this Python's :mod:`tarfile` has it) and returns the bytes of the files
asked for. No dpkg, nothing installed, and no path from the archive is ever written to disk:
callers decide where the bytes go (and check their sha256 first).

>>> pkg = DebPackage("dataset-fashion-mnist", "0.0~git20200523.55506a9-1", "0" * 64)
>>> pkg.filename
'dataset-fashion-mnist_0.0~git20200523.55506a9-1_all.deb'
>>> pkg.url
'https://deb.debian.org/debian/pool/main/d/dataset-fashion-mnist/dataset-fashion-mnist_0.0~git20200523.55506a9-1_all.deb'
"""

from __future__ import annotations

import io
import os
import re
import shutil
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from featuredp.data.cache import run_fetch_command
from featuredp.errors import DataValidationError

__all__ = ["DebPackage", "apt_download", "deb_files", "deb_matching", "read_ar"]

_AR_MAGIC = b"!<arch>\n"
_AR_HEADER = 60
_DEBIAN_MIRROR = "https://deb.debian.org/debian"


@dataclass(frozen=True)
class DebPackage:
    """One pinned Debian package: name, exact version, the sha256 of its ``.deb``, architecture."""

    name: str
    version: str
    sha256: str
    arch: str = "all"
    component: str = "main"

    @property
    def filename(self) -> str:
        """The ``.deb`` file name in the archive pool (an epoch's ``:`` is written ``%3a``)."""
        return f"{self.name}_{self.version.replace(':', '%3a')}_{self.arch}.deb"

    @property
    def url(self) -> str:
        """Where deb.debian.org keeps the file (any Debian mirror has the same pool path)."""
        prefix = self.name[:4] if self.name.startswith("lib") else self.name[0]
        return f"{_DEBIAN_MIRROR}/pool/{self.component}/{prefix}/{self.name}/{self.filename}"


def apt_download(package: DebPackage, dest: str | os.PathLike[str], *, what: str, otherwise: str,
                 progress: bool | None = None) -> Path:  # fmt: skip
    """``apt-get download NAME=VERSION`` in ``dest`` as the current user; the path of the ``.deb``.

    ``otherwise`` completes the error when apt-get is missing (how else to get the files). A
    failing apt-get is a RuntimeError quoting its last lines. The sha256 is the caller's to check.
    """
    apt = shutil.which("apt-get")
    if apt is None:
        raise FileNotFoundError(
            f"apt-get is not available here, so {what} cannot be fetched from Debian; {otherwise}"
        )
    folder = Path(dest)
    run_fetch_command([apt, "download", f"{package.name}={package.version}"], folder, what=what, progress=progress)
    debs = sorted(folder.glob(f"{package.name}_*.deb"))
    if len(debs) != 1:
        raise RuntimeError(f"`apt-get download {package.name}` left {len(debs)} .deb files in {folder}, expected 1")
    return debs[0]


def _source(archive: str | os.PathLike[str] | bytes, label: str | None) -> tuple[bytes, str]:
    if isinstance(archive, bytes):
        return archive, label or "the package"
    return Path(archive).read_bytes(), label or str(archive)


def read_ar(archive: str | os.PathLike[str] | bytes, *, label: str | None = None) -> dict[str, bytes]:
    """The members of an ``ar`` archive (a ``.deb``: a path or its bytes), by name, in order.

    Reads the common format and both long-name variants (GNU ``//`` table, BSD ``#1/len``); a file
    that is not an ``ar`` archive or is cut short is a DataValidationError naming it (``label``).
    """
    data, p = _source(archive, label)
    if not data.startswith(_AR_MAGIC):
        raise DataValidationError(f"{p} is not a .deb (ar) archive (starts with {data[:8]!r})")
    members: dict[str, bytes] = {}
    long_names = b""
    pos = len(_AR_MAGIC)
    while pos < len(data):
        if data[pos : pos + 1] == b"\n":  # stray padding byte
            pos += 1
            continue
        header = data[pos : pos + _AR_HEADER]
        if len(header) < _AR_HEADER or header[58:60] != b"`\n":
            raise DataValidationError(f"{p}: broken ar member header at byte {pos}")
        try:
            size = int(header[48:58].decode("ascii").strip())
        except ValueError:
            raise DataValidationError(f"{p}: broken ar member size at byte {pos}") from None
        start, end = pos + _AR_HEADER, pos + _AR_HEADER + size
        if end > len(data):
            raise DataValidationError(f"{p} is cut short: a member needs {size} bytes at byte {start}")
        raw_name = header[:16].decode("ascii", "replace").rstrip()
        body = data[start:end]
        if raw_name == "//":  # GNU long-name table
            long_names = body
        elif raw_name.startswith("#1/"):  # BSD: the name precedes the body
            n = int(raw_name[3:])
            members[body[:n].rstrip(b"\0").decode()] = body[n:]
        elif raw_name.startswith("/") and raw_name[1:].isdigit():  # GNU: offset into the table
            off = int(raw_name[1:])
            members[long_names[off:].split(b"/\n", 1)[0].decode()] = body
        elif raw_name != "/":  # "/" is a symbol table
            members[raw_name.rstrip("/")] = body
        pos = end + (size & 1)
    return members


def _open_data_tar(members: dict[str, bytes], deb: str) -> tarfile.TarFile:
    names = [n for n in members if n == "data.tar" or n.startswith("data.tar.")]
    if len(names) != 1:
        raise DataValidationError(f"{deb} holds no single data.tar.* member (members: {', '.join(members)})")
    name = names[0]
    suffix = name.removeprefix("data.tar").lstrip(".")
    modes: dict[str, Any] = {"": "r:", "xz": "r:xz", "gz": "r:gz", "bz2": "r:bz2", "zst": "r:zst"}
    if suffix not in modes:
        raise DataValidationError(f"{deb}: unknown compression of {name}")
    if suffix == "zst" and "zst" not in getattr(tarfile.TarFile, "OPEN_METH", {}):
        raise DataValidationError(
            f"{deb} packs its files as {name}, and this Python's tarfile cannot read zstd (Python >= 3.14 can); "
            f"unpack it with `dpkg-deb -x {Path(deb).name} DIR` (or `ar x` and `unzstd`) and point featuredp at the "
            "files"
        )
    try:
        return tarfile.open(fileobj=io.BytesIO(members[name]), mode=modes[suffix])
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise DataValidationError(f"{deb}: {name} is not a readable tar archive ({exc})") from None


def _normal(path: str) -> str:
    return path.removeprefix("./").lstrip("/")


def deb_files(deb: str | os.PathLike[str] | bytes, paths: Sequence[str], *, label: str | None = None
              ) -> dict[str, bytes]:  # fmt: skip
    """The bytes of the regular files ``paths`` (e.g. ``usr/share/datasets/x.gz``) in a ``.deb``.

    ``deb`` is the file or its bytes (read once: check their sha256, then pass the same bytes).
    Nothing is extracted to disk. A path that is missing, or is not a regular file (a link, a
    folder), is a DataValidationError naming the package (``label``).
    """
    data, p = _source(deb, label)
    wanted = {_normal(x): x for x in paths}
    found: dict[str, bytes] = {}
    with _open_data_tar(read_ar(data, label=p), p) as tar:
        for member in tar:
            key = _normal(member.name)
            if key not in wanted:
                continue
            if not member.isfile():
                raise DataValidationError(f"{p}: {key} is not a regular file in the package")
            fh = tar.extractfile(member)
            if fh is None:
                raise DataValidationError(f"{p}: {key} cannot be read")
            found[wanted[key]] = fh.read()
    missing = [x for x in paths if x not in found]
    if missing:
        raise DataValidationError(f"{p} does not contain {', '.join(missing)}")
    return found


def deb_matching(deb: str | os.PathLike[str] | bytes, pattern: re.Pattern[str], *, label: str | None = None
                 ) -> dict[str, bytes]:  # fmt: skip
    """The bytes of every regular file of a ``.deb`` whose path (``usr/share/doc/x/y``, no ``./``) matches
    ``pattern`` in full, by that path. Links and folders are skipped, never followed; nothing goes to disk."""
    data, p = _source(deb, label)
    found: dict[str, bytes] = {}
    with _open_data_tar(read_ar(data, label=p), p) as tar:
        for member in tar:
            key = _normal(member.name)
            if not member.isfile() or pattern.fullmatch(key) is None:
                continue
            fh = tar.extractfile(member)
            if fh is None:
                raise DataValidationError(f"{p}: {key} cannot be read")
            found[key] = fh.read()
    return found
