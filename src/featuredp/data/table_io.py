"""Reading a table file: ``.csv``/``.csv.gz``/``.tsv`` or ``.parquet``, whole, some columns, or a row range.

The CSV delimiter is the file type's (``,``; ``\t`` for ``.tsv``) unless the header line says otherwise: a
header split by ``;``, ``|`` or a tab and not by the expected one is read with that delimiter
(:func:`table_separator`; the loaders warn with :func:`separator_note`). ``sep=`` forces one.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from featuredp._validate import check_int
from featuredp.errors import DataValidationError

__all__ = [
    "SEPARATORS",
    "check_separator",
    "count_rows",
    "file_kind",
    "read_header",
    "read_table",
    "separator_note",
    "table_separator",
]

#: the delimiters a CSV file may use: what :func:`table_separator` detects and ``--sep`` accepts
SEPARATORS = (",", ";", "\t", "|")
_SEP_NAMES = {",": "comma", ";": "semicolon", "\t": "tab", "|": "pipe"}


def file_kind(path: str | os.PathLike[str]) -> str:
    """``"parquet"``, ``"tsv"`` or ``"csv"`` from the file name; ValueError for anything else."""
    suffixes = "".join(Path(path).suffixes).lower()
    if suffixes.endswith(".parquet") or suffixes.endswith(".pq"):
        return "parquet"
    if ".tsv" in suffixes:
        return "tsv"
    if ".csv" in suffixes:
        return "csv"
    raise ValueError(f"path {str(path)!r}: unsupported file type (use .csv, .csv.gz, .tsv or .parquet)")


def read_table(
    path: str | os.PathLike[str],
    columns: Sequence[str] | None = None,
    rows: tuple[int, int] | None = None,
    sep: str | None = None,
) -> pd.DataFrame:
    """Read a ``.csv``/``.csv.gz``/``.tsv`` or ``.parquet`` file into a DataFrame (only ``columns`` if given).

    ``rows=(start, stop)``: only the data rows ``start .. stop − 1`` (0-based, the header not counted),
    without reading the others into memory: Parquet reads only the row groups that hold them, a CSV is
    skipped through line by line. A rank of a data-parallel run loads its shard this way
    (docs/distributed.md). ``sep``: the CSV delimiter (default: :func:`table_separator`'s).
    """
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"path {str(p)!r} does not exist or is not a file")
    kind = file_kind(p)
    cols = None if columns is None else list(columns)
    if rows is not None:
        start, stop = check_int("rows[0]", rows[0], minimum=0), check_int("rows[1]", rows[1], minimum=0)
        if stop < start:
            raise ValueError(f"rows must be (start, stop) with start <= stop, got {rows!r}")
        if kind == "parquet":
            return _parquet_rows(p, cols, start, stop)
        return pd.read_csv(p, sep=table_separator(p, sep), usecols=cols,
                           skiprows=range(1, start + 1), nrows=stop - start)  # fmt: skip
    if kind == "parquet":
        return pd.read_parquet(p, columns=cols)
    return pd.read_csv(p, sep=table_separator(p, sep), usecols=cols)


def _parquet_rows(path: Path, columns: list[str] | None, start: int, stop: int) -> pd.DataFrame:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(path)
    tables, first = [], 0
    for g in range(pf.metadata.num_row_groups):
        size = pf.metadata.row_group(g).num_rows
        lo, hi = max(start, first), min(stop, first + size)
        if lo < hi:
            tables.append(pf.read_row_group(g, columns=columns).slice(lo - first, hi - lo))
        first += size
    if not tables:
        return pf.schema_arrow.empty_table().select(columns or pf.schema_arrow.names).to_pandas()
    return pa.concat_tables(tables).to_pandas()


def count_rows(path: str | os.PathLike[str], sep: str | None = None) -> int:
    """The number of data rows of a table file: Parquet's metadata, or a CSV read one column at a time.

    Every rank of a sharded run computes the same count from the same file, so the shards agree.
    """
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"path {str(p)!r} does not exist or is not a file")
    kind = file_kind(p)
    if kind == "parquet":
        import pyarrow.parquet as pq

        return int(pq.ParquetFile(p).metadata.num_rows)
    first = read_header(p, sep=sep)[:1]
    chunks = pd.read_csv(p, sep=table_separator(p, sep), usecols=first, chunksize=1 << 20)
    return sum(len(c) for c in chunks)


def read_header(path: str | os.PathLike[str], sep: str | None = None) -> list[str]:
    """The column names of a table file, reading no values (``sep``: as :func:`read_table`'s)."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"path {str(p)!r} does not exist or is not a file")
    kind = file_kind(p)
    if kind == "parquet":
        import pyarrow.parquet as pq

        names = [str(c) for c in pq.read_schema(p).names]
        _check_unique(p, names)
        return names
    sep = table_separator(p, sep)
    # pandas renames a repeated name ("x", "x.1"): read the header line as values to see it as written.
    first = pd.read_csv(p, sep=sep, header=None, nrows=1, dtype=str, keep_default_na=False)
    _check_unique(p, [str(c).strip() for c in first.iloc[0].tolist()] if len(first) else [])
    return [str(c) for c in pd.read_csv(p, sep=sep, nrows=0).columns]


def _check_unique(path: Path, names: Sequence[str]) -> None:
    counts = Counter(names)
    dups = [c for c in counts if counts[c] > 1]
    if dups:
        raise DataValidationError(
            f"path {str(path)!r} repeats the column name(s) {dups} in its header: every column needs its own "
            "name (rename or remove the copies)"
        )


def _default_separator(path: str | os.PathLike[str]) -> str:
    return "\t" if file_kind(path) == "tsv" else ","


def check_separator(sep: str) -> str:
    """``sep`` if it is one of :data:`SEPARATORS` (``"tab"`` and ``"\\t"`` are the tab); ValueError otherwise."""
    value = {"tab": "\t", "\\t": "\t"}.get(sep, sep)
    if value not in SEPARATORS:
        raise ValueError(f"sep must be one of {', '.join(repr(s) for s in SEPARATORS)} (or 'tab'), got {sep!r}")
    return value


def table_separator(path: str | os.PathLike[str], sep: str | None = None) -> str:
    """The delimiter to read the CSV file ``path`` with: ``sep`` if given, else the file type's (``,``; a tab
    for ``.tsv``) unless the header line holds none of it and one of :data:`SEPARATORS` instead (the one it
    holds most of). Only the header line is read: the choice never depends on a value.
    """
    if sep is not None:
        return check_separator(sep)
    expected = _default_separator(path)
    header = _header_line(Path(path))
    if expected in header:
        return expected
    found = max(SEPARATORS, key=header.count)
    return found if header.count(found) else expected


def separator_note(path: str | os.PathLike[str], sep: str | None = None) -> str | None:
    """One line when :func:`table_separator` reads ``path`` with a delimiter other than its type's and ``sep``
    did not ask for it; None otherwise (and for Parquet)."""
    if sep is not None or file_kind(path) == "parquet":
        return None
    used = table_separator(path)
    if used == _default_separator(path):
        return None
    name = _SEP_NAMES.get(used, repr(used))
    return f"{Path(path).name} looks {name}-separated: read with {used!r} (pass --sep, sep= in Python, to choose)"


def _header_line(path: Path, limit: int = 1 << 16) -> str:
    """The first line of a (possibly gzipped) text file, at most ``limit`` bytes of it."""
    import gzip

    opener = gzip.open if path.suffix.lower() == ".gz" else open
    with opener(path, "rb") as f:
        raw = f.readline(limit)
    return raw.decode("utf-8", errors="replace").rstrip("\r\n")
