#!/usr/bin/env bash
# Issue 13 on a fresh GPU machine, from the repository root:  bash benchmarks/gpu_fleet.sh
# (carry: .whl). The machine's python3 has torch/transformers/typer 0.27; our pins
# (typer<0.25) and textual come from the wheels in .whl, tmux from its debs,
# unpacked under /tmp (never into /). Results: $OUT (results.json, steps.txt, captures).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site
set -u
OUT=${OUT:-/tmp/gpu-fleet-out}
mkdir -p "$OUT" /tmp/tmuxroot
for deb in .whl/*.deb; do dpkg -x "$deb" /tmp/tmuxroot; done
export LD_LIBRARY_PATH=/tmp/tmuxroot/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false TERM=xterm-256color
if /tmp/tmuxroot/usr/bin/tmux -V; then export TMUX_BIN=/tmp/tmuxroot/usr/bin/tmux
else echo "tmux from the debs does not run: the TUI is captured through Textual's run_test"; fi
{ date -u; nvidia-smi --query-gpu=index,name,memory.used,memory.total --format=csv; python3 -c 'import torch, transformers, typer, textual; print("torch", torch.__version__, "transformers", transformers.__version__, "typer", typer.__version__, "textual", textual.__version__, "gpus", torch.cuda.device_count())'; } 2>&1 | tee "$OUT/env.txt"
# 400 s of the 7 minutes for the steps; the script's own step lines are its summary.
timeout -k 10 400 python3 benchmarks/gpu_fleet.py --out "$OUT" "$@" 2>&1 | tee "$OUT/gpu_fleet.log" | grep -e '^step ' -e '^device' -e '^target' -e '^workspace' -e '^done' -e Traceback -e Error
echo "exit ${PIPESTATUS[0]}; files: $(ls "$OUT")"
