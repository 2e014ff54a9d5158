#!/usr/bin/env bash
# Issue 11's GPU measurements in one call on a fresh nvidia-h200 machine, run
# from the repository root:   bash benchmarks/gpu_session.sh
# Nothing is installed: the machine's python3 (/opt/torch/.venv, see
# /work/.library/device/KINDS.md) already has torch, transformers, safetensors,
# numpy, psutil, nvidia-ml-py, typer and rich; PYTHONPATH puts this checkout
# first (status --json never imports textual, which is not there).
# Each step has its own time limit so that one slow step cannot eat the others'
# (about 8 minutes in all); each writes its log and JSON under $OUT.
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

step() {   # step NAME SECONDS COMMAND...
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  echo "== $name (limit ${limit}s): $*"
  timeout -k 10 "$limit" "$@" >"$OUT/$name.log" 2>&1
  echo "== $name: exit $? after $((SECONDS - t0)) s"
  grep -v -e 'Writing model shards' -e 'it/s]' -e 'UserWarning' "$OUT/$name.log" | tail -n 14
}

step extract_8b 200 $PY benchmarks/extract_throughput.py --shape 8b --out "$WORK" --durable fsync,syncfs
step train_8b 130 $PY benchmarks/train_throughput.py --shape 8b --seq 2048,4096 --out "$WORK" --program
step status 60 $PY benchmarks/status_cost.py --dir "$WORK/status" --log-gb 1 --repeat 5 --gpu-worker \
  --profile "$OUT/profiles"
# The MoE shape last (cheapest to lose): DeepSeek-V2-Lite's layer shapes, 8 of its 27 layers.
step extract_moe 100 $PY benchmarks/extract_throughput.py --shape moe --layers 8 --samples 32 --naive-samples 4 \
  --out "$WORK"
rm -rf "$WORK"
echo "== done in $SECONDS s; files under $OUT"
