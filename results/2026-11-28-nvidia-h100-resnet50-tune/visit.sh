#!/bin/bash
# One GPU visit (2026-11-28): the gpu tests of the memory and timing pins, then the whole
# training step of two torchvision models, each tuned, confirmed and timed in four
# configurations. DEV=cpu for the dry run here. Everything lands in $OUT.
set -u
export PYTHONUNBUFFERED=1
DEV=${DEV:-cuda}; PY=${PY:-python3}; W=${W:-/tmp/w}; mkdir -p "$W" "$OUT"
START=$(date +%s)
nvidia-smi > "$W/nvidia-smi.txt" 2>&1
nvidia-smi -q -d CLOCK,PERFORMANCE,POWER >> "$W/nvidia-smi.txt" 2>&1
if [ "$DEV" = cuda ]; then
  timeout -s INT -k 10 ${TT:-70} $PY -m pytest tests/test_cudnn.py tests/test_memory.py \
    tests/test_timing.py -m gpu -v -p no:cacheprovider --durations=10 > "$W/tests.log" 2>&1
  echo "tests rc=$? $(tail -1 "$W/tests.log") at $(( $(date +%s) - START )) s"
fi
step() {  # model, seconds, input, algos
  timeout -s INT -k 20 "$2" $PY -m convbench train-step --device "$DEV" \
    --model "torchvision.models:$1" --input "$3" --algos "$4" --tune-budget ${TB:-0.02} \
    --time-budget ${SB:-3} --configs eager,cudnn.benchmark,channels_last,plan \
    --store "$W/plans" --out "$W/ts-$1" > "$W/ts-$1.log" 2>&1
  echo "$1 rc=$? at $(( $(date +%s) - START )) s"; grep -A8 '^| configuration' "$W/ts-$1.log"
  grep 'measured on the whole' "$W/ts-$1.log"
}
step resnet50 ${T1:-200} ${IN:-64,3,224,224} ${A1:-cudnn,cudnn-autotune,gemm-cublas,winograd-4x4}
step mobilenet_v3_large ${T2:-150} ${IN:-64,3,224,224} ${A2:-cudnn,cudnn-autotune,direct}
tar czf "$OUT/visit.tar.gz" -C "$W" . && cp "$W"/*.log "$W/nvidia-smi.txt" "$OUT"/ 2>/dev/null
echo "done at $(( $(date +%s) - START )) s"
