#!/usr/bin/env bash
# One H200 lease, several stages. Logs and JSON go to a work folder that is packed into one
# $OUT/<stage>.tgz at the end (the device tool returns at most 8 files), plus <stage>.log.
#   bash bench_scripts/h200_session.sh tune    # every config checked, every candidate timed, tuned table
#   bash bench_scripts/h200_session.sh tunesave # tune, then a fresh baseline from the new table
#   bash bench_scripts/h200_session.sh checksave # correctness, then a fresh baseline (short lease)
#   bash bench_scripts/h200_session.sh save    # whole reference suite --fusion-save, then 5x the stability subset
#   bash bench_scripts/h200_session.sh verify  # gate re-run of the whole suite, correctness at full ranges, examples
#   bash bench_scripts/h200_session.sh final   # correctness and examples again, smaller budget, summaries kept
#   bash bench_scripts/h200_session.sh correct # correctness at full ranges to the end, then examples
# Needs .whl/ carried: liger-kernel, pytest-xdist and execnet wheels and the minilm-fp16 export
# (python3 -m examples.minilm .whl/minilm-fp16).
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
stage=$1
W=/tmp/fusion-$stage; rm -rf "$W"; mkdir -p "$W"
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || { echo "install failed"; exit 1; }
python3 -m pip install -q --no-deps .whl/*.whl >/dev/null 2>&1 || echo "wheels in .whl/ not installed"
export FUSION_MINILM_DIR=$PWD/.whl/minilm-fp16
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv >> "$W/gpu.txt"
PT="python3 -m pytest -p no:cacheprovider -q -rs -W ignore::RuntimeWarning"
SUBSET='bench- and (seed or (test_gated_swiglu and (llama3-8b-M1- or llama3-8b-M8192)) or (test_linear_gelu_tanh and (gpt2-M1- or gpt2-M8192)))'
stab() {  # five back-to-back runs of the 12-case subset against the baseline in baselines/
  for i in 1 2 3 4 5; do
    timeout 45 $PT tests/test_reference_kernels.py --fusion-bench -k "$SUBSET" \
      --fusion-json "$W/stab$i.json" > "$W/stab$i.log" 2>&1; echo "stab$i: $(tail -1 "$W/stab$i.log")"
  done
}
case "$stage" in
tune)
  ( time timeout 560 python3 bench_scripts/tune_kernels.py --workers 14 --check-timeout 200 ) 2>&1 \
      | tee "$W/tune.log" | tail -100
  cp "$OUT"/*.json "$W/" 2>/dev/null
  ;;
checksave)
  # The last call of a short lease: correctness at full ranges, then a fresh baseline, each under
  # SIGINT timeouts (pytest still writes its summary and records), logs straight into $OUT so
  # that they come back even if the call itself is cut.
  export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
  ( time REFERENCE_KERNELS_AUTOTUNE=0 timeout -s INT 225 $PT -n 5 --tb=line -rf tests/test_reference_kernels.py \
      tests/test_kernels_api.py -k "not bench-" --fusion-examples 3 ) 2>&1 | grep -v PytestBenchmarkWarning \
      > "$OUT/correctness.log"; tail -25 "$OUT/correctness.log"
  rm -f baselines/nvidia-h200.json
  ( time timeout -s INT 330 $PT tests/test_reference_kernels.py --fusion-bench -k bench- --fusion-save \
      --fusion-json "$OUT/save.json" --fusion-markdown "$OUT/save.md" ) > "$OUT/save.log" 2>&1; tail -12 "$OUT/save.log"
  cp baselines/*.json "$OUT/" 2>/dev/null; cp "$W/gpu.txt" "$OUT/"
  exit 0
  ;;
tunesave)
  # tune, then save a fresh baseline with the table just written (the tune copies it into the
  # package); the old baseline is removed first, on this copy only, so that no case is judged
  # against picks it was not measured with. Stability runs belong to the next call.
  ( time timeout 250 python3 bench_scripts/tune_kernels.py --workers 14 --check-timeout 150 ) 2>&1 \
      | grep -v "^check " | tee "$W/tune.log" | tail -75
  cp "$OUT"/*.json "$W/" 2>/dev/null; rm -f "$OUT"/*.json
  rm -f baselines/nvidia-h200.json
  ( time timeout 300 $PT tests/test_reference_kernels.py --fusion-bench -k bench- --fusion-save \
      --fusion-json "$W/save.json" --fusion-markdown "$W/save.md" --fusion-plot "$W" ) 2>&1 \
      | tee "$W/save.log" | tail -25
  cp baselines/*.json "$W/"
  ;;
save)
  ( time timeout 360 $PT tests/test_reference_kernels.py --fusion-bench -k bench- --fusion-save \
      --fusion-json "$W/save.json" --fusion-markdown "$W/save.md" --fusion-plot "$W" ) 2>&1 \
      | tee "$W/save.log" | tail -40
  cp baselines/*.json "$W/"
  stab
  ;;
verify)
  ( time timeout 330 $PT tests/test_reference_kernels.py --fusion-bench -k bench- \
      --fusion-json "$W/gate.json" --fusion-markdown "$W/gate.md" ) 2>&1 | tee "$W/gate.log" | tail -25
  # Correctness at the full dim ranges, three dtypes, 6 xdist workers sharing the GPU (Triton
  # compiles dominate). Tuning off: a drawn shape outside the tuned table runs its first candidate.
  ( time REFERENCE_KERNELS_AUTOTUNE=0 timeout 110 $PT -n 6 tests/test_reference_kernels.py tests/test_kernels_api.py \
      -k "not bench-" --fusion-examples 5 ) 2>&1 | tee "$W/correctness.log" | tail -15
  ( time timeout 110 $PT examples --fusion-bench --fusion-json "$W/examples.json" ) 2>&1 \
      | tee "$W/examples.log" | tail -30
  ;;
final)
  # The same two runs as verify's last two, at 3 examples, 3 workers (6 shared one GPU's memory
  # badly), SIGINT on timeout so that pytest still prints its summary of what finished.
  export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
  ( time REFERENCE_KERNELS_AUTOTUNE=0 timeout -s INT 170 $PT -n 3 --tb=line -rf tests/test_reference_kernels.py \
      tests/test_kernels_api.py -k "not bench-" --fusion-examples 3 ) 2>&1 | grep -v PytestBenchmarkWarning \
      | tee "$W/correctness.log" | tail -40
  ( time timeout -s INT 150 $PT --tb=line -rf examples --fusion-bench --fusion-examples 3 \
      --fusion-json "$W/examples.json" ) 2>&1 | tee "$W/examples.log" | tail -40
  ;;
correct)
  # Issue 3's GPU run: the kernels' own tests at the full dim ranges, three dtypes, 3 examples per
  # Hypothesis test, 4 xdist workers sharing the GPU, tuning off (a drawn shape outside the
  # table runs its first candidate); SIGINT on timeout keeps pytest's summary.
  export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
  ( time REFERENCE_KERNELS_AUTOTUNE=0 timeout -s INT 330 $PT -n 4 --tb=line -rf tests/test_reference_kernels.py \
      tests/test_kernels_api.py -k "not bench-" --fusion-examples 3 ) 2>&1 | grep -v PytestBenchmarkWarning \
      | tee "$W/correctness.log" | tail -40
  ( time timeout -s INT 200 $PT --tb=line -rf examples --fusion-bench --fusion-examples 3 \
      --fusion-json "$W/examples.json" ) 2>&1 | tee "$W/examples.log" | tail -40
  ;;
esac
tar czf "$OUT/$stage.tgz" -C "$W" .
