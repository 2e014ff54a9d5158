#!/usr/bin/env bash
# Issue 36 item 7: examples/qwen-coder-1.5b-h100-sglang.toml end to end on one H100 with SGLang 0.5.23, under
# `watch --advance --until-done` (sessions of their own, so the pipeline outlives each device call), observed
# by benchmarks/gpu_pipeline.py. From the repository root, staged first (../shared/device-sglang/README.md):
#   .sglang-rt:        python3 ../shared/device-sglang/build.py, slices re-cut to 48 MiB (benchmarks/gpu_real.sh)
#   .devslices/qwen:   the joined, checked GGUF (ops.demo.realmodel.assemble) sliced by a copy of
#                      ../shared/device-sglang/slices.py with SLICE = 48 MiB: 22 slices
#   .devwork/qwen:     `python -m ops.regenerate.sources --output .devwork/qwen/prompts` (28 MB; the device has
#                      no prompt packages)
#   .devwork/qwen/prepared (PREPARED, extract): samples of answers regenerated earlier, e.g. the journal kept in
#                      benchmarks/results/h100_2026-12-07_qwen_data/regenerated_journal.tgz, its rows in row order
#                      as conversations, then `python -m ops.prepare --target <qwen bf16 folder> --input
#                      .devwork/qwen_regen/conversations.jsonl --output .devwork/qwen/prepared --max-seq-len 2048`
#                      (2,361 samples, 2,551,125 tokens, 13 MB; 33 s here)
#   .whl:              textual, typer, rich, gguf and what they need beyond the image (pip download ... -d .whl)
# then, each a device call:
#   bash benchmarks/gpu_qwen.sh convert   # carry .devslices/qwen/bin, .whl: the GGUF unpacked and converted to
#                                         # a bf16 folder in a session of its own (image torch, transformers)
#   bash benchmarks/gpu_qwen.sh start     # carry .sglang-rt/bin, .whl, .devwork/qwen: the workspace, the
#                                         # pipeline under watch (LIMIT: regenerate's rows, NUM_PROMPTS:
#                                         # bench's), until START_S
#   bash benchmarks/gpu_qwen.sh data      # instead of start/wait/finish: serve_target -> regenerate -> prepare ->
#                                         # vocab until DATA_S, then regenerate's journal back (gzip parts);
#                                         # data_start, wait..., data_finish: the same over several calls
#   PREPARED=.devwork/qwen/prepared bash benchmarks/gpu_qwen.sh start   # samples prepared earlier (carried):
#                                         # the pipeline without regenerate and prepare
#   bash benchmarks/gpu_qwen.sh extract   # item 6: benchmarks/extract_real.py on the carried samples
#   bash benchmarks/gpu_qwen.sh sweep     # item 3: benchmarks/train_sweep.py on the carried conversations
#                                         # (CONVERSATIONS, SWEEP_ARGS), carry .devwork/qwen_regen
#   bash benchmarks/gpu_qwen.sh cycle     # item 5: the cycle's host time with SGLang's host-side switches, once
#                                         # export and serve_target are up (one server at a time; cycle.tgz)
#   bash benchmarks/gpu_qwen.sh journal   # regenerate's journal so far (gzip parts), the pipeline going on
#   bash benchmarks/gpu_qwen.sh wait      # until the observer saw every stage end, or WAIT_S
#   bash benchmarks/gpu_qwen.sh finish    # servers stopped, summary, captures, the conversations (gzip parts)
# Train and export run on the image's own torch (SGLang's torch 2.14.1 beside the image's cuDNN fails in
# train's backward: session 19), the others in SGLang's runtime.
set -u
PHASE=${1:?convert, start, wait or finish}
OUT=${OUT:-/tmp/qwen-out}
P=/root/qwen
M=/root/models/qwen
T0=$SECONDS
mkdir -p $P/out "$OUT"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
[ -d /tmp/site/textual ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
  --target /tmp/site .whl/*.whl
# The code the pipeline runs: SRC_TGZ (`git archive` of one commit, carried) when given, so that a later call's
# tree cannot change files under running stages; else this call's tree. Copied once per machine.
src_tree() {
  [ -f $P/src/.copied ] && return 0
  mkdir -p $P/src
  if [ -n "${SRC_TGZ:-}" ]; then tar xzf "$SRC_TGZ" -C $P/src
  else tar --exclude=./.sglang-rt --exclude=./.git --exclude=./.devslices -cf - . | tar -xf - -C $P/src; fi
  touch $P/src/.copied
}
# Only archives go to $OUT: a call returns at most 8 files (the observer writes dozens under $P/out).
save() { echo "== phase $PHASE: $((SECONDS - T0)) s"; }
sweep_tgz() { tar czf "$OUT/sweep.tgz" -C /root --exclude='*.safetensors' --exclude='*.pt' sweep sweep.log sweep.rc; }
trap save EXIT

if [ "$PHASE" = convert ]; then
  bash .devslices/qwen/bin/unpack.sh /root/qgguf || exit 1
  src_tree
  cat > $P/convert.py <<'EOF'
import json, os, shutil, sys, time
from pathlib import Path
from ops.demo.realmodel import MODELS, convert_gguf
t = time.time()
dest, tmp = Path(sys.argv[1]), Path(sys.argv[1] + ".building")
shutil.rmtree(tmp, ignore_errors=True); tmp.mkdir(parents=True)
info = convert_gguf(Path("/root/qgguf/model.gguf"), tmp, MODELS["qwen-coder-1.5b"])
(tmp / "conversion.json").write_text(json.dumps({**info, "seconds": round(time.time() - t, 1)}, default=str))
os.rename(tmp, dest)
print("converted in", round(time.time() - t, 1), "s", flush=True)
EOF
  (cd $P/src && PYTHONPATH=$P/src:/tmp/site setsid nohup python3 $P/convert.py $M >/root/convert.log 2>&1 &)
  python3 -c 'import torch, transformers; print("image: torch", torch.__version__, "transformers", transformers.__version__)'
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  df -h /root | tail -1
  echo "convert started"
  exit 0
fi

source .sglang-rt/bin/env.sh || exit 1
src_tree
TREE=$PWD
cd $P/src
export PYTHONPATH=$P/src:$PYTHONPATH:/tmp/site
WS=$P/ws
# Regenerate's folder: the workspace's own, or where JOURNAL= unpacked the journal it resumes.
regenerated() { if [ -d $WS/assets/regenerated ]; then echo $WS/assets/regenerated; else echo $WS/data/regenerated; fi; }
# The journal (what a later JOURNAL= run resumes), not only the conversations made from it, in parts under
# the 16 MiB a file that comes back from $OUT may have.
journal_tgz() {
  local reg; reg=$(regenerated)
  tar czf - -C $(dirname $reg) --exclude=regenerated/conversations.jsonl regenerated | split -b 15M -d -a 1 - \
    "$OUT/regenerated_journal.tgz."
}
# The servers' and stages' whole logs: where a server's start-up goes, not only the tails.
logs_tgz() { tar czf $P/out/logs.tgz -C $WS/.eagle3 logs 2>/dev/null; }

setup() {
  for i in $(seq 1 300); do [ -f $M/config.json ] && break; sleep 1; done
  cat /root/convert.log; [ -f $M/config.json ] || { echo "no converted model"; exit 1; }
  { date -u; nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv
    python3 -c 'import torch, sglang, textual, typer; print("torch", torch.__version__, "sglang", sglang.__version__, "textual", textual.__version__)'
    df -h /root /dev/shm; } 2>&1 | tee $P/out/env.txt
  rm -rf $P/assets && mkdir -p $P/assets && cp -r $TREE/.devwork/qwen/prompts $P/assets/prompts
  [ -n "${PREPARED:-}" ] && cp -r "$TREE/$PREPARED" $P/assets/prepared
  # JOURNAL: a regenerate journal made earlier with the same prompts and settings (e.g.
  # benchmarks/results/h100_2026-12-07_qwen_data/regenerated_journal.tgz): regenerate resumes it and answers
  # only the rows it does not hold, up to LIMIT.
  [ -n "${JOURNAL:-}" ] && { tar xzf "$TREE/$JOURNAL" -C $P/assets && rm -f $P/assets/regenerated/.regenerate.lock; }
  # REGEN_CONC, TARGET_MEM, TARGET_ARGS (a JSON list: serve_target's extra_args), EPOCHS: the example's
  # regenerate concurrency, serve_target's mem_fraction_static and flags, train's epochs, changed for one run.
  # UNTIL=export: the pipeline ends with export (the `cycle` phase then serves and benches the drafter).
  python3 - "$P" "$M" "${LIMIT:-}" "${NUM_PROMPTS:-}" "${1:-all}" "${PREPARED:-}" "${JOURNAL:-}" <<'EOF'
import os, re, sys
from pathlib import Path
p, model, limit, prompts, first = Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5] == "first"
prepared, journal = sys.argv[6], sys.argv[7]
text = Path("examples/qwen-coder-1.5b-h100-sglang.toml").read_text()
env = os.environ.get
if env("REGEN_CONC"):
    text = re.sub(r"concurrency = \d+, max_tokens", f"concurrency = {env('REGEN_CONC')}, max_tokens", text)
if env("TARGET_MEM"):
    text = text.replace('mode = "target", port = 30000, mem_fraction_static = 0.4',
                        f'mode = "target", port = 30000, mem_fraction_static = {env("TARGET_MEM")}')
if env("TARGET_ARGS"):
    text = text.replace('mode = "target", port = 30000,', f"mode = \"target\", extra_args = {env('TARGET_ARGS')}, port = 30000,")
if env("EPOCHS"):
    text = re.sub(r"epochs = \d+", f"epochs = {env('EPOCHS')}", text)
if env("UNTIL") == "export":
    text = text[:text.index("[stages.serve_spec]")]
text = text.replace('path = "models/qwen-coder-1.5b"', f'path = "{model}"')
text = re.sub(r"\[stages\.prompts\]\n(?:(?!\n\[).)*\n", "", text, flags=re.S)   # its output came along
text = text.replace('"prompts", ', "").replace("data/prompts/", "assets/prompts/")
if limit:
    text = re.sub(r"limit = \d+", f"limit = {limit}", text)
if prompts:
    text = re.sub(r"num_prompts = \d+", f"num_prompts = {prompts}", text)
if prepared:
    # Samples prepared earlier (carried): no regenerate, no prepare; vocab and train read them.
    for name in ("regenerate", "prepare"):
        text = re.sub(rf"\[stages\.{name}\]\n(?:(?!\n\[).)*\n", "", text, flags=re.S)
    text = text.replace('depends_on = ["prepare"]\n', "").replace('["prepare", "vocab"]', '["vocab"]')
    text = text.replace("data/prepared", "assets/prepared")
if journal:
    text = text.replace("data/regenerated", "assets/regenerated")
if first:
    # serve_target, regenerate, prepare, vocab: what follows starts at train's comment.
    text = text[:text.index("# Online: each batch")]
(p / "pipeline.toml").write_text(text)
EOF
  python3 benchmarks/gpu_pipeline.py start --ws $WS --out $P/out --pipeline $P/pipeline.toml \
    --assets $P/assets --train-pythonpath "$P/src:/tmp/site"
}

case $PHASE in
start)
  setup
  python3 benchmarks/gpu_pipeline.py wait --out $P/out --seconds $((${START_S:-540} - (SECONDS - T0))) --rescue-set ""
  python3 -m eagle3_console.cli -w $WS status 2>&1 | tail -30
  ;;
data|data_start|data_finish)
  # The data stages alone (serve_target -> regenerate -> prepare -> vocab), then whatever regenerate journaled
  # comes back: a later session resumes it (JOURNAL=, same settings) or trains on it. `data` in one call
  # (until DATA_S); for a regenerate longer than a call, `data_start` (until START_S), `wait` calls, then
  # `data_finish` (stops regenerate: its journal keeps every answered row).
  [ $PHASE != data_finish ] && setup first
  if [ $PHASE = data_start ]; then
    python3 benchmarks/gpu_pipeline.py wait --out $P/out --seconds $((${START_S:-540} - (SECONDS - T0))) --rescue-set ""
    python3 -m eagle3_console.cli -w $WS status 2>&1 | sed -n 1,12p
    exit 0
  fi
  [ $PHASE = data ] && python3 benchmarks/gpu_pipeline.py wait --out $P/out --seconds $((${DATA_S:-540} - (SECONDS - T0))) --rescue-set ""
  # What bounded regenerate, before the server goes: SGLang's own counters and its log.
  curl -s -m 5 http://127.0.0.1:30000/metrics > $P/out/serve_target_metrics.txt
  python3 -m eagle3_console.cli -w $WS logs serve_target -n 400 > $P/out/log_serve_target.txt 2>&1
  for s in regenerate serve_target; do timeout 60 python3 -m eagle3_console.cli -w $WS stop $s; done
  python3 -m eagle3_console.cli -w $WS status 2>&1 | tee $P/out/data-status.txt | tail -30
  python3 -m eagle3_console.cli -w $WS logs regenerate -n 60 > $P/out/log_regenerate.txt 2>&1
  cp $(regenerated)/regenerate.json $WS/data/prepared/summary.json $P/out/ 2>/dev/null
  logs_tgz
  tar czf "$OUT/out.tgz" -C $P out
  journal_tgz
  ls -la "$OUT"
  ;;
extract)
  # Item 6: HF extraction of the real samples against the bare forward over the same batches.
  PYTHONPATH=$P/src:/tmp/site python3 benchmarks/extract_real.py --target $M --prepared $TREE/${PREPARED:-.devwork/qwen/prepared} \
    --max-seq-len 2048 --token-budget ${BUDGET:-16384} ${NUM_SAMPLES:+--num-samples $NUM_SAMPLES} \
    --out /root/extract-real --json $P/out/extract_real.json 2>&1 | tee $P/out/extract_real.log
  tar czf "$OUT/extract_real.tgz" -C $P out/extract_real.json out/extract_real.log
  ;;
sweep)
  # Item 3: online training at a fixed number of steps, lr / data size / MLP width against the base run.
  # SWEEP_BG=1: in a session of its own (beside the pipeline's regenerate), its table and logs come back with
  # `finish` (sweep.tgz).
  for i in $(seq 1 300); do [ -f $M/config.json ] && break; sleep 1; done
  cp "$TREE/${CONVERSATIONS:-.devwork/qwen_regen/conversations.jsonl}" /root/sweep_conversations.jsonl
  cmd="PYTHONPATH=$P/src:/tmp/site python3 benchmarks/train_sweep.py --target $M \
    --conversations /root/sweep_conversations.jsonl --out /root/sweep \
    ${SWEEP_ARGS:---lrs 3e-4,3e-3 --fractions 0.25,0.5 --widths 13440} > /root/sweep.log 2>&1; echo \$? > /root/sweep.rc"
  if [ -n "${SWEEP_BG:-}" ]; then setsid nohup bash -c "$cmd" >/dev/null 2>&1 & echo "sweep started: pid $!"; exit 0; fi
  bash -c "$cmd"; cat /root/sweep.log
  sweep_tgz
  ;;
cycle)
  # Issue 36 item 5, the host time of a verify cycle (RESULTS.md: 1.62 of 4.38 ms): once the pipeline's export
  # and serve_target are up, one speculative server at a time, each benched at concurrency 1 against
  # serve_target. CYCLE: the settings, `fast-3-4` = SGLang 0.5.23's host-side switches (environ.py:1562 the
  # metadata glue graph, :1900 its replay view, :1648 the graph-input fill fast path) at (3,1,4), `plain-7-8`
  # without them at (7,1,8). Decode graphs to batch 8 only (bench's batches): the servers start sooner.
  # Each setting's captures go into cycle.tgz as soon as it is done.
  FAST="SGLANG_ENABLE_METADATA_GLUE_GRAPH=1 SGLANG_OPT_SKIP_GLUED_REPLAY_VIEW=1 SGLANG_OPT_CUDA_GRAPH_FILL_FAST_PATH=1"
  mkdir -p $P/cycle
  for v in ${CYCLE:-fast-3-4 fast-7-8 plain-3-4}; do
    IFS=- read kind steps tokens <<< "$v"; port=$((30010 + tokens)); t1=$SECONDS
    env SGLANG_ENABLE_METRICS_DEVICE_TIMER=1 $([ $kind = fast ] && echo $FAST) setsid python3 -m ops.serve \
      --target $M --mode speculative --drafter $WS/runs/export --num-steps $steps --topk 1 --num-draft-tokens $tokens \
      --port $port --mem-fraction-static 0.2 --context-length 8192 --extra-args '["--cuda-graph-max-bs-decode", "8"]' \
      > $P/cycle/serve-$v.log 2>&1 &
    spid=$!
    until curl -sf -o /dev/null -m 2 http://127.0.0.1:$port/health_generate; do
      kill -0 $spid 2>/dev/null || { echo "$v: the server ended before it was ready"; tail -20 $P/cycle/serve-$v.log; break; }
      [ $((SECONDS - t1)) -gt 300 ] && { echo "$v: not ready in 300 s"; break; }
      sleep 1
    done
    echo "$v: ready after $((SECONDS - t1)) s" | tee -a $P/cycle/ready.txt
    if kill -0 $spid 2>/dev/null; then
      (cd $WS && python3 -m ops.bench --engine sglang --target $M --url http://127.0.0.1:$port \
        --baseline-url http://127.0.0.1:30000 --prompts-file assets/prompts/heldout.jsonl --num-prompts ${NUM_PROMPTS:-32} \
        --max-new-tokens 256 --concurrency 1 --output $P/cycle/bench-$v) 2>&1 | grep -v '^progress' | tee $P/cycle/bench-$v.txt
      curl -s -m 5 http://127.0.0.1:$port/metrics > $P/cycle/metrics-$v.txt
    fi
    kill -- -$spid 2>/dev/null; wait $spid 2>/dev/null
    tar czf "$OUT/cycle.tgz" -C $P cycle
  done
  ;;
journal)
  # What regenerate journaled so far, back while the pipeline goes on (a hold may end before `finish`).
  journal_tgz; ls -la "$OUT"
  ;;
wait)
  python3 benchmarks/gpu_pipeline.py wait --out $P/out --seconds ${WAIT_S:-540} --rescue-set ""
  python3 -m eagle3_console.cli -w $WS status 2>&1 | tail -30
  ;;
finish)
  timeout -k 5 200 python3 benchmarks/gpu_pipeline.py finish --ws $WS --out $P/out
  cp $(regenerated)/regenerate.json $WS/data/prepared/summary.json $WS/runs/export/export_info.json $P/out/ 2>/dev/null
  cp $WS/runs/drafter/metrics.jsonl $P/out/train_metrics.jsonl 2>/dev/null
  find $WS/runs -name 'bench*.json' -exec cp {} $P/out/ \; 2>/dev/null
  for s in regenerate prepare vocab train export bench serve_spec serve_target; do
    python3 -m eagle3_console.cli -w $WS logs $s -n 80 > $P/out/log_$s.txt 2>&1; done
  logs_tgz
  tar czf "$OUT/out.tgz" -C $P out
  [ -d /root/sweep ] && sweep_tgz
  journal_tgz
  ls -la "$OUT"
  ;;
esac
