#!/usr/bin/env bash
# One H200 lease, several stages; every log and JSON lands in $OUT (comes back even on a timeout).
#   bash bench_scripts/h200_session.sh tune    # every config checked, every candidate timed, tuned table
#   bash bench_scripts/h200_session.sh check   # install, smoke bench, correctness at full ranges, examples
#   bash bench_scripts/h200_session.sh save    # whole reference suite --fusion-bench --fusion-save
#   bash bench_scripts/h200_session.sh gate    # re-run against the saved baseline, 5x stability subset
# Needs .whl/ carried: liger_kernel wheel and the minilm-fp16 export (examples/minilm.py).
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
stage=$1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || { echo "install failed"; exit 1; }
python3 -m pip install -q --no-deps .whl/liger_kernel-*.whl >/dev/null 2>&1 || echo "liger wheel not installed"
export FUSION_MINILM_DIR=$PWD/.whl/minilm-fp16
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv >> "$OUT/gpu.txt"
PT="python3 -m pytest -p no:cacheprovider -q -rs -W ignore::RuntimeWarning"
SUBSET='bench- and (seed or (test_gated_swiglu and (llama3-8b-M1- or llama3-8b-M8192)) or (test_linear_gelu_tanh and (gpt2-M1- or gpt2-M8192)))'
case "$stage" in
tune)
  ( time timeout 560 python3 bench_scripts/tune_kernels.py --workers 14 ) 2>&1 | tee "$OUT/tune.log" | tail -90
  ;;
check)
  # Smoke first: does the bench path run on CUDA at all (graph timer, compile, peaks)?
  timeout 150 $PT tests/test_reference_kernels.py --fusion-bench -k "bench- and seed" \
    --fusion-json "$OUT/smoke.json" 2>&1 | tee "$OUT/smoke.log" | tail -40
  # Correctness at the full dim ranges, three dtypes; autotune off (every config is checked by
  # test_kernels_api; re-tuning per drawn shape would cost minutes).
  ( time REFERENCE_KERNELS_AUTOTUNE=0 timeout 260 $PT tests/test_reference_kernels.py tests/test_kernels_api.py \
      -k "not bench-" --fusion-examples 20 ) 2>&1 | tee "$OUT/correctness.log" | tail -15
  ( time timeout 120 $PT examples ) 2>&1 | tee "$OUT/examples.log" | tail -25
  ;;
save)
  ( time timeout 560 $PT tests/test_reference_kernels.py --fusion-bench -k bench- --fusion-save \
      --fusion-json "$OUT/save.json" --fusion-markdown "$OUT/save.md" --fusion-plot "$OUT" ) 2>&1 \
      | tee "$OUT/save.log" | tail -60
  cp baselines/*.json "$OUT/" 2>/dev/null
  ;;
gate)
  ( time timeout 300 $PT tests/test_reference_kernels.py --fusion-bench -k bench- \
      --fusion-json "$OUT/gate.json" --fusion-markdown "$OUT/gate.md" ) 2>&1 | tee "$OUT/gate.log" | tail -30
  for i in 1 2 3 4 5; do
    timeout 50 $PT tests/test_reference_kernels.py --fusion-bench -k "$SUBSET" \
      --fusion-json "$OUT/stab$i.json" > "$OUT/stab$i.log" 2>&1; tail -1 "$OUT/stab$i.log"
  done
  ;;
esac
