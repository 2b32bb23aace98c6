"""jax_privacy's own BLT strategies, sensitivities, errors and ε: writes tests/fixtures/jax_privacy_blt.json.

featuredp's BLT (buffered linear Toeplitz) correlated noise (issue 27) uses a lower-triangular Toeplitz strategy C with
c_0 = 1 and c_j = Σ_i output_scale_i · buf_decay_i^(j-1) for j ≥ 1, its min-separation sensitivity, and the ε of one
Gaussian release (un-amplified DP-FTRL). This script asks jax_privacy those questions on a grid of settings, with
nothing from featuredp imported, and records the answers, together with dense numpy checks of them.

Runs in a separate venv only (jax_privacy is not a featuredp dependency)::

    python3 -m venv /tmp/jpvenv
    /tmp/jpvenv/bin/pip install jax_privacy==2.0.0      # pulls jax 0.10.2 (CPU), dp_accounting 0.6.0
    JAX_PLATFORMS=cpu /tmp/jpvenv/bin/python benchmarks/jax_privacy_blt_crosscheck.py

(about 50 s on two cores, nearly all of it jax_privacy's optimiser; ``--out PATH`` writes elsewhere, ``--check``
recomputes and only compares to the fixture.) Tested with Python 3.11.7, jax_privacy 2.0.0, jax/jaxlib 0.10.2,
dp_accounting 0.6.0, numpy 2.4.6, scipy 1.17.1, optax 0.2.8. jax runs with ``jax_enable_x64`` (jax_privacy's BLT code
requires float64).

What is asked of jax_privacy, per setting (T steps, min separation b, at most k participations, d buffers, σ = std of
z in units of the clip norm for the *unnormalised* C with c_0 = 1, δ); everything is in
``jax_privacy.matrix_factorization``:

* the strategy: ``buffered_toeplitz.optimize_loss(LossFn.build_min_sep(n=T, error='mean', min_sep=b,
  max_participations=k), num_buffers=d)`` (its default ``buf_decay_pair`` parameterisation and L-BFGS settings; this
  is exactly what ``buffered_toeplitz.optimize(n=T, min_sep=b, max_participations=k, error='mean', min_buffers=d,
  max_buffers=d)`` runs, minus its search over the number of buffers). It minimises mean prefix-sum squared error ×
  min-sep sensitivity². Recorded: the BLT's ``buf_decay`` and ``output_scale`` (canonical order, buf_decay
  decreasing) and the returned loss (``loss``, unpenalised: mean(per_query_error) · minsep_sensitivity_squared);
* ``coefs = blt.toeplitz_coefs(T)`` (C's first column), ``inv = blt.inverse()`` (its ``buf_decay`` and
  ``output_scale``: C^{-1} is again a BLT) and ``inv_coefs = inv.toeplitz_coefs(T)`` (C^{-1}'s first column);
* ``toeplitz.minsep_sensitivity_squared(strategy_coef=coefs, min_sep=b, max_participations=k, n=T)`` (with its input
  checks on: it refuses negative or increasing coefficients, for which its b-spaced worst case is not valid) and its
  square root ``sensitivity``; ``toeplitz.sensitivity_squared(coefs)`` (single participation: ‖coefs‖², the max column
  norm² of C) and jax_privacy's closed form of the same for a BLT, ``buffered_toeplitz.sensitivity_squared(blt, n=T)``;
* ``toeplitz.per_query_error(noising_coef=inv_coefs)``: read from the source, it returns the length-T array
  ``cumsum(cumsum(inv_coefs) ** 2)``, whose entry i is the squared L2 norm of row i of B = A C^{-1} with A the T×T
  lower-triangular all-ones (prefix-sum) workload, i.e. the variance of the error in the i-th prefix sum when z has
  unit-variance i.i.d. entries (no sensitivity or σ in it: the error variance of the mechanism is σ² times it). We
  record its mean (``per_query_error_mean``, the 'mean' loss) and max (``per_query_error_max``, = its last entry);
* ε: jax_privacy's noise multiplier is nm = σ / sensitivity (its accountants take the noise "assuming ... maximum L2
  column norm of one", and with multiple participations the min-sep sensitivity plays that role).
  ``accounting.SingleReleaseTrainingAccountant(PldAccountantConfig())`` (interval 1e-4) and
  ``(RdpAccountantConfig())`` (its default orders), both add-or-remove, with ``DpParams(noise_multipliers=nm,
  num_samples=1000, batch_size=100, delta=δ)`` (sample and batch sizes play no part in single-release accounting),
  ``compute_epsilon(num_updates=1, ...)``. Read from the source, ``num_updates`` only places the boundaries of a
  noise-multiplier / batch-size schedule: the accountant composes ONE ``dp_accounting.GaussianDpEvent(nm)`` per
  schedule segment (count 1, not the segment's length), so for a constant nm it is one Gaussian whatever
  ``num_updates`` is; the script asserts that num_updates = T gives the same ε, and that the same numbers come from
  ``dp_accounting.pld.PLDAccountant(ADD_OR_REMOVE_ONE, value_discretization_interval=1e-4)`` and
  ``dp_accounting.rdp.RdpAccountant(jax_privacy's orders, ADD_OR_REMOVE_ONE)`` composed with one
  ``GaussianDpEvent(nm)`` directly. ``epsilon.analytic`` is the exact ε of that Gaussian (Balle and Wang 2018):
  δ(ε) = Φ(Δ/(2s) − εs/Δ) − e^ε Φ(−Δ/(2s) − εs/Δ), Δ = 1, s = nm, solved for ε with ``scipy.optimize.bisect``.

Dense checks, numpy only (``dense``): C materialised from ``coefs`` as a T×T lower-triangular Toeplitz matrix;
``inverse_max_abs_diff`` = max |np.linalg.inv(C) − Toeplitz(inv_coefs)|; ``per_query_error_max_rel_diff`` = max relative
difference between the squared row norms of tril(ones) @ np.linalg.inv(C) and per_query_error; and
``bruteforce_sensitivity`` (T ≤ 24 only, else null): the max, over EVERY participation pattern (set of steps with
consecutive steps ≥ b apart and at most k of them; all 2^T subsets are screened), of ‖sum of the pattern's columns of
C‖₂, with a maximising pattern (``bruteforce_pattern``, 0-indexed steps). That is the exact sensitivity when every
entry of C is ≥ 0 (a neighbour's contribution can then be taken all +clip in one direction), which ``coefs_nonnegative``
records; ``coefs_nonincreasing`` records the other premise of jax_privacy's b-spaced formula.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from importlib import metadata
from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)  # jax_privacy's BLT optimiser and inverse require float64

import dp_accounting  # noqa: E402
import numpy as np  # noqa: E402
from jax_privacy import accounting as jp_accounting  # noqa: E402
from jax_privacy.matrix_factorization import buffered_toeplitz, toeplitz  # noqa: E402
from scipy import optimize as sp_optimize  # noqa: E402
from scipy import stats  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "tests" / "fixtures" / "jax_privacy_blt.json"
COMMAND = "JAX_PLATFORMS=cpu /tmp/jpvenv/bin/python benchmarks/jax_privacy_blt_crosscheck.py"
BRUTEFORCE_MAX_T = 24

# (name, steps T, min_sep b, max participations k, buffers d, σ, δ): k = ceil(T/b) unless the name says k; b = 1
# (every step) and b > T (single participation) both present; T not a multiple of b once (b7); the five T ≤ 24 get the
# brute-force sensitivity; σ, δ chosen so that ε runs from about 0.5 to about 10.
SETTINGS: list[tuple[str, int, int, int, int, float, float]] = [
    ("every_step_T20", 20, 1, 20, 2, 17.0, 1e-5),
    ("every_step_k3_T24", 24, 1, 3, 2, 2.5, 1e-5),
    ("b3_T24", 24, 3, 8, 3, 30.0, 1e-6),
    ("b6_k2_T24", 24, 6, 2, 2, 1.0, 1e-5),
    ("single_T24", 24, 30, 1, 1, 2.0, 1e-6),
    ("b10_T100", 100, 10, 10, 3, 12.0, 1e-5),
    ("b7_T150", 150, 7, 22, 3, 9.0, 1e-6),
    ("b20_k5_T200", 200, 20, 5, 4, 3.0, 1e-5),
    ("b50_T400", 400, 50, 8, 2, 40.0, 1e-7),
    ("single_T400", 400, 500, 1, 4, 1.0, 1e-5),
]


def toeplitz_dense(coefs: np.ndarray) -> np.ndarray:
    """The T×T lower-triangular Toeplitz matrix with first column ``coefs``."""
    T = coefs.shape[0]
    i, j = np.indices((T, T))
    return np.where(i >= j, coefs[np.clip(i - j, 0, T - 1)], 0.0)


def bruteforce_sensitivity(C: np.ndarray, b: int, k: int) -> tuple[float, list[int]]:
    """Max ‖C x‖ over all 0/1 x with at most k ones, any two ≥ b apart (every one of the 2^T subsets screened)."""
    T = C.shape[0]
    shifts = np.arange(T, dtype=np.int64)
    best, best_mask = -1.0, 0
    chunk = 1 << 18
    for start in range(1, 1 << T, chunk):
        masks = np.arange(start, min(start + chunk, 1 << T), dtype=np.int64)
        ok = np.bitwise_count(masks) <= k
        for s in range(1, min(b, T)):
            ok &= (masks & (masks >> s)) == 0
        masks = masks[ok]
        if masks.size == 0:
            continue
        x = ((masks[:, None] >> shifts) & 1).astype(np.float64)
        sums = x @ C.T  # row r: the sum of the pattern's columns of C
        norms2 = np.einsum("ij,ij->i", sums, sums)
        top = int(np.argmax(norms2))
        if norms2[top] > best:
            best, best_mask = float(norms2[top]), int(masks[top])
    return math.sqrt(best), [t for t in range(T) if best_mask >> t & 1]


def analytic_gaussian_epsilon(nm: float, delta: float) -> float:
    """Exact ε of one Gaussian mechanism, sensitivity 1, noise std nm (Balle and Wang 2018, Theorem 8)."""

    def excess(eps: float) -> float:
        a = 1 / (2 * nm) - eps * nm
        c = -1 / (2 * nm) - eps * nm
        return float(stats.norm.cdf(a) - math.exp(eps + stats.norm.logcdf(c))) - delta

    if excess(0.0) <= 0:
        return 0.0
    hi = 1.0
    while excess(hi) > 0:
        hi *= 2
    return float(sp_optimize.bisect(excess, 0.0, hi, xtol=1e-15, maxiter=200))


def epsilons(nm: float, delta: float, T: int) -> dict[str, float]:
    relation = dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE
    params = jp_accounting.DpParams(noise_multipliers=nm, num_samples=1000, batch_size=100, delta=delta)
    rdp_config = jp_accounting.RdpAccountantConfig()
    eps: dict[str, float] = {}
    for key, config in (("pld", jp_accounting.PldAccountantConfig()), ("rdp", rdp_config)):
        accountant = jp_accounting.SingleReleaseTrainingAccountant(config)
        eps[key] = float(accountant.compute_epsilon(1, params))
        at_T = float(accountant.compute_epsilon(T, params))
        if at_T != eps[key]:
            raise AssertionError(f"SingleReleaseTrainingAccountant {key}: num_updates=T gives {at_T}, not {eps[key]}")
    event = dp_accounting.GaussianDpEvent(nm)
    direct = {
        "pld": dp_accounting.pld.PLDAccountant(relation, value_discretization_interval=1e-4).compose(event),
        "rdp": dp_accounting.rdp.RdpAccountant(orders=rdp_config.orders, neighboring_relation=relation).compose(event),
    }
    for key, accountant in direct.items():
        value = float(accountant.get_epsilon(delta))
        if value != eps[key]:
            raise AssertionError(f"{key}: one GaussianDpEvent({nm}) gives {value}, the accountant {eps[key]}")
    eps["analytic"] = analytic_gaussian_epsilon(nm, delta)
    return eps


def one_setting(name: str, T: int, b: int, k: int, d: int, sigma: float, delta: float) -> dict[str, object]:
    loss_fn = buffered_toeplitz.LossFn.build_min_sep(n=T, error="mean", min_sep=b, max_participations=k)
    blt, loss = buffered_toeplitz.optimize_loss(loss_fn, num_buffers=d)
    inv = blt.inverse()
    coefs = np.asarray(blt.toeplitz_coefs(T), dtype=np.float64)
    inv_coefs = np.asarray(inv.toeplitz_coefs(T), dtype=np.float64)

    sens2 = float(toeplitz.minsep_sensitivity_squared(strategy_coef=coefs, min_sep=b, max_participations=k, n=T))
    sens = math.sqrt(sens2)
    per_query = np.asarray(toeplitz.per_query_error(noising_coef=inv_coefs), dtype=np.float64)
    nm = sigma / sens

    C = toeplitz_dense(coefs)
    C_inv = np.linalg.inv(C)
    dense_per_query = np.cumsum(C_inv, axis=0)  # tril(ones) @ C^{-1}, row by row
    dense_per_query = np.einsum("ij,ij->i", dense_per_query, dense_per_query)
    dense: dict[str, object] = {
        "inverse_max_abs_diff": float(np.max(np.abs(C_inv - toeplitz_dense(inv_coefs)))),
        "per_query_error_max_rel_diff": float(np.max(np.abs(dense_per_query - per_query) / per_query)),
        "bruteforce_sensitivity": None,
        "bruteforce_pattern": None,
    }
    if T <= BRUTEFORCE_MAX_T:
        dense["bruteforce_sensitivity"], dense["bruteforce_pattern"] = bruteforce_sensitivity(C, b, k)

    return {
        "name": name, "steps": T, "min_sep": b, "max_participations": k, "buffers": d, "sigma": sigma, "delta": delta,
        "buf_decay": np.asarray(blt.buf_decay).tolist(),
        "output_scale": np.asarray(blt.output_scale).tolist(),
        "optimizer_loss": float(loss),
        "coefs": coefs.tolist(),
        "coefs_nonnegative": bool(np.all(coefs >= 0)),
        "coefs_nonincreasing": bool(np.all(np.diff(coefs) <= 0)),
        "inverse_buf_decay": np.asarray(inv.buf_decay).tolist(),
        "inverse_output_scale": np.asarray(inv.output_scale).tolist(),
        "inverse_coefs": inv_coefs.tolist(),
        "minsep_sensitivity_squared": sens2,
        "sensitivity": sens,
        "single_participation_sensitivity_squared": float(toeplitz.sensitivity_squared(coefs)),
        "blt_closed_form_sensitivity_squared": float(buffered_toeplitz.sensitivity_squared(blt, T)),
        "per_query_error_mean": float(np.mean(per_query)),
        "per_query_error_max": float(np.max(per_query)),
        "noise_multiplier": nm,
        "epsilon": epsilons(nm, delta, T),
        "dense": dense,
    }


def scalars(row: dict[str, object]) -> dict[str, float]:
    """The numbers --check compares: the sensitivities, the errors and the ε's."""
    keys = ("minsep_sensitivity_squared", "single_participation_sensitivity_squared", "per_query_error_mean",
            "per_query_error_max", "noise_multiplier")  # fmt: skip
    out = {key: float(row[key]) for key in keys}
    out.update({f"epsilon.{k}": v for k, v in row["epsilon"].items()})
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--check", action="store_true", help="recompute and compare to --out instead of writing it")
    args = parser.parse_args(argv)

    started = time.perf_counter()
    rows = []
    for s in SETTINGS:
        row = one_setting(*s)
        rows.append(row)
        e, dense = row["epsilon"], row["dense"]
        brute = dense["bruteforce_sensitivity"]
        print(f"{row['name']:>18}  T={row['steps']:<4} b={row['min_sep']:<4} k={row['max_participations']:<3}"
              f" d={row['buffers']}  sens {row['sensitivity']:.6f}"
              f" (brute {'-' if brute is None else f'{brute:.6f}'})  nm {row['noise_multiplier']:.4f}"
              f"  ε: pld {e['pld']:.4f}  rdp {e['rdp']:.4f}  analytic {e['analytic']:.4f}"
              f"  [{time.perf_counter() - started:.0f} s]", flush=True)  # fmt: skip
    versions = {pkg: metadata.version(pkg)
                for pkg in ("jax_privacy", "jax", "jaxlib", "dp_accounting", "numpy", "scipy", "optax")}  # fmt: skip
    fixture = {
        "what": "jax_privacy's optimised BLT strategies, their min-sep sensitivity, prefix-sum error and "
                "single-release ε (un-amplified, add-or-remove); made by benchmarks/jax_privacy_blt_crosscheck.py "
                "(its docstring says how each number is asked)",
        "command": COMMAND,
        "install": "python3 -m venv /tmp/jpvenv && /tmp/jpvenv/bin/pip install jax_privacy==2.0.0",
        "python": platform.python_version(),
        "versions": versions,
        "strategy": "jax_privacy.matrix_factorization.buffered_toeplitz.optimize_loss(LossFn.build_min_sep(n=T, "
                    "error='mean', min_sep=b, max_participations=k), num_buffers=d); C has c_0 = 1, "
                    "c_j = sum_i output_scale_i * buf_decay_i**(j-1)",
        "per_query_error": "toeplitz.per_query_error(noising_coef=inverse_coefs) = cumsum(cumsum(inverse_coefs)**2): "
                           "entry i is the squared norm of row i of tril(ones) @ C^-1 (prefix-sum error variance per "
                           "unit noise variance)",
        "noise_multiplier": "sigma / sqrt(toeplitz.minsep_sensitivity_squared(coefs, min_sep=b, max_participations=k, "
                            "n=T)); sigma in clip-norm units for C with c_0 = 1",
        "accountants": {
            "pld": "jax_privacy.accounting.SingleReleaseTrainingAccountant(PldAccountantConfig()).compute_epsilon(1, "
                   "...) = one dp_accounting GaussianDpEvent(nm) in PLDAccountant(ADD_OR_REMOVE_ONE, "
                   "value_discretization_interval=1e-4)",
            "rdp": "jax_privacy.accounting.SingleReleaseTrainingAccountant(RdpAccountantConfig()).compute_epsilon(1, "
                   "...) = one GaussianDpEvent(nm) in RdpAccountant(jax_privacy's default orders, ADD_OR_REMOVE_ONE)",
            "analytic": "exact Gaussian (Balle and Wang 2018), sensitivity 1, std nm, scipy.optimize.bisect",
        },
        "relation": "add-or-remove",
        "settings": rows,
    }
    print(f"run time {time.perf_counter() - started:.1f} s", file=sys.stderr)
    if args.check:
        old = json.loads(args.out.read_text())
        worst = 0.0
        for r, o in zip(rows, old["settings"], strict=True):
            new_values, old_values = scalars(r), scalars(o)
            worst = max([worst] + [abs(new_values[k] - v) / abs(v) for k, v in old_values.items() if v])
        print(f"largest relative change against {args.out}: {worst:.2e}")
        return 0 if worst < 1e-9 else 1
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(fixture, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
