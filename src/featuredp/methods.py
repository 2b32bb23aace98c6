"""The training methods, one frozen record each: everything that differs between them.

Every list of methods, every label in a table or plot, every style and every
"which loss is clipped" decision reads these records; adding a method is one
record here (and, if its step is new, the step in :mod:`featuredp.engine`).
No torch import: tables, plots and the accountant read this too.

>>> get_method("fdp").label
'FDP (Alg. 1)'
>>> [m.name for m in METHODS.values() if m.private]
['dpsgd', 'fdp_dpsgd', 'fdp']
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = [
    "METHODS",
    "METHOD_NAMES",
    "PRIVATE_METHODS",
    "Method",
    "get_method",
]

ClippedLoss = Literal["loss", "private_loss"]


@dataclass(frozen=True)
class Method:
    """One training method (paper §3–4 and Algorithm 1; docs/engine.md).

    Attributes:
        name: the identifier users type (``--method``).
        label: the name in tables and plots.
        private: whether its steps are a (σ, p, T) privacy event (Poisson batch, clipping, noise).
        needs_feature_map: whether it reads a public feature map Ψ.
        public_batch: whether each main step adds the mean ∇ℓ_pub of an independent public batch.
        clipped_loss: the per-example loss that is clipped and noised (``"loss"`` = ℓ,
            ``"private_loss"`` = ℓ_priv = ℓ − ℓ_pub); None for non-private methods.
        public_steps: whether its main steps read only Ψ(S) (the ``public`` baseline).
        pretrains: whether it may pre-train on ℓ_pub (free: public data only).
        reference: whether its result does not depend on ε (drawn as a horizontal line).
        color, marker, linestyle: its style in plots.
    """

    name: str
    label: str
    private: bool
    needs_feature_map: bool
    public_batch: bool
    clipped_loss: ClippedLoss | None
    public_steps: bool = False
    pretrains: bool = False
    reference: bool = False
    color: str = "black"
    marker: str = "o"
    linestyle: str = "-"

    def __post_init__(self) -> None:
        """Refuse a record whose flags contradict each other (the engine and the plan trust them)."""
        problems = []
        if self.private != (self.clipped_loss is not None):
            problems.append("a method is private exactly when it has a clipped_loss")
        if self.public_steps and (self.private or not self.needs_feature_map):
            problems.append("public_steps (only Ψ(S) is read) means not private and needs_feature_map")
        if (self.public_batch or self.pretrains or self.clipped_loss == "private_loss") and not self.needs_feature_map:
            problems.append("public_batch, pretrains and clipped_loss='private_loss' read Ψ: needs_feature_map")
        if self.public_batch and not self.private:
            problems.append("public_batch is a part of a private step: private")
        if problems:
            raise ValueError(f"inconsistent method record {self.name!r}: " + "; ".join(problems))


METHODS: dict[str, Method] = {
    m.name: m
    for m in (
        Method("nonprivate", "non-private", private=False, needs_feature_map=False, public_batch=False,
               clipped_loss=None, reference=True, color="black", marker="", linestyle="--"),
        Method("public", "public only", private=False, needs_feature_map=True, public_batch=False,
               clipped_loss=None, public_steps=True, reference=True, color="tab:green", marker="", linestyle=":"),
        Method("dpsgd", "DP-SGD", private=True, needs_feature_map=False, public_batch=False,
               clipped_loss="loss", color="tab:red", marker="s"),
        Method("fdp_dpsgd", "FDP (DP-SGD)", private=True, needs_feature_map=True, public_batch=False,
               clipped_loss="loss", pretrains=True, color="tab:orange", marker="^"),
        Method("fdp", "FDP (Alg. 1)", private=True, needs_feature_map=True, public_batch=True,
               clipped_loss="private_loss", pretrains=True, color="tab:blue", marker="o"),
    )
}  # fmt: skip
METHOD_NAMES: tuple[str, ...] = tuple(METHODS)
PRIVATE_METHODS: tuple[str, ...] = tuple(name for name, m in METHODS.items() if m.private)


def get_method(name: str | Method) -> Method:
    """The record of ``name`` (a record is returned as is); a ValueError naming the choices for an unknown one.

    >>> get_method("dpsgd").clipped_loss
    'loss'
    """
    if isinstance(name, Method):
        return name
    if name not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)}, got {name!r}")
    return METHODS[name]
