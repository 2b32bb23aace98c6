"""Objects that hold a secret key or a privacy budget refuse to be copied (pickle, ``copy``, ``deepcopy``).

A copy would replay the same noise, or spend the same budget a second time. Processes that must share one budget
share a :class:`featuredp.accounting.BudgetLedger` instead.
"""

from __future__ import annotations

from typing import Any, ClassVar, NoReturn, SupportsIndex

__all__ = ["Uncopyable"]


class Uncopyable:
    """Mixin: pickling, ``copy.copy`` and ``copy.deepcopy`` raise ``TypeError(cls._not_copied)``."""

    #: the one-line refusal: what the object holds, why a copy breaks it, and to share a ledger instead
    _not_copied: ClassVar[str] = "this object holds a secret key or a budget and must not be copied"

    def __reduce_ex__(self, protocol: SupportsIndex) -> NoReturn:
        raise TypeError(self._not_copied)

    def __reduce__(self) -> NoReturn:
        raise TypeError(self._not_copied)

    def __copy__(self) -> NoReturn:
        raise TypeError(self._not_copied)

    def __deepcopy__(self, memo: dict[int, Any]) -> NoReturn:
        raise TypeError(self._not_copied)
