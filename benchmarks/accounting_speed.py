"""Accountant speed: featuredp vs dp-accounting's PLD called directly vs prv-accountant.

Times ε(δ) for T = 1e3, 1e4, 1e5 steps and noise calibration for T = 1e4, 1e5, and
prints medians (wall and CPU seconds) of ``--runs`` repetitions (default 5) with the
values each tool returned. featuredp's caches are cleared before every repetition, so
every run is cold. Usage::

    python benchmarks/accounting_speed.py               # table
    python benchmarks/accounting_speed.py --json        # one JSON object
    python benchmarks/accounting_speed.py --quick       # 1 run, no prv-accountant calibration

The prv-accountant calibration runs once by default (``--prv-calibration-runs``): it is a
bisection of ~8 PRV evaluations and takes minutes per run at T = 1e5 on these machines.

Settings: σ = 1.1, p = 256/60000 (MNIST-like), δ = 1e-5, add/remove; calibration target ε = 8.
dp-accounting: ``PLDAccountant`` at its default interval 1e-4; calibration with its
``calibrate_dp_mechanism`` (bisection). prv-accountant: ``Accountant(eps_error=0.01·ε)``
(its reported upper bound is shown); calibration by bisection on its estimate to 1%
(it has no calibration routine of its own).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import warnings

os.environ.setdefault("OMP_NUM_THREADS", "1")  # steady timings on a shared machine

from tqdm import tqdm

SIGMA, P, DELTA, TARGET = 1.1, 256 / 60000, 1e-5, 8.0


def _clear_caches() -> None:
    from featuredp.accounting import accountant

    accountant._composed_pld.cache_clear()
    accountant._step_pld.cache_clear()


def fdp_epsilon(steps: int) -> float:
    from featuredp.accounting import epsilon_for

    _clear_caches()
    return epsilon_for(SIGMA, P, steps, DELTA)


def fdp_calibrate(steps: int) -> float:
    from featuredp.accounting import calibrate_noise_multiplier

    _clear_caches()
    return calibrate_noise_multiplier(TARGET, DELTA, P, steps)


def _dpa_event(sigma: float, steps: int):
    import dp_accounting

    return dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(P, dp_accounting.GaussianDpEvent(sigma)), steps
    )


def dpa_epsilon(steps: int) -> float:
    import dp_accounting

    acc = dp_accounting.pld.PLDAccountant()
    acc.compose(_dpa_event(SIGMA, steps))
    return acc.get_epsilon(DELTA)


def dpa_calibrate(steps: int) -> float:
    import dp_accounting
    from dp_accounting import mechanism_calibration as mc

    return mc.calibrate_dp_mechanism(
        lambda: dp_accounting.pld.PLDAccountant(),
        lambda s: _dpa_event(s, steps),
        TARGET,
        DELTA,
        mc.ExplicitBracketInterval(0.5, 2.0),  # a generous bracket; a low σ endpoint makes huge PLDs
        tol=1e-3,  # in σ units: ≈ 0.2% in ε, comparable to featuredp's 1% band
    )


def _prv(sigma: float, steps: int, eps_error: float) -> tuple[float, float, float]:
    from prv_accountant import Accountant

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        acc = Accountant(noise_multiplier=sigma, sampling_probability=P, delta=DELTA, max_compositions=steps,
                         eps_error=eps_error)
        return acc.compute_epsilon(steps)


def prv_epsilon(steps: int) -> float:
    guess = max(0.01, fdp_epsilon(steps))  # only to size eps_error; not timed separately (small)
    return _prv(SIGMA, steps, 0.01 * guess)[2]


def prv_calibrate(steps: int) -> float:
    lo, hi = 0.5, 2.0  # the same bracket as dp-accounting gets
    while hi / lo > 1.005:  # bisection on log σ until the bracket is 0.5% wide
        mid = (lo * hi) ** 0.5
        if _prv(mid, steps, 0.05)[1] > TARGET:
            lo = mid
        else:
            hi = mid
    return hi


def _warm_up() -> None:
    """Import everything and touch each code path once, so no cell pays import time."""
    import dp_accounting  # noqa: F401
    import prv_accountant  # noqa: F401

    from featuredp.accounting import epsilon_for

    epsilon_for(SIGMA, P, 10, DELTA)
    dpa_epsilon(10)
    _clear_caches()


def _time(fn, arg, runs: int) -> dict:
    walls, cpus, value = [], [], None
    for _ in range(runs):
        w, c = time.perf_counter(), time.process_time()
        try:
            value = fn(arg)
        except Exception as exc:  # a reference failing is a result, not a crash
            return {"error": f"{type(exc).__name__}: {exc}"}
        walls.append(time.perf_counter() - w)
        cpus.append(time.process_time() - c)
    return {"value": value, "wall_s": statistics.median(walls), "cpu_s": statistics.median(cpus), "runs": runs}


def main(argv: list[str] | None = None) -> int:
    global SIGMA, P  # the benchmark functions read the setting from module level
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="repetitions per cell (median reported)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--quick", action="store_true", help="1 run per cell and no prv-accountant calibration")
    parser.add_argument("--prv-calibration-runs", type=int, default=1,
                        help="runs of the prv-accountant calibration (a bisection of ~8 PRV evaluations, minutes "
                             "each at T=1e5 here; default 1)")
    parser.add_argument("--log", metavar="JSONL", help="also append each result row to this file as it completes")
    parser.add_argument("--noise-multiplier", type=float, default=SIGMA, help=f"σ of the ε rows (default {SIGMA})")
    parser.add_argument("--sampling-rate", type=float, default=P, help=f"p of all rows (default {P:.6f})")
    parser.add_argument("--epsilon-only", action="store_true", help="skip the calibration rows")
    parser.add_argument("--no-prv", action="store_true", help="skip prv-accountant")
    args = parser.parse_args(argv)
    runs = 1 if args.quick else args.runs
    if runs < 1:
        parser.error(f"--runs must be >= 1, got {runs}")
    SIGMA, P = args.noise_multiplier, args.sampling_rate
    if not (SIGMA > 0 and 0 < P <= 1):
        parser.error(f"need --noise-multiplier > 0 and --sampling-rate in (0, 1], got {SIGMA}, {P}")

    jobs = []
    for steps in (1_000, 10_000, 100_000):
        jobs += [("epsilon", steps, "featuredp", fdp_epsilon), ("epsilon", steps, "dp-accounting PLD", dpa_epsilon)]
        if not args.no_prv:
            jobs.append(("epsilon", steps, "prv-accountant", prv_epsilon))
    for steps in () if args.epsilon_only else (10_000, 100_000):
        jobs += [("calibrate", steps, "featuredp", fdp_calibrate),
                 ("calibrate", steps, "dp-accounting PLD", dpa_calibrate)]
        if not (args.quick or args.no_prv):
            jobs.append(("calibrate", steps, "prv-accountant", prv_calibrate))

    _warm_up()
    results = []
    for task, steps, tool, fn in tqdm(jobs, desc="accounting benchmark", file=sys.stderr):
        n = args.prv_calibration_runs if (task, tool) == ("calibrate", "prv-accountant") else runs
        row = {"task": task, "steps": steps, "tool": tool, **_time(fn, steps, n)}
        if task == "calibrate" and "value" in row:  # what the returned σ achieves (featuredp's accountant)
            from featuredp.accounting import epsilon_for

            row["achieved_epsilon"] = epsilon_for(row["value"], P, steps, DELTA)
        results.append(row)
        if args.log:
            with open(args.log, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(row) + "\n")

    if args.json:
        print(json.dumps({"settings": {"noise_multiplier": SIGMA, "sampling_rate": P, "delta": DELTA,
                                       "target_epsilon": TARGET, "runs": runs}, "results": results}, indent=1))
        return 0
    print(f"sigma={SIGMA}, p={P:.5f}, delta={DELTA:g}; calibration target epsilon={TARGET}; medians of n runs")
    print(f"{'task':<10} {'T':>7} {'tool':<18} {'n':>2} {'wall s':>8} {'cpu s':>8}  value")
    for r in results:
        if "error" in r:
            print(f"{r['task']:<10} {r['steps']:>7} {r['tool']:<18} {'-':>2} {'-':>8} {'-':>8}  {r['error'][:60]}")
            continue
        value = f"sigma={r['value']:.5g} (eps {r['achieved_epsilon']:.4f})" if r["task"] == "calibrate" else (
            f"eps={r['value']:.5g}")
        print(f"{r['task']:<10} {r['steps']:>7} {r['tool']:<18} {r['runs']:>2} {r['wall_s']:>8.2f} {r['cpu_s']:>8.2f}  "
              f"{value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
