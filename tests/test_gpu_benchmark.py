"""benchmarks/gpu.sh --cpu-smoke runs the GPU benchmark's code at toy sizes, so the script cannot rot."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_benchmark_cpu_smoke_writes_every_model_and_arm(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1"}
    run = subprocess.run([str(ROOT / "benchmarks" / "gpu.sh"), "--cpu-smoke", str(tmp_path)], env=env,
                         capture_output=True, text=True, timeout=300, cwd=ROOT)  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    report = json.loads((tmp_path / "gpu_bench_smoke.json").read_text())
    assert report["mode"] == "cpu-smoke"
    assert [r["model"] for r in report["results"]] == ["cnn", "gpt", "gpt-lora"]
    for r in report["results"]:
        arms = r["arms"]
        for arm in ("nonprivate", "dpsgd-ghost", "dpsgd-vmap", "fdp-ghost"):
            assert arms[arm]["samples_per_s"] > 0 and arms[arm]["peak_bytes"] > 0, (r["model"], arm)
        assert arms["nonprivate"]["ratio_to_nonprivate"] == 1.0
        # Opacus is timed or skipped with a reason, never silently dropped.
        assert ("opacus-ghost" in arms) != ("opacus-ghost" in r["skipped"])
    assert report["results"][2]["lora_rank"] == 8
    assert report["results"][2]["parameters"] > report["results"][1]["parameters"]


def test_gpu_benchmark_refuses_an_unknown_model(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable}
    run = subprocess.run([str(ROOT / "benchmarks" / "gpu.sh"), "--cpu-smoke", "--models=cnn,vit", str(tmp_path)],
                         env=env, capture_output=True, text=True, timeout=120, cwd=ROOT)  # fmt: skip
    assert run.returncode != 0 and "--models: unknown model 'vit'" in run.stderr
