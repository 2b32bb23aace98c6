"""Central, named argument checks.

Every message names the parameter and the offending value, e.g.
``epsilon must be > 0, got -1``. Type problems raise ``TypeError``; value
problems raise ``ValueError``. Never use bare ``assert`` for these.
"""

from __future__ import annotations

import math
import numbers
import warnings
from typing import SupportsInt, TypeGuard, cast

from featuredp.errors import PrivacyRiskWarning


def _is_real(value: object) -> TypeGuard[numbers.Real]:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_real(name: str, value: object) -> float:
    """Return ``value`` as a float (not NaN; ±inf passes) or raise (TypeError for non-numbers).

    >>> check_real("lr", 3)
    3.0
    >>> check_real("lr", "3")
    Traceback (most recent call last):
    ...
    TypeError: lr must be a real number, got '3' (str)
    """
    if not _is_real(value):
        raise TypeError(f"{name} must be a real number, got {value!r} ({type(value).__name__})")
    v = float(value)
    if math.isnan(v):
        raise ValueError(f"{name} must not be NaN, got {value!r}")
    return v


def check_positive(name: str, value: object, *, allow_inf: bool = False) -> float:
    """A number > 0 (finite unless ``allow_inf``).

    >>> check_positive("epsilon", 2)
    2.0
    >>> check_positive("epsilon", -1)
    Traceback (most recent call last):
    ...
    ValueError: epsilon must be > 0, got -1
    """
    v = check_real(name, value)
    if not v > 0:
        raise ValueError(f"{name} must be > 0, got {value!r}")
    if math.isinf(v) and not allow_inf:
        raise ValueError(f"{name} must be finite, got {value!r}")
    return v


def check_nonnegative(name: str, value: object, *, allow_inf: bool = False) -> float:
    """A number >= 0 (finite unless ``allow_inf``)."""
    v = check_real(name, value)
    if v < 0:
        raise ValueError(f"{name} must be >= 0, got {value!r}")
    if math.isinf(v) and not allow_inf:
        raise ValueError(f"{name} must be finite, got {value!r}")
    return v


def check_open_unit(name: str, value: object) -> float:
    """A number in the open interval (0, 1).

    >>> check_open_unit("delta", 1e-5)
    1e-05
    """
    v = check_real(name, value)
    if not 0 < v < 1:
        raise ValueError(f"{name} must be in (0, 1), got {value!r}")
    return v


def check_sampling_rate(name: str, value: object) -> float:
    """A sampling probability in (0, 1].

    >>> check_sampling_rate("sampling_rate", 1)
    1.0
    """
    v = check_real(name, value)
    if not 0 < v <= 1:
        raise ValueError(f"{name} must be in (0, 1], got {value!r}")
    return v


def check_int(name: str, value: object, *, minimum: int | None = None) -> int:
    """An integer (bools refused; integer-valued floats accepted), optionally >= ``minimum``.

    >>> check_int("steps", 3.0)
    3
    >>> check_int("steps", 0, minimum=1)
    Traceback (most recent call last):
    ...
    ValueError: steps must be >= 1, got 0
    >>> check_int("steps", True)
    Traceback (most recent call last):
    ...
    TypeError: steps must be an integer, got True (bool)
    """
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        v = int(value)
    elif _is_real(value) and float(value).is_integer():
        # The messages below show the converted value, as for an int argument. typeshed's numbers.Real
        # declares no __int__; the real types that get here (float, numpy floats, Fraction) all have one.
        v = value = int(cast(SupportsInt, value))
    else:
        raise TypeError(f"{name} must be an integer, got {value!r} ({type(value).__name__})")
    if minimum is not None and v < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value!r}")
    return v


def check_choice(name: str, value: object, choices: tuple[str, ...] | list[str]) -> str:
    """One of a fixed set of strings.

    >>> check_choice("relation", "add-remove", ("add-remove", "replace-one"))
    'add-remove'
    >>> check_choice("relation", "replace", ("add-remove", "replace-one"))
    Traceback (most recent call last):
    ...
    ValueError: relation must be one of 'add-remove', 'replace-one'; got 'replace'
    """
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, choices))}; got {value!r}")
    return str(value)


def check_delta(delta: object, dataset_size: int | None = None, *, name: str = "delta") -> float:
    """delta in (0, 1); warn with PrivacyRiskWarning when delta >= 1/n and n is known.

    >>> check_delta(1e-6, dataset_size=1000)
    1e-06
    """
    d = check_open_unit(name, delta)
    if dataset_size is not None and d >= 1.0 / dataset_size:
        warnings.warn(
            f"{name}={d:g} is >= 1/n = 1/{dataset_size}: such a guarantee allows releasing "
            f"whole records; use delta well below 1/n (e.g. {1.0 / (10 * dataset_size):.1e})",
            PrivacyRiskWarning,
            stacklevel=3,
        )
    return d


def warn_private_seed(parameter: str, seed: int, *, stacklevel: int = 3) -> None:
    """Warn (``PrivacyRiskWarning``) that a user seed makes a mechanism's private randomness replayable."""
    warnings.warn(
        f"{parameter}={seed} makes the private randomness (noise, private sampling) reproducible: anyone who learns "
        "or guesses the seed can replay the noise and undo the privacy guarantee. Keep it as secret as the data "
        f"(featuredp never writes it out), or leave {parameter}=None for fresh OS entropy",
        PrivacyRiskWarning,
        stacklevel=stacklevel,
    )
