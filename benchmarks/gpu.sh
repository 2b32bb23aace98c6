#!/usr/bin/env bash
# GPU benchmark (docs/performance.md, "GPU benchmark: how to run it"): a thin wrapper around benchmarks/gpu_bench.py.
#   benchmarks/gpu.sh [--cpu-smoke] [OUT_DIR] [more gpu_bench.py flags]
# Full mode needs CUDA and about 5 minutes on one H100; JSON goes to OUT_DIR, else $OUT, else benchmarks/results.
# Opacus (optional, its arm is skipped with a note without it): pip install --no-deps opacus==1.6.0 opt-einsum
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
args=()
out=""
for a in "$@"; do
  case "$a" in
    --cpu-smoke|--models=*) args+=("$a") ;;
    -*) args+=("$a") ;;
    *) out="$a" ;;
  esac
done
if [[ -n "$out" ]]; then args+=(--out "$out"); fi
export PYTHONPATH="$here/../src${PYTHONPATH:+:$PYTHONPATH}"
exec "${PYTHON:-python}" "$here/gpu_bench.py" "${args[@]}"
