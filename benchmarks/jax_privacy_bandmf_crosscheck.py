"""jax_privacy's own ε for amplified BandMF on a grid of settings: writes tests/fixtures/jax_privacy_bandmf.json.

featuredp accounts a b-banded BandMF run with cyclic Poisson sampling (Choquette-Choo et al. 2023, Theorem 4) as
DP-SGD with rate q = m·b/n, noise multiplier σ / (max column norm of C) and ceil(T/b) steps
(:func:`featuredp.noise.bandmf.bandmf_epsilon`). This script asks jax_privacy the same question three ways, with nothing
from featuredp imported, and records the answers; ``tests/test_bandmf_crosscheck.py`` compares featuredp to them.

Runs in a separate venv only (jax_privacy is not a featuredp dependency)::

    python3 -m venv /tmp/jpvenv
    /tmp/jpvenv/bin/pip install jax_privacy==2.0.0      # pulls jax 0.10.2 (CPU), dp_accounting 0.6.0
    JAX_PLATFORMS=cpu /tmp/jpvenv/bin/python benchmarks/jax_privacy_bandmf_crosscheck.py

(about 25 s on two cores; ``--out PATH`` writes elsewhere, ``--check`` recomputes and only compares to the
fixture.) Tested with Python 3.11.7, jax_privacy 2.0.0, jax/jaxlib 0.10.2, dp_accounting 0.6.0, numpy 2.4.6.

What is asked of jax_privacy, per setting (b bands, T steps, n records, expected batch m, σ = std of z in units
of the clip norm for the *unnormalised* strategy C, δ):

* the strategy: ``matrix_factorization.toeplitz.optimize_banded_toeplitz(n=T, bands=b)`` (RMSE-optimal for the
  prefix workload; jax_privacy returns it with unit L2 norm), rescaled to c_0 = 1 as featuredp writes its strategies,
  so that max column norm ≠ 1 and dividing σ by it matters;
* the column norm: ``toeplitz.sensitivity_squared(c, n=T)`` ** 0.5 (single participation), and
  ``toeplitz.minsep_sensitivity_squared(c, min_sep=b, n=T)`` ** 0.5 (all ceil(T/b) participations, b apart);
* jax_privacy's noise multiplier: σ / column norm. Every jax_privacy BandMF accountant takes "the noise multiplier
  ... assuming the strategy matrix has maximum L2 column norm of one" (``experimental.accounting``), and its
  ``BandMFExecutionPlanConfig`` adds noise of std ``noise_multiplier · clip · ‖c‖₂`` to C x for a non-normalised
  C: so nm = σ/‖c‖ is the like-for-like conversion;
* ``training_pld`` / ``training_rdp``: ``accounting.DpsgdTrainingAccountant`` (its training-loop accountant, "Band-MF
  with Cyclic Poisson sampling", arXiv:2306.08153) with ``PldAccountantConfig()`` (interval 1e-4) and
  ``RdpAccountantConfig()`` (its own RDP orders), ``DpParams(noise_multipliers=nm, num_samples=n, batch_size=m,
  cycle_length=b, delta=δ)``, ``compute_epsilon(num_updates=T)``. It composes ceil(T/b) Poisson-sampled Gaussians at
  q = m / (n // b): the grid keeps n divisible by b, where that is m·b/n (featuredp's sampler samples every
  partition at m·b/n whatever its size, so for n not divisible by b jax_privacy's rate is the larger one);
* ``plan_pld``: the ``dp_event`` of ``experimental.execution_plan.BandMFExecutionPlanConfig(strategy=c,
  iterations=T, noise_multiplier=nm, sampling_prob=m·b/n, accountant=PLDAccountant(ADD_OR_REMOVE_ONE),
  partition_type=INDEPENDENT)`` (the end-to-end BandMF plan; add-or-remove requires its INDEPENDENT partition),
  composed into ``dp_accounting.pld.PLDAccountant(ADD_OR_REMOVE_ONE)`` at its default interval 1e-4. The script
  asserts that event equals ``experimental.accounting.amplified_bandmf_event(nm, T, num_bands=b,
  sampling_prob=m·b/n)``.

All with the add-or-remove relation, as featuredp's default.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
from importlib import metadata
from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)  # the strategy and its norms in float64, as featuredp computes them

import dp_accounting  # noqa: E402
import numpy as np  # noqa: E402
from jax_privacy import accounting as jp_accounting  # noqa: E402
from jax_privacy import batch_selection  # noqa: E402
from jax_privacy.experimental import accounting as jp_events  # noqa: E402
from jax_privacy.experimental import execution_plan  # noqa: E402
from jax_privacy.matrix_factorization import toeplitz  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "tests" / "fixtures" / "jax_privacy_bandmf.json"
COMMAND = "JAX_PLATFORMS=cpu /tmp/jpvenv/bin/python benchmarks/jax_privacy_bandmf_crosscheck.py"

# (name, bands b, steps T, records n, expected batch m, σ, δ): n divisible by b throughout (module docstring); ε from
# about 0.5 to about 10; T not a multiple of b in three settings (the ceil); q = 1 in one (every member of the
# step's partition takes part).
SETTINGS: list[tuple[str, int, int, int, int, float, float]] = [
    ("dpsgd_b1", 1, 1000, 60000, 600, 1.1, 1e-5),
    ("b2_odd_T", 2, 1001, 50000, 250, 2.4, 1e-5),
    ("b4", 4, 2000, 60000, 600, 2.1, 1e-5),
    ("b8_one_epoch", 8, 936, 60000, 512, 1.6, 1e-5),
    ("b16_ceil", 16, 1000, 48000, 256, 1.5, 1e-5),
    ("b32_q_half", 32, 2000, 64000, 1000, 7.0, 1e-5),
    ("b4_q_one", 4, 400, 2000, 500, 35.0, 1e-5),
    ("b8_large_n", 8, 4000, 1_000_000, 1000, 2.5, 1e-6),
]


def strategy(bands: int, steps: int) -> np.ndarray:
    """jax_privacy's RMSE-optimal b-banded Toeplitz strategy for T steps, rescaled to c_0 = 1."""
    if bands == 1:
        return np.ones(1)
    c = np.asarray(toeplitz.optimize_banded_toeplitz(n=steps, bands=bands), dtype=np.float64)
    return c / c[0]


