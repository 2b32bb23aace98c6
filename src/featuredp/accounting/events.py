"""Privacy events: how a training run is described to the accountants.

We reuse dp-accounting's frozen ``DpEvent`` classes rather than inventing our own,
so any dp-accounting accountant (and any user code that knows them) can read our
events. A DP-SGD / Algorithm 1 run is a Poisson-subsampled Gaussian self-composed
``steps`` times; public pre-training and the public batch contribute no event.
"""

from __future__ import annotations

from typing import Any, Literal, TypeAlias

import dp_accounting

from featuredp._validate import check_choice, check_int, check_positive, check_sampling_rate

Relation = Literal["add-remove", "replace-one"]
AccountantName = Literal["pld", "rdp"]

RELATIONS: tuple[str, ...] = ("add-remove", "replace-one")
ACCOUNTANTS: tuple[str, ...] = ("pld", "rdp")

# dp-accounting ships no type information, so this alias is Any to mypy; at run time it is the class.
DpEvent: TypeAlias = dp_accounting.DpEvent


def check_relation(relation: object) -> str:
    """Validate a neighbouring relation name."""
    return check_choice("relation", relation, RELATIONS)


def check_accountant(accountant: object) -> str:
    """Validate an accountant backend name."""
    return check_choice("accountant", accountant, ACCOUNTANTS)


def gaussian_event(noise_multiplier: float) -> DpEvent:
    """One release of the Gaussian mechanism with noise std ``noise_multiplier`` × sensitivity."""
    sigma = check_positive("noise_multiplier", noise_multiplier)
    return dp_accounting.GaussianDpEvent(sigma)


def dpsgd_event(noise_multiplier: float, sampling_rate: float, steps: int) -> DpEvent:
    """The event of ``steps`` DP-SGD (or Algorithm 1) steps.

    Each step Poisson-samples records with probability ``sampling_rate``, clips each
    contribution to norm C and adds N(0, (noise_multiplier·C)²). At ``sampling_rate == 1``
    the plain Gaussian event is used (no subsampling): accountants then give the exact
    Gaussian result quickly instead of composing a degenerate mixture numerically.

    >>> event = dpsgd_event(1.0, 0.01, 100)
    >>> type(event).__name__, event.count, type(event.event).__name__, event.event.sampling_probability
    ('SelfComposedDpEvent', 100, 'PoissonSampledDpEvent', 0.01)
    >>> dpsgd_event(2.0, 1.0, 1)
    GaussianDpEvent(noise_multiplier=2.0)
    """
    sigma = check_positive("noise_multiplier", noise_multiplier)
    p = check_sampling_rate("sampling_rate", sampling_rate)
    t = check_int("steps", steps, minimum=1)
    inner: DpEvent = dp_accounting.GaussianDpEvent(sigma)
    if p < 1.0:
        inner = dp_accounting.PoissonSampledDpEvent(p, inner)
    return dp_accounting.SelfComposedDpEvent(inner, t) if t > 1 else inner


def compose_events(*events: DpEvent) -> DpEvent:
    """Compose several events (runs, phases) into one; no events gives the no-op event (ε = 0).

    >>> compose_events()
    NoOpDpEvent()
    >>> type(compose_events(gaussian_event(1.0), dpsgd_event(1.0, 0.01, 10))).__name__
    'ComposedDpEvent'
    """
    for i, event in enumerate(events):
        if not isinstance(event, dp_accounting.DpEvent):
            raise TypeError(f"events[{i}] must be a dp_accounting.DpEvent, got {event!r} ({type(event).__name__})")
    if not events:
        return dp_accounting.NoOpDpEvent()
    if len(events) == 1:
        return events[0]
    return dp_accounting.ComposedDpEvent(list(events))


def event_to_dict(event: DpEvent) -> dict[str, Any]:
    """A JSON-serialisable description of an event (for ledgers and run files).

    >>> event_to_dict(gaussian_event(2.0))
    {'module_name': 'dp_accounting.dp_event', 'class_name': 'GaussianDpEvent', 'noise_multiplier': 2.0}
    >>> event_from_dict(event_to_dict(dpsgd_event(1.0, 0.01, 100))) == dpsgd_event(1.0, 0.01, 100)
    True
    """
    if not isinstance(event, dp_accounting.DpEvent):
        raise TypeError(f"event must be a dp_accounting.DpEvent, got {event!r} ({type(event).__name__})")
    return _to_plain(event.to_named_tuple())


def _to_plain(obj: Any) -> Any:
    # to_named_tuple() nests named tuples and lists; flatten them into plain dicts.
    if hasattr(obj, "_asdict"):
        return {k: _to_plain(v) for k, v in obj._asdict().items()}
    if isinstance(obj, (list, tuple)):
        return [_to_plain(v) for v in obj]
    return obj


def event_from_dict(data: dict[str, Any]) -> DpEvent:
    """Rebuild an event from :func:`event_to_dict` output (the supported event classes only)."""
    if not isinstance(data, dict) or "module_name" not in data or "class_name" not in data:
        raise ValueError(f"event description must be a dict from event_to_dict, got {data!r}")
    name = data["class_name"]
    cls = getattr(dp_accounting, name, None) or getattr(dp_accounting.dp_event, name, None)
    if cls is None or not (isinstance(cls, type) and issubclass(cls, dp_accounting.DpEvent)):
        raise ValueError(f"unknown event class_name {name!r}")
    kwargs = {}
    for key, value in data.items():
        if key in ("module_name", "class_name"):
            continue
        if isinstance(value, dict) and "class_name" in value:
            value = event_from_dict(value)
        elif isinstance(value, list):
            value = [event_from_dict(v) if isinstance(v, dict) and "class_name" in v else v for v in value]
        kwargs[key] = value
    return cls(**kwargs)
