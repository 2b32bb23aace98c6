"""Schema files: how every column of your table is encoded, from public knowledge only.

A schema is a JSON file that records, per column, its type (``numeric``,
``categorical`` or ``drop``), whether it is private, and the public statistic its
encoding needs (``bounds`` of a numeric column, the ``categories`` of a categorical
one), plus the label and its ``classes``. Loading a table with a schema
(``load_dataset("csv", path=..., schema="schema.json")``, ``featuredp train --data FILE
--schema schema.json``) then computes nothing from the data for the columns the schema
covers, so the encoding is the same on every neighbouring dataset::

    {
      "featuredp_schema": 1,
      "label": {"name": "income", "private": false, "classes": ["<=50K", ">50K"]},
      "columns": {
        "age":  {"type": "numeric", "private": false, "bounds": [17, 90]},
        "sex":  {"type": "categorical", "private": true, "categories": ["F", "M"]},
        "id":   {"type": "drop"}
      }
    }

Rules:

* A value that starts with ``"FILL IN"`` is a placeholder: loading stops with an error
  naming the column and the field until you replace it (``featuredp data schema``
  writes placeholders for the private columns, whose values it never reads).
* ``null`` (or a missing key) for ``bounds``/``categories``/``classes`` means "compute it
  from the data": recorded in ``statistics_from_data`` and a ``PrivacyLeakWarning`` if
  the column is private.
* ``"from_data": true`` marks statistics that ``featuredp data schema`` computed from the
  (public) column's values. They are recorded in ``statistics_from_data`` like the
  statistics computed at load time, so making such a column private later still warns.
  Remove the flag when you replace the value by public knowledge (a codebook).
* ``"log1p": true`` on a numeric column applies ``log(1 + x)`` before scaling (``bounds``
  stay on the raw scale).
* ``"missing"`` says what to do with missing values: ``"drop"`` (the rows), ``"impute"`` (a
  numeric column is filled with its ``"fill"`` value, public knowledge; a categorical one gets
  its own category) or ``"category"`` (a categorical column's own category). Per column, or at
  the top level for every column; ``"fill": 0`` alone implies ``"impute"``. Without a ``"fill"``,
  a public column is filled with its median and a private one warns (``PrivacyLeakWarning``).
* ``"note"`` is free text for you (``featuredp data schema`` explains there why it dropped a column).

>>> s = read_schema({"featuredp_schema": 1, "label": {"name": "y", "classes": ["no", "yes"]},
...                  "columns": {"age": {"type": "numeric", "bounds": [0, 120]},
...                              "sex": {"type": "categorical", "private": True, "categories": ["F", "M"]}}})
>>> s.private, s.numeric, s.categorical, s.classes
(['sex'], ['age'], ['sex'], ['no', 'yes'])
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from featuredp.data.tabular import category_string
from featuredp.errors import DataValidationError

SCHEMA_FORMAT = 1
#: every value the user still has to write starts with this
PLACEHOLDER = "FILL IN"
COLUMN_TYPES = ("numeric", "categorical", "drop")
#: what to do with a column's missing values (``missing=``, ``--missing``, ``"missing"`` in a schema)
MISSING_MODES = ("drop", "impute", "category")
_COLUMN_KEYS = {"type", "private", "bounds", "categories", "log1p", "from_data", "note", "missing", "fill"}
_LABEL_KEYS = {"name", "private", "classes", "from_data", "note"}

TYPE_PLACEHOLDER = f"{PLACEHOLDER}: numeric or categorical"
BOUNDS_PLACEHOLDER = f"{PLACEHOLDER}: public [low, high] if numeric, e.g. [0, 100] (or null: from the data, warns)"
CATEGORIES_PLACEHOLDER = (
    f'{PLACEHOLDER}: the public list of values if categorical, e.g. ["F", "M"] (or null: from the data, warns)'
)
CLASSES_PLACEHOLDER = f'{PLACEHOLDER}: the public list of label values, e.g. ["no", "yes"]'


def is_placeholder(value: object) -> bool:
    """Whether ``value`` is a ``"FILL IN ..."`` placeholder."""
    return isinstance(value, str) and value.strip().upper().startswith(PLACEHOLDER)


@dataclass(frozen=True)
class ColumnSchema:
    """One column of a schema; ``pending`` lists the fields that still hold a placeholder."""

    name: str
    type: str | None  # None while the type is a placeholder
    private: bool = False
    bounds: tuple[float, float] | None = None
    categories: tuple[str, ...] | None = None
    log1p: bool = False
    from_data: bool = False
    pending: tuple[str, ...] = ()
    missing: str | None = None
    fill: float | None = None


@dataclass(frozen=True)
class Schema:
    """A parsed schema file (see the module docstring); ``where`` names it in error messages."""

    label: str
    columns: dict[str, ColumnSchema] = field(default_factory=dict)
    classes: list[str] | None = None
    label_private: bool = False
    classes_from_data: bool = False
    label_pending: bool = False
    where: str = "schema"
    missing: str | None = None  # the top-level "missing": every column's unless it says otherwise

    @property
    def private(self) -> list[str]:
        """The columns marked private (the label too when it is)."""
        cols = [c.name for c in self.columns.values() if c.private and c.type != "drop"]
        return [*cols, self.label] if self.label_private else cols

    @property
    def numeric(self) -> list[str]:
        """The columns typed numeric."""
        return [c.name for c in self.columns.values() if c.type == "numeric"]

    @property
    def categorical(self) -> list[str]:
        """The columns typed categorical."""
        return [c.name for c in self.columns.values() if c.type == "categorical"]

    @property
    def drop(self) -> list[str]:
        """The columns left out."""
        return [c.name for c in self.columns.values() if c.type == "drop"]


def _fail(where: str, what: str) -> DataValidationError:
    return DataValidationError(f"{where}: {what}")


def _parse_bounds(where: str, col: str, value: object) -> tuple[float, float] | None:
    if value is None:
        return None
    if (
        isinstance(value, Sequence) and not isinstance(value, str) and len(value) == 2
        and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)
    ):  # fmt: skip
        lo, hi = float(value[0]), float(value[1])
        if lo < hi:
            return lo, hi
    raise _fail(where, f"column {col!r}: bounds must be [low, high] with low < high (or null), got {value!r}")


def _parse_list(where: str, what: str, value: object, *, minimum: int) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise _fail(where, f"{what} must be a list of values (or null), got {value!r}")
    items = [category_string(v) for v in value]
    if len(set(items)) != len(items) or len(items) < minimum:
        raise _fail(where, f"{what} must list at least {minimum} distinct value(s), got {list(value)!r}")
    return tuple(items)


def _parse_column(where: str, col: str, spec: object) -> ColumnSchema:
    if isinstance(spec, str):  # shorthand: "age": "numeric"
        spec = {"type": spec}
    if not isinstance(spec, Mapping):
        raise _fail(where, f"column {col!r} must be an object like {{\"type\": \"numeric\"}}, got {spec!r}")
    unknown = sorted(set(spec) - _COLUMN_KEYS)
    if unknown:
        raise _fail(where, f"column {col!r} has unknown key(s) {unknown}; keys are {sorted(_COLUMN_KEYS)}")
    pending = [k for k in ("type", "bounds", "categories") if is_placeholder(spec.get(k))]
    kind = spec.get("type")
    if "type" in pending:
        kind = None
    elif kind not in COLUMN_TYPES:
        raise _fail(where, f"column {col!r}: type must be one of {list(COLUMN_TYPES)}, got {kind!r}")
    private = spec.get("private", False)
    if not isinstance(private, bool):
        raise _fail(where, f"column {col!r}: private must be true or false, got {private!r}")
    for key in ("log1p", "from_data"):
        if not isinstance(spec.get(key, False), bool):
            raise _fail(where, f"column {col!r}: {key} must be true or false, got {spec.get(key)!r}")
    pending = _pending_for_type(pending, kind)
    bounds = None if is_placeholder(spec.get("bounds")) else _parse_bounds(where, col, spec.get("bounds"))
    cats = (
        None if is_placeholder(spec.get("categories"))
        else _parse_list(where, f"column {col!r}: categories", spec.get("categories"), minimum=1)
    )  # fmt: skip
    if kind == "numeric" and cats is not None:
        raise _fail(where, f"column {col!r} is numeric but lists categories; give bounds, or make it categorical")
    if kind == "categorical" and bounds is not None:
        raise _fail(where, f"column {col!r} is categorical but gives bounds; give categories, or make it numeric")
    missing, fill = _missing_and_fill(where, col, spec, kind)
    return ColumnSchema(
        name=col, type=kind, private=private, bounds=bounds, categories=cats, log1p=bool(spec.get("log1p", False)),
        from_data=bool(spec.get("from_data", False)), pending=tuple(pending), missing=missing, fill=fill,
    )  # fmt: skip


def _pending_for_type(pending: list[str], kind: object) -> list[str]:
    # The field that does not apply to the declared type may keep its placeholder (it is ignored).
    if kind == "numeric" and "categories" in pending:
        pending.remove("categories")
    if kind == "categorical" and "bounds" in pending:
        pending.remove("bounds")
    if kind == "drop":
        pending = []
    return pending


def _missing_and_fill(
    where: str, col: str, spec: Mapping[str, Any], kind: object
) -> tuple[str | None, float | None]:
    missing = _parse_missing(where, f"column {col!r}: missing", spec.get("missing"))
    fill = spec.get("fill")
    if fill is not None:
        if not isinstance(fill, (int, float)) or isinstance(fill, bool) or fill != fill:
            raise _fail(where, f"column {col!r}: fill must be a number (the public value of a missing entry), "
                               f"got {fill!r}")  # fmt: skip
        if kind == "categorical":
            raise _fail(where, f"column {col!r} is categorical but gives fill; use \"missing\": \"category\"")
        if missing not in (None, "impute"):
            raise _fail(where, f"column {col!r}: fill applies to \"missing\": \"impute\", got missing {missing!r}")
        missing = "impute"
    return missing, None if fill is None else float(fill)


def _parse_missing(where: str, what: str, value: object) -> str | None:
    if value is None or value in MISSING_MODES:
        return None if value is None else str(value)
    raise _fail(where, f"{what} must be one of {list(MISSING_MODES)} (or null), got {value!r}")


def read_schema(source: str | os.PathLike[str] | Mapping[str, Any] | Schema) -> Schema:
    """Parse and check a schema (a path to a JSON file, or its dict); errors name the file, column and key."""
    if isinstance(source, Schema):
        return source
    if isinstance(source, Mapping):
        data, where = dict(source), "schema"
    else:
        p = Path(source)
        where = f"schema {str(p)!r}"
        if not p.is_file():
            raise FileNotFoundError(f"{where} does not exist or is not a file")
        try:
            data = json.loads(p.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise _fail(where, f"not valid JSON ({exc})") from None
        if not isinstance(data, dict):
            raise _fail(where, "must be a JSON object with 'label' and 'columns'")
    version = data.get("featuredp_schema")
    if version != SCHEMA_FORMAT:
        raise _fail(where, f"'featuredp_schema' must be {SCHEMA_FORMAT} (the format version), got {version!r}")
    label = data.get("label")
    if isinstance(label, str):
        label = {"name": label}
    if not isinstance(label, Mapping) or not isinstance(label.get("name"), str) or not label["name"]:
        raise _fail(where, f"'label' must be an object with a 'name' (the column to predict), got {label!r}")
    unknown = sorted(set(label) - _LABEL_KEYS)
    if unknown:
        raise _fail(where, f"'label' has unknown key(s) {unknown}; keys are {sorted(_LABEL_KEYS)}")
    label_private = label.get("private", False)
    if not isinstance(label_private, bool):
        raise _fail(where, f"label private must be true or false, got {label_private!r}")
    label_pending = is_placeholder(label.get("classes"))
    classes = None if label_pending else _parse_list(where, "label classes", label.get("classes"), minimum=2)
    columns = data.get("columns")
    if not isinstance(columns, Mapping) or not columns:
        raise _fail(where, "'columns' must be a non-empty object mapping each column to its type")
    if label["name"] in columns:
        raise _fail(where, f"the label {label['name']!r} is also listed under 'columns'")
    parsed = {str(c): _parse_column(where, str(c), spec) for c, spec in columns.items()}
    return Schema(
        label=label["name"], columns=parsed, classes=None if classes is None else list(classes),
        label_private=label_private, classes_from_data=bool(label.get("from_data", False)),
        label_pending=label_pending, where=where, missing=_parse_missing(where, "'missing'", data.get("missing")),
    )  # fmt: skip


def schema_text(schema: Mapping[str, Any]) -> str:
    """A schema dict as JSON text with one line per column (easy to read and edit by hand)."""
    dump = json.dumps
    lines = ["{"]
    for key, value in schema.items():
        if key == "columns":
            cols = [f"    {dump(c)}: {dump(v, ensure_ascii=False)}" for c, v in value.items()]
            lines.append('  "columns": {\n' + ",\n".join(cols) + "\n  },")
        else:
            lines.append(f"  {dump(key)}: {dump(value, ensure_ascii=False)},")
    lines[-1] = lines[-1].rstrip(",")
    return "\n".join(lines) + "\n}\n"
