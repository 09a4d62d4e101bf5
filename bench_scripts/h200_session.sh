#!/usr/bin/env bash
# One H200 lease, several stages. Logs and JSON go to a work folder that is packed into one
# $OUT/<stage>.tgz at the end (the device tool returns at most 8 files); nvidia-smi's samples go
# straight to $OUT/smi.csv, so that they come back from a call that is cut.
#   bash bench_scripts/h200_session.sh tune    # config tests, every config checked, every candidate timed, tuned table
#   bash bench_scripts/h200_session.sh tunesave # tune, then a fresh baseline from the new table
#   bash bench_scripts/h200_session.sh retune  # tune alone, with the most of a call's 10 minutes
#   RESUME=docs/runs/X/tune-cut.json.gz bash bench_scripts/h200_session.sh resumesave
#       # finish a tune run that was cut (tune_kernels.py --resume), then a fresh baseline; up to
#       # 220 + 340 s, and the archive is packed last: a call cut before then returns smi.csv only
#   CASES='^llama3-70b-M8192$' bash bench_scripts/h200_session.sh rerank
#       # check and time only those cases (tune_kernels.py --cases), the committed table's other
#       # picks kept; then the four Llama-3-70B M = 8192 bench cases (whatever CASES is) with the
#       # new table against the committed baseline
#   bash bench_scripts/h200_session.sh savecheck # a fresh baseline, its Llama-3-70B M = 8192 cases
#       # again, correctness at full ranges
#   bash bench_scripts/h200_session.sh checksave # correctness, then a fresh baseline (short lease)
#   bash bench_scripts/h200_session.sh save    # a fresh baseline of the whole reference suite, then 5x the stability subset
#   bash bench_scripts/h200_session.sh verify  # gate re-run of the whole suite, correctness at full ranges, examples
#   bash bench_scripts/h200_session.sh verifypower # correctness, gate re-run, sustained power probe
#   bash bench_scripts/h200_session.sh final   # correctness and examples again, smaller budget, summaries kept
#   bash bench_scripts/h200_session.sh correct # correctness at full ranges to the end, then examples
#   CORRECT_TIMEOUT=215 bash bench_scripts/h200_session.sh correctonly # correctness only, log into $OUT
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
# clocks, power, temperature and clock event (throttle) reasons every 0.5 s for the whole stage;
# older drivers name the reasons clocks_throttle_reasons
reasons=clocks_event_reasons.active
grep -q "$reasons" <<<"$(nvidia-smi --help-query-gpu)" || reasons=clocks_throttle_reasons.active
SMI=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,$reasons
nvidia-smi --query-gpu=$SMI --format=csv -lms 500 > "$OUT/smi.csv" 2>&1 &
SMI_PID=$!
trap 'kill $SMI_PID 2>/dev/null' EXIT  # a sampler left running would poll the GPU through the next call
PT="python3 -m pytest -p no:cacheprovider -q -rs -W ignore::RuntimeWarning"
SUBSET='bench- and (seed or (test_gated_swiglu and (llama3-8b-M1- or llama3-8b-M8192)) or (test_linear_gelu_tanh and (gpt2-M1- or gpt2-M8192)))'
stab() {  # five back-to-back runs of the 12-case subset against the baseline in baselines/
  for i in 1 2 3 4 5; do
    timeout 45 $PT tests/test_reference_kernels.py --fusion-bench -k "$SUBSET" \
      --fusion-json "$W/stab$i.json" > "$W/stab$i.log" 2>&1; echo "stab$i: $(tail -1 "$W/stab$i.log")"
  done
}
tune() {  # TIMEOUT CHECK_TIMEOUT: every config checked, every candidate timed, table into the package
  ( time timeout "$1" python3 bench_scripts/tune_kernels.py --workers 14 --check-timeout "$2" ) 2>&1 \
      | grep -v "^check " | tee "$W/tune.log" | tail -100
  cp "$OUT"/*.json "$W/" 2>/dev/null; rm -f "$OUT"/*.json
}
bench_suite() {  # TIMEOUT NAME DIR [pytest args]: the whole reference suite in benchmark mode,
  # SIGINT on timeout (pytest still writes its records); NAME.log/.json/.md in DIR
  local t=$1 name=$2 dir=$3; shift 3
  ( time timeout -s INT "$t" $PT tests/test_reference_kernels.py --fusion-bench -k bench- \
      --fusion-json "$dir/$name.json" --fusion-markdown "$dir/$name.md" "$@" ) > "$dir/$name.log" 2>&1
  tail -30 "$dir/$name.log"
}
save() {  # TIMEOUT DIR [pytest args]: bench_suite with --fusion-save; the baseline and reports into DIR
  local t=$1 dir=$2; shift 2
  bench_suite "$t" save "$dir" --fusion-save "$@"
  # baseline-*.json: the tune's table has the same file name (<device>.json) in the work folder
  for f in baselines/*.json; do cp "$f" "$dir/baseline-$(basename "$f")"; done 2>/dev/null
}
correctness() {  # WORKERS TIMEOUT DIR: the kernels' own tests at the full dim ranges, three dtypes,
  # 3 examples per Hypothesis test, xdist workers sharing the GPU, tuning off (a drawn shape
  # outside the table runs its first candidate); SIGINT on timeout keeps pytest's summary. The
  # allocator setting is for these tests only: a benchmark run after them keeps the default.
  ( time PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True REFERENCE_KERNELS_AUTOTUNE=0 timeout -s INT "$2" $PT -n "$1" --tb=line -rf tests/test_reference_kernels.py \
      tests/test_kernels_api.py -k "not bench-" --fusion-examples 3 ) 2>&1 | grep -v PytestBenchmarkWarning \
      > "$3/correctness.log"; tail -25 "$3/correctness.log"
}
gate70b() {  # NAME: the four Llama-3-70B M = 8192 bench cases against baselines/, into NAME.log/.json
  timeout 90 $PT tests/test_reference_kernels.py --fusion-bench -k "bench- and llama3-70b-M8192" \
    --fusion-json "$W/$1.json" > "$W/$1.log" 2>&1; grep -E "x \[|passed|failed" "$W/$1.log" | tail -12
}
examples() {  # TIMEOUT: the examples in benchmark mode
  ( time timeout -s INT "$1" $PT --tb=line -rf examples --fusion-bench --fusion-examples 3 \
      --fusion-json "$W/examples.json" ) 2>&1 | tee "$W/examples.log" | tail -40
}
case "$stage" in
tune) timeout 90 $PT -n 4 -rf tests/test_kernels_api.py -k "split" > "$W/api.log" 2>&1; tail -3 "$W/api.log"
  timeout 60 python3 bench_scripts/probe_peaks.py > "$W/peaks.log" 2>&1; cat "$W/peaks.log"
  tune 420 170 ;;
retune) tune 540 150 ;;
resumesave) gunzip -c "${RESUME:?set RESUME to the tune_kernels.json.gz of the cut run}" > /tmp/tune-cut.json
  ( time timeout 220 python3 bench_scripts/tune_kernels.py --resume /tmp/tune-cut.json --no-compile ) 2>&1 \
      | tee "$W/tune.log" | tail -30
  table=$(ls "$OUT"/nvidia-*.json 2>/dev/null); mv "$OUT"/*.json "$W/" 2>/dev/null
  # no table, no baseline: a save with the old picks would measure nothing new
  [ -n "$table" ] && { rm -f baselines/nvidia-h200.json; save 340 "$W" --fusion-plot "$W"; } ;;
rerank) : "${CASES:?set CASES to a regex of sweep case names}"
  ( time timeout 420 python3 bench_scripts/tune_kernels.py --workers 14 --check-timeout 150 \
      --cases "$CASES" --base-table reference_kernels/tuned/nvidia-h200.json ) \
      2>&1 | grep -v "^check " | tee "$W/tune.log" | tail -40
  table=$(ls "$OUT"/nvidia-*.json 2>/dev/null); mv "$OUT"/*.json "$W/" 2>/dev/null
  # no new table (the run was cut), no gate run: it would time the committed table's picks
  [ -n "$table" ] && gate70b gate70b ;;  # the tuner copied the new table into the package
savecheck) rm -f baselines/nvidia-h200.json; save 330 "$W" --fusion-plot "$W"
  # a save cut by its timeout (SIGINT) writes a partial baseline, against which the missing
  # cases would only be "new"
  grep -q KeyboardInterrupt "$W/save.log" || gate70b gate70b
  correctness 6 200 "$W" ;;
# A fresh baseline: the old one is removed first, on this copy only, so that no case is judged
# against picks it was not measured with.
tunesave) tune 250 150; rm -f baselines/nvidia-h200.json; save 300 "$W" --fusion-plot "$W" ;;
# The last call of a short lease: logs straight into $OUT, so that they come back even if the
# call itself is cut.
checksave) correctness 5 190 "$OUT"; rm -f baselines/nvidia-h200.json; save 370 "$OUT"; cp "$W/gpu.txt" "$OUT/"; exit 0 ;;
# the last minutes of a lease: correctness only, its log straight into $OUT
correctonly) correctness 6 "${CORRECT_TIMEOUT:-215}" "$OUT"; exit 0 ;;
save) rm -f baselines/nvidia-h200.json; save 360 "$W" --fusion-plot "$W"; stab ;;
verify) bench_suite 330 gate "$W"; correctness 6 110 "$W"; examples 110 ;;
# correctness first (the closing note's summary line), then the gate over the whole suite, then
# the sustained-power probe of Llama-3-70B at M = 8192
verifypower) correctness 5 185 "$W"; bench_suite 300 gate "$W"
  timeout 45 python3 bench_scripts/probe_power.py > "$W/power.log" 2>&1; cat "$W/power.log" ;;
final) correctness 3 170 "$W"; examples 150 ;;
correct) correctness 4 330 "$W"; examples 200 ;;
esac
tar czf "$OUT/$stage.tgz" -C "$W" .