def one_setting(name: str, b: int, T: int, n: int, m: int, sigma: float, delta: float) -> dict[str, object]:
    if n % b:
        raise ValueError(f"n={n} must be divisible by bands={b} (module docstring)")
    coeffs = strategy(b, T)
    col_norm = float(np.sqrt(toeplitz.sensitivity_squared(coeffs, n=T)))
    minsep_sens = float(np.sqrt(toeplitz.minsep_sensitivity_squared(coeffs, min_sep=b, n=T)))
    nm = sigma / col_norm
    q = m * b / n

    params = jp_accounting.DpParams(noise_multipliers=nm, num_samples=n, delta=delta, batch_size=m, cycle_length=b)
    eps: dict[str, float] = {}
    for key, config in (("training_pld", jp_accounting.PldAccountantConfig()),
                        ("training_rdp", jp_accounting.RdpAccountantConfig())):  # fmt: skip
        eps[key] = float(jp_accounting.DpsgdTrainingAccountant(config).compute_epsilon(T, params))

    relation = dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE
    config = execution_plan.BandMFExecutionPlanConfig(
        strategy=coeffs, iterations=T, epsilon=None, delta=None, noise_multiplier=nm, sampling_prob=q,
        accountant=dp_accounting.pld.PLDAccountant(relation),
        partition_type=batch_selection.PartitionType.INDEPENDENT,
    )
    event = config.plan.dp_event
    if event != jp_events.amplified_bandmf_event(nm, T, num_bands=b, sampling_prob=q):
        raise AssertionError(f"{name}: the plan's event is not amplified_bandmf_event: {event}")
    eps["plan_pld"] = float(dp_accounting.pld.PLDAccountant(relation).compose(event).get_epsilon(delta))

    return {
        "name": name, "bands": b, "steps": T, "n": n, "expected_batch": m, "sigma": sigma, "delta": delta,
        "coeffs": coeffs.tolist(),
        "jax_privacy_column_norm": col_norm,
        "jax_privacy_minsep_sensitivity": minsep_sens,
        "jax_privacy_noise_multiplier": nm,
        "sampling_prob": q,
        "rounds": math.ceil(T / b),
        "plan_event": str(event),
        "epsilon": eps,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--check", action="store_true", help="recompute and compare to --out instead of writing it")
    args = parser.parse_args(argv)

    rows = []
    for s in SETTINGS:
        row = one_setting(*s)
        rows.append(row)
        e = row["epsilon"]
        print(f"{row['name']:>14}  b={row['bands']:<3} T={row['steps']:<5} n={row['n']:<8} m={row['expected_batch']:<5}"
              f" σ={row['sigma']:<5} nm={row['jax_privacy_noise_multiplier']:.4f} q={row['sampling_prob']:.5f}"
              f"  ε: pld {e['training_pld']:.4f}  rdp {e['training_rdp']:.4f}  plan {e['plan_pld']:.4f}",
              flush=True)  # fmt: skip
    versions = {pkg: metadata.version(pkg) for pkg in ("jax_privacy", "jax", "jaxlib", "dp_accounting", "numpy")}
    fixture = {
        "what": "jax_privacy's ε for amplified BandMF (cyclic Poisson sampling), add-or-remove; "
                "made by benchmarks/jax_privacy_bandmf_crosscheck.py (its docstring says how each number is asked)",
        "command": COMMAND,
        "install": "python3 -m venv /tmp/jpvenv && /tmp/jpvenv/bin/pip install jax_privacy==2.0.0",
        "python": platform.python_version(),
        "versions": versions,
        "accountants": {
            "training_pld": "jax_privacy.accounting.DpsgdTrainingAccountant(PldAccountantConfig()) "
                            "[dp_accounting PLDAccountant, value_discretization_interval=1e-4]",
            "training_rdp": "jax_privacy.accounting.DpsgdTrainingAccountant(RdpAccountantConfig()) "
                            "[dp_accounting RdpAccountant, jax_privacy's default orders]",
            "plan_pld": "jax_privacy.experimental.execution_plan.BandMFExecutionPlanConfig(...).plan.dp_event "
                        "composed into dp_accounting.pld.PLDAccountant(ADD_OR_REMOVE_ONE) [interval 1e-4]",
        },
        "relation": "add-or-remove",
        "settings": rows,
    }
    if args.check:
        old = json.loads(args.out.read_text())
        worst = max(abs(r["epsilon"][k] - o["epsilon"][k]) / o["epsilon"][k]
                    for r, o in zip(rows, old["settings"], strict=True) for k in r["epsilon"])  # fmt: skip
        print(f"largest relative change against {args.out}: {worst:.2e}")
        return 0 if worst < 1e-9 else 1
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(fixture, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
