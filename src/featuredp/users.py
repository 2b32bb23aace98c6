"""The privacy unit when one person wrote many records: which records belong to which user.

With ``user_key=`` a run protects users, not records (docs/users.md). Users are Poisson-sampled at rate q
(the run's private sampler draws user indices), a sampled user contributes at most ``records_per_user`` of its
records (a secret uniform subset when it holds more), and the sum of that user's per-record gradients is
clipped at C as one contribution. The noise and the accounting are then exactly those of record-level DP-SGD
with users in place of records: one user's whole change moves the clipped sum by at most C (2C replacing it).

:class:`UserIndex` is the map from records to users. A user's index is its rank among the sorted distinct
keys, so the sampler's coins belong to users, whatever order the records come in. It never writes the keys
out: they are often names.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from featuredp._validate import check_int
from featuredp.errors import DataValidationError

__all__ = ["UserIndex", "draws_per_epoch", "read_user_field", "user_keys_for", "user_keys_of", "whole_users"]


def read_user_field(path: str | Path, field: str) -> list[Any]:
    """Each record's value of the JSON field ``field`` (``--user-field``), in file order; a record without it (or
    with a list or object there) is a one-line error naming the line."""
    out: list[Any] = []
    with Path(path).open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            row = json.loads(line)
            value = row.get(field) if isinstance(row, dict) else None
            if value is None or isinstance(value, dict | list):
                raise DataValidationError(f"--user-field {field!r}: line {n} of {Path(path).name} has no such field "
                                          "(every record must name its user)")  # fmt: skip
            out.append(str(value))
    return out


def user_keys_of(keys: Any) -> list[Any]:
    """``keys`` (a sequence, numpy array or torch tensor of one key per record) as a list of hashable Python
    values; a one-line error for anything else."""
    if hasattr(keys, "detach") and hasattr(keys, "tolist"):  # a torch tensor, without importing torch
        keys = keys.detach().cpu().tolist()
    elif isinstance(keys, np.ndarray):
        keys = keys.tolist()
    if isinstance(keys, str | bytes) or not isinstance(keys, Sequence):
        raise TypeError(f"user_key must give one user key per record (a sequence, array or tensor), got "
                        f"{type(keys).__name__}")  # fmt: skip
    out = list(keys)
    for i, k in enumerate(out):
        if isinstance(k, list):
            raise DataValidationError(f"user_key: record {i} has a list as its key; give one key per record")
        if k is None or (isinstance(k, float) and k != k):
            raise DataValidationError(f"user_key: record {i} has no user (None or NaN); every record needs one")
    return out


def user_keys_for(user_key: Any, dataset: Any) -> list[Any]:
    """The keys ``user_key`` gives for ``dataset``'s records: itself (one per record), or, for a name, that column
    of a dataset with ``column_names`` (a Hugging Face ``datasets.Dataset``) or attribute ``user_keys``."""
    if isinstance(user_key, str):
        if user_key in (getattr(dataset, "column_names", None) or ()):
            return user_keys_of(dataset[user_key])
        raise ValueError(f"user_key={user_key!r} names no column of the {type(dataset).__name__}; give one key "
                         "per record, or a column name of a dataset that has one")  # fmt: skip
    return user_keys_of(user_key)


def draws_per_epoch(num_users: int, batch_size: int) -> int:
    """⌈users / batch_size⌉: the draws of one epoch when a loader's ``batch_size`` counts users (rate 1/that).

    >>> draws_per_epoch(523, 64)
    9
    """
    return max(1, math.ceil(num_users / batch_size))


class UserIndex:
    """Which records belong to which user, and the batch of records a draw of users makes.

    ``keys``: one key per record (any hashable values: names, ids). ``records_per_user`` (k): the most records a
    sampled user contributes to a step; None takes all of them. k changes compute and utility, never the
    sensitivity (the user's sum is clipped as one).

    >>> index = UserIndex(["bob", "ann", "bob", "cy", "bob"], records_per_user=2)
    >>> index.num_users, index.num_records, index.sizes.tolist()
    (3, 5, [1, 3, 1])
    >>> rec, groups = index.expand(np.array([0, 1]), np.random.default_rng(0))
    >>> rec[:1].tolist(), groups.tolist(), set(rec[1:].tolist()) <= {0, 2, 4}
    ([1], [0, 1, 1], True)
    """

    def __init__(self, keys: Any, *, records_per_user: int | None = None) -> None:
        values = user_keys_of(keys)
        if not values:
            raise DataValidationError("user_key: no records")
        self.records_per_user = None if records_per_user is None else check_int(
            "records_per_user", records_per_user, minimum=1)
        try:
            distinct = sorted(set(values), key=lambda k: (type(k).__name__, k))
        except TypeError as err:
            raise DataValidationError(f"user_key: keys must be hashable and comparable within a type ({err})"
                                      ) from None  # fmt: skip
        code = {k: i for i, k in enumerate(distinct)}
        users = np.fromiter((code[k] for k in values), dtype=np.int64, count=len(values))
        order = np.argsort(users, kind="stable")
        self.num_users = len(distinct)
        self.num_records = len(values)
        #: records per user, in user order
        self.sizes = np.bincount(users, minlength=self.num_users).astype(np.int64)
        self._starts = np.concatenate([[0], np.cumsum(self.sizes)]).astype(np.int64)
        self._records = order.astype(np.int64)  # record indices grouped by user, ascending within a user
        self.user_of = users

    def __repr__(self) -> str:  # counts only: the keys are often names
        return (f"UserIndex(num_users={self.num_users}, num_records={self.num_records}, "
                f"records_per_user={self.records_per_user})")  # fmt: skip

    def records_of(self, user: int) -> np.ndarray:
        """The record indices of ``user``, ascending."""
        return self._records[self._starts[user]:self._starts[user + 1]]

    @property
    def largest(self) -> int:
        """The most records one user holds (a statistic of the data: for the analyst, not for publication)."""
        return int(self.sizes.max())

    def expand(self, users: np.ndarray, generator: Any) -> tuple[np.ndarray, np.ndarray]:
        """The records of a draw of ``users``, grouped by user, and each record's group (0 .. len(users) − 1).

        A user holding more than ``records_per_user`` records gives a uniform subset of that many, chosen with
        ``generator`` (the run's secret private-sampling stream: the choice is as secret as the draw)."""
        users = np.asarray(users, dtype=np.int64)
        k = self.records_per_user
        parts: list[np.ndarray] = []
        for u in users.tolist():
            own = self.records_of(u)
            if k is not None and own.size > k:
                own = np.sort(own[np.argsort(np.asarray(generator.random(own.size)), kind="stable")[:k]])
            parts.append(own)
        if not parts:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        sizes = np.fromiter((p.size for p in parts), dtype=np.int64, count=len(parts))
        return np.concatenate(parts), np.repeat(np.arange(len(parts), dtype=np.int64), sizes)

    def summary(self) -> dict[str, Any]:
        """Counts for the analyst's report: users, records, the largest user and the 99th percentile (no keys)."""
        return {"users": self.num_users, "records": self.num_records, "largest": self.largest,
                "p99": float(np.percentile(self.sizes, 99)), "records_per_user": self.records_per_user}


def whole_users(draw_groups: np.ndarray, rows: np.ndarray, batch: Any, draws: Any
                ) -> tuple[Any, Any, np.ndarray, Any]:  # fmt: skip
    """A loss's rows of a user-level draw, ordered by user: (batch, draws, rows, groups) with each user's rows
    contiguous and the groups numbered 0, 1, ... (torch, for :meth:`VmapGradients.clipped_sum_by_group`).

    ``draw_groups``: the draw's user per row; ``rows``: which of its rows the loss's ``batch`` holds (all, or a
    physical chunk). A chunk that holds only some of a user's records is refused: clipping two parts of one user
    separately would let that user move the sum by more than C."""
    import torch  # the users module stays torch-free at import

    rows = np.asarray(rows, dtype=np.int64)
    mine = draw_groups[rows]
    wanted = np.unique(mine)
    if int(np.isin(draw_groups, wanted).sum()) != rows.size:
        raise RuntimeError("a loss.backward() holds only some of one user's records: at user level every chunk of a "
                           "drawn batch must hold whole users (BatchMemoryManager and gradient accumulation cut at "
                           "users' boundaries; a hand-made chunk must too)")  # fmt: skip
    order = np.argsort(mine, kind="stable")
    groups = np.searchsorted(wanted, mine[order])
    take = torch.from_numpy(order)

    def pick(part: Any) -> Any:
        return {k: v.index_select(0, take.to(v.device)) for k, v in part.items()}

    return pick(batch), pick(draws), rows[order], torch.from_numpy(groups)
