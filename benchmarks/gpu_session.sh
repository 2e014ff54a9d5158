#!/usr/bin/env bash
# Issue 11's GPU measurements in one call on a fresh nvidia-h200 machine, run
# from the repository root:   bash benchmarks/gpu_session.sh
# Nothing is installed: the machine's python3 (/opt/torch/.venv, see
# /work/.library/device/KINDS.md) already has torch, transformers, safetensors,
# numpy, psutil, nvidia-ml-py, typer and rich; PYTHONPATH puts this checkout
# first (status --json never imports textual, which is not there).
# Each step has its own time limit so that one slow step cannot eat the others'
# (about 1,110 s of limits in all: more than one 600 s device call, so split it with STEPS; the train
# step alone: benchmarks/gpu_train_session.sh); each writes its log and JSON under $OUT.
set -u
OUT=${OUT:-/tmp/gpu-session-out}
WORK=${BENCH_DIR:-/root/eagle3-bench}     # on the machine's disk (64 GiB): the filesystem measured
mkdir -p "$OUT" "$WORK"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
PY=${PY:-python3}

{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv
  $PY -c 'import sys, torch, transformers, typer, safetensors; print(sys.version.split()[0], "torch", torch.__version__, "transformers", transformers.__version__, "typer", typer.__version__, "safetensors", safetensors.__version__)'
  df -hT "$WORK"; nproc; free -g
} >"$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

# STEPS="extract_8b profile_8b ..." runs only those (default: all).
STEPS=${STEPS:-extract_8b profile_8b train_8b status extract_moe profile_moe}
step() {   # step NAME SECONDS COMMAND...
  local name=$1 limit=$2; shift 2
  case " $STEPS " in *" $name "*) ;; *) return 0 ;; esac
  local t0=$SECONDS
  echo "== $name (limit ${limit}s): $*"
  timeout -k 10 "$limit" "$@" >"$OUT/$name.log" 2>&1
  echo "== $name: exit $? after $((SECONDS - t0)) s" | tee -a "$OUT/steps.txt"
  grep -e '^error' -e 'Error' "$OUT/$name.log" | tail -n 3
}

step extract_8b 330 $PY benchmarks/extract_throughput.py --shape 8b --out "$WORK" --durable direct,fsync --compile
rm -rf "$WORK"/extract-throughput-*       # a step killed by its limit leaves its 16 GB target
step profile_8b 180 $PY benchmarks/profile_extract.py --shape 8b --samples 96 --out "$WORK" --durable direct
# ops.train's CUDA defaults (flex, chunked loss, fused AdamW, compile, length buckets): first one
# batch against the old path (gradients included: the CPU tests cannot run FlexAttention's
# backward), then timed; the compiles happen in the check and warm-up and are printed apart.
# The old path and a many-lengths corpus: bash benchmarks/gpu_train_session.sh old mixed
step train_8b 240 $PY benchmarks/train_throughput.py --shape 8b --seq 2048,4096 --out "$WORK" --check-levers
step status 60 $PY benchmarks/status_cost.py --dir "$WORK/status" --log-gb 1 --repeat 5 --gpu-worker \
  --profile "$OUT/profiles"
# The same in a venv of the console's own (benchmarks/status_clean_venv.sh; needs .whl carried).
step status_clean 90 bash benchmarks/status_clean_venv.sh "$WORK"
# The MoE shape last (cheapest to lose): DeepSeek-V2-Lite's layer shapes, 8 of its 27 layers.
step extract_moe 150 $PY benchmarks/extract_throughput.py --shape moe --layers 8 --samples 192 --naive-samples 4 \
  --out "$WORK" --durable direct
step profile_moe 150 $PY benchmarks/profile_extract.py --shape moe --layers 8 --samples 192 --out "$WORK" \
  --durable direct
# The first call in a process profiled (a fresh `python -m ops.extract` ran at half the warm rate).
step profile_moe_cold 150 $PY benchmarks/profile_extract.py --shape moe --layers 8 --samples 192 --out "$WORK" \
  --durable direct --cold
rm -rf "$WORK"
# The figures, one place (the call's output keeps only its last 12,000 characters).
grep -h -e '^device:' -e '^shape ' -e '^matmul' -e '^direct write' -e '^bare forward' -e '^naive extractor' \
  -e '^ops.extract --durable' -e '^compile:' -e "^ops.extract's writers" -e '^durable:' -e '^profiled call' -e '^ops.extract --writers' \
  -e '^extraction loop' -e '^call [0-9]' -e '^python -c' -e 'seen from outside' \
  -e '^train ' -e '^compile ' -e '^levers ' -e '^GPU worker' -e '^nvidia-smi' \
  -e '^python -c pass' -e '^status --json' -e '^status phases' -e '^collect()' -e '^baseline' \
  "$OUT"/extract_8b.log "$OUT"/profile_8b.log "$OUT"/train_8b.log "$OUT"/status.log "$OUT"/status_clean.log "$OUT"/extract_moe.log \
  "$OUT"/profile_moe.log "$OUT"/profile_moe_cold.log \
  2>/dev/null | tee "$OUT/summary.txt"
cat "$OUT/steps.txt"
echo "== done in $SECONDS s; files under $OUT"
