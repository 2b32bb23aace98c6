"""How a grid's private methods reach each ε: ``default`` (each method's epochs and batch size, σ calibrated) or
``paper`` (the paper's §6: σ = 1, sampling rate 1/16, as many steps as ε allows; ``featuredp compare --protocol``).

No torch import.
"""

from __future__ import annotations

from featuredp.accounting import calibrate_steps, epsilon_for
from featuredp.errors import UnreachableTargetError

__all__ = [
    "PAPER_FIXED",
    "PAPER_MAX_EPOCHS",
    "PAPER_NOISE_MULTIPLIER",
    "PAPER_SAMPLING_RATE",
    "PAPER_SENTENCE",
    "PROTOCOLS",
    "paper_steps",
]

#: how the private methods reach each ε (``featuredp compare --protocol``; the CLI's parser keeps a torch-free copy)
PROTOCOLS = ("default", "paper")
#: the paper protocol's noise multiplier σ and sampling rate q (SPEC §4.2: Purchase100)
PAPER_NOISE_MULTIPLIER = 1.0
PAPER_SAMPLING_RATE = 1 / 16
#: the most epochs (steps · q) a paper-protocol cell may train; a larger ε is refused before any work
PAPER_MAX_EPOCHS = 200
#: the Trainer arguments the paper protocol sets for the private methods
PAPER_FIXED = ("noise_multiplier", "sampling_rate", "batch_size", "steps", "epochs", "accountant")
#: summary.md's sentence on a paper-protocol grid
PAPER_SENTENCE = "paper protocol: σ = 1, sampling rate 1/16, ε reached by the number of steps (PLD)"



def paper_steps(epsilon: float, delta: float) -> int:
    """The private steps of a paper-protocol cell: the largest T whose ε(δ) at σ = 1 and sampling rate 1/16 (PLD,
    add/remove) is at most ``epsilon``.

    Raises ValueError (naming the protocol and ε) when even one step spends more than ``epsilon``, or when T
    would be more than :data:`PAPER_MAX_EPOCHS` epochs (T · q).

    >>> paper_steps(4.0, 1e-5)
    81
    """
    try:
        steps = calibrate_steps(epsilon, delta, PAPER_SAMPLING_RATE, PAPER_NOISE_MULTIPLIER, accountant="pld")
    except UnreachableTargetError:
        one = epsilon_for(PAPER_NOISE_MULTIPLIER, PAPER_SAMPLING_RATE, 1, delta, accountant="pld")
        raise ValueError(f"protocol='paper' cannot reach epsilons={epsilon:g}: one step at σ = 1 and sampling rate "
                         f"1/16 already spends ε = {one:.3g} at δ = {delta:g}; give a larger ε or use "
                         "protocol='default'") from None  # fmt: skip
    epochs = steps * PAPER_SAMPLING_RATE
    if epochs > PAPER_MAX_EPOCHS:
        raise ValueError(f"protocol='paper' at epsilons={epsilon:g} needs {steps} steps ({epochs:.0f} epochs at "
                         f"sampling rate 1/16, more than {PAPER_MAX_EPOCHS}); give a smaller ε or use "
                         "protocol='default'")  # fmt: skip
    return steps
