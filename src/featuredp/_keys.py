"""Objects that hold a secret key or a privacy budget refuse to be copied (pickle, ``copy``, ``deepcopy``).

A copy would replay the same noise, or spend the same budget a second time. Processes that must share one budget
share a :class:`featuredp.accounting.BudgetLedger` instead.
"""

from __future__ import annotations

import contextlib
import os
import sys
from types import FrameType
from typing import Any, ClassVar, NoReturn, SupportsIndex

__all__ = ["Uncopyable"]


class Uncopyable:
    """Mixin: pickling, ``copy.copy`` and ``copy.deepcopy`` raise ``TypeError(cls._not_copied)``.

    A refused ``torch.save(obj, path)`` leaves no file at ``path`` (:func:`_drop_torch_save_target`).
    """

    #: the one-line refusal: what the object holds, why a copy breaks it, and to share a ledger instead
    _not_copied: ClassVar[str] = "this object holds a secret key or a budget and must not be copied"

    def __reduce_ex__(self, protocol: SupportsIndex) -> NoReturn:
        _drop_torch_save_target()
        raise TypeError(self._not_copied)

    def __reduce__(self) -> NoReturn:
        _drop_torch_save_target()
        raise TypeError(self._not_copied)

    def __copy__(self) -> NoReturn:
        raise TypeError(self._not_copied)

    def __deepcopy__(self, memo: dict[int, Any]) -> NoReturn:
        raise TypeError(self._not_copied)


def _drop_torch_save_target() -> None:
    """Remove the file a ``torch.save(obj, path)`` on the stack is writing, before the refusal is raised.

    ``torch.save`` opens (and so creates or truncates) ``path`` before it pickles anything, and on the way out of
    the refusal it still writes the zip archive's end records: without this, a refused save left a broken file of a
    few hundred bytes that looks like a model. On POSIX an open file can be unlinked; torch's writer then finishes
    on an orphaned inode that disappears when it is closed. A file the user already had at ``path`` was truncated
    by torch before the object was reached, so its contents are lost either way; removing the empty remnant at
    least does not leave a file that pretends to hold a model. A file object passed as ``f`` is the caller's and is
    left alone, as is anything on a system that refuses to unlink an open file (the refusal is raised regardless).
    """
    serialization = sys.modules.get("torch.serialization")
    save = getattr(serialization, "save", None)
    code = getattr(save, "__code__", None)
    if code is None:  # torch is not loaded, so no torch.save is running
        return
    frame: FrameType | None = sys._getframe(1)
    while frame is not None and frame.f_code is not code:
        frame = frame.f_back
    if frame is None:
        return
    target = frame.f_locals.get("f")
    if isinstance(target, (str, bytes, os.PathLike)):
        with contextlib.suppress(OSError):
            os.unlink(target)
