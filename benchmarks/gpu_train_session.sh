#!/usr/bin/env bash
# Issue 11's drafter-training measurements on one nvidia-h200, run from the
# repository root:   bash benchmarks/gpu_train_session.sh STEP...   (no STEP: default)
# Within one 600-s device call: `default` alone (330 s of limits), then
# `mixed old` (450 s), then `profile nocompile` (400 s) if wanted.
# - default: ops.train's defaults on CUDA (flex + chunked loss + fused AdamW +
#   torch.compile + 256-token length buckets) at 2,048 and 4,096-token samples,
#   one batch checked against the old path first (loss, accuracies, gradients);
#   prints the compile count and time apart from tok/s and MFU.
# - mixed: samples of many lengths (256..2,048) in 512-token buckets: how many
#   graphs a corpus of many lengths builds (all in the first pass, none in the second).
# - old: --levers old, the explicit mask, full loss, plain AdamW, no compile.
# - nocompile: the default without torch.compile (flex, chunked, fused AdamW, buckets).
# - profile: benchmarks/profile_train.py, the default path's step under torch.profiler
#   (top operators by device time, kernels a step, the device's busy share).
# Each writes its log and JSON under $OUT; same machine set-up as gpu_session.sh.
set -u
OUT=${OUT:-/tmp/gpu-session-out}
WORK=${BENCH_DIR:-/root/eagle3-bench}
mkdir -p "$OUT" "$WORK"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
PY=${PY:-python3}
[ $# -eq 0 ] && set -- default

step() {   # step NAME SECONDS COMMAND...
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  echo "== $name (limit ${limit}s): $*"
  timeout -k 10 "$limit" "$@" >"$OUT/$name.log" 2>&1
  echo "== $name: exit $? after $((SECONDS - t0)) s" | tee -a "$OUT/steps.txt"
  grep -e '^error' -e 'Error' "$OUT/$name.log" | tail -n 3
}

for what in "$@"; do
  case $what in
    default) step train_8b 330 $PY benchmarks/train_throughput.py --shape 8b --seq 2048,4096 --out "$WORK" \
               --check-levers --program 2048 --json "$OUT/train_8b.json" ;;
    mixed)   step train_8b_mixed 300 $PY benchmarks/train_throughput.py --shape 8b --seq 2048 --lengths mixed \
               --length-bucket 512 --steps 6 --out "$WORK" --json "$OUT/train_8b_mixed.json" ;;
    old)     step train_8b_old 150 $PY benchmarks/train_throughput.py --shape 8b --seq 2048,4096 --levers old \
               --out "$WORK" --json "$OUT/train_8b_old.json" ;;
    nocompile) step train_8b_nocompile 200 $PY benchmarks/train_throughput.py --shape 8b --seq 2048,4096 \
               --levers flex,chunked,fused-adamw,bucket --out "$WORK" --json "$OUT/train_8b_nocompile.json" ;;
    profile) step train_8b_profile 200 $PY benchmarks/profile_train.py --shape 8b --seq 2048 ;;
    *) echo "unknown step $what (default, mixed, old, nocompile, profile)"; exit 2 ;;
  esac
  rm -rf "$WORK"/train-throughput-*
done
grep -h -e '^device:' -e '^matmul' -e '^data ' -e '^compile ' -e '^train ' -e '^levers ' -e '^profiled' -e '^shape' -e '^host-device' \
  "$OUT"/train_8b*.log 2>/dev/null | tee "$OUT/train_summary.txt"
echo "== done in $SECONDS s; files under $OUT"
