#!/usr/bin/env bash
# Issues 22 and 18 on one H200 with SGLang 0.5.23 staged (../shared/device-sglang/README.md: 33 slices,
# then this), from the repository root, one phase per device call, carry
# [".sglang-rt/bin", ".whl", ".devwork/dws"] (.whl: textual and its wheels, tmux's debs; .devwork/dws: the
# demo workspace built here by `eagle3-console demo .devwork/dws --no-open`, its assets and prepared data):
#   bash benchmarks/gpu_pipeline.sh start    # a cold SGLang extraction under cProfile, then the pipeline
#                                            # (examples/demo-h200-sglang.toml, extract started with
#                                            # mem_fraction_static 0.9999) under watch, in sessions of their own
#   bash benchmarks/gpu_pipeline.sh wait     # watch it until bench's result
#   bash benchmarks/gpu_pipeline.sh finish   # stop serve (REF=1: re-run extract uninterrupted, sha256); checks
#   bash benchmarks/gpu_pipeline.sh checks   # issue 18: the MoE shape in memory and on disk, then the demo,
#                                            # HF and SGLang in one invocation each
# Everything lands in /root/p22/out (copied to $OUT at the end of each call).
set -u
PHASE=${1:?all, start, wait, finish or checks}
OUT=${OUT:-/tmp/p22-out}
P=/root/p22
T0=$SECONDS
mkdir -p $P/out "$OUT"
source .sglang-rt/bin/env.sh || exit 1
# The staged runtime has no .pyc (24 s of every SGLang process's start went to compiling its sources):
# compiled once per machine, in the background, atomically per file (py_compile), beside the first phase.
if [ ! -f /root/sglrt/.pyc ]; then
  (setsid nohup sh -c 'python3 -m compileall -q -j 8 /root/sglrt >/dev/null 2>&1 && touch /root/sglrt/.pyc' \
    >/dev/null 2>&1 &)
fi
[ -d /tmp/site/textual ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
  --target /tmp/site .whl/*.whl
if [ ! -x /tmp/tmuxroot/usr/bin/tmux ]; then mkdir -p /tmp/tmuxroot; for deb in .whl/*.deb; do dpkg -x "$deb" /tmp/tmuxroot; done; fi
export LD_LIBRARY_PATH=/tmp/tmuxroot/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
/tmp/tmuxroot/usr/bin/tmux -V >/dev/null 2>&1 && export TMUX_BIN=/tmp/tmuxroot/usr/bin/tmux
# One copy of the checkout for the whole hold: the runs started in one call outlive it, and each call's
# working tree is a fresh copy.
if [ ! -f $P/src/pyproject.toml ]; then
  mkdir -p $P/src && tar --exclude=./.sglang-rt --exclude=./.git -cf - . | tar -xf - -C $P/src
fi
cd $P/src
export PYTHONPATH=$P/src:$PYTHONPATH:/tmp/site HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# Only a few files come back from a call: the captures travel as one tarball (out.tgz).
save() { echo "== phase $PHASE: $((SECONDS - T0)) s"; }
trap save EXIT
DEMO=.devwork/dws

case $PHASE in
start)
  { date -u; nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv
    python3 -c 'import torch, sglang, textual, typer; print("torch", torch.__version__, "sglang", sglang.__version__, "textual", textual.__version__, "typer", typer.__version__)'
    echo "tmux: ${TMUX_BIN:-none}"; df -h /root /dev/shm; } 2>&1 | tee $P/out/env.txt
  # The first SGLang extraction on a fresh machine, profiled (issue 18: the 25-35 s one-off of the first batch).
  timeout -k 5 170 python3 -m cProfile -o $P/out/cold_sglang.prof -m ops.extract --target $DEMO/assets/target \
    --input $DEMO/data/prepared --output /root/cold --engine sglang --dtype bfloat16 --mem-fraction-static 0.3 \
    --token-budget 4096 --max-seq-len 256 >$P/out/cold_sglang.log 2>&1
  echo "cold extract: exit $? after $((SECONDS - T0)) s"; grep -E "loaded|complete|tok/s" $P/out/cold_sglang.log | tail -4
  python3 - <<'EOF' >$P/out/cold_sglang_profile.txt 2>&1
import pstats
s = pstats.Stats("/root/p22/out/cold_sglang.prof")
s.sort_stats("cumulative").print_stats(45)
s.sort_stats("tottime").print_stats(25)
EOF
  grep -E "function calls|ops/extract/(loop|sglang)|compile|jit|subprocess|build|load_inline|autotun" \
    $P/out/cold_sglang_profile.txt | head -30
  rm -rf /root/cold
  python3 benchmarks/gpu_pipeline.py start --ws $P/ws --out $P/out --pipeline examples/demo-h200-sglang.toml \
    --assets $DEMO/assets --fault 0.9999 --train-pythonpath "$P/src:/tmp/site"
  python3 benchmarks/gpu_pipeline.py wait --out $P/out --seconds $((570 - (SECONDS - T0))) --rescue-set ""
  tar czf "$OUT/out.tgz" -C $P out
  ;;
all)
  # One call: the pipeline with the fault, then finish when bench's result came in time.
  python3 benchmarks/gpu_pipeline.py start --ws $P/ws --out $P/out --pipeline examples/demo-h200-sglang.toml \
    --assets $DEMO/assets --fault 0.9999 --train-pythonpath "$P/src:/tmp/site"
  python3 benchmarks/gpu_pipeline.py wait --out $P/out --seconds $((${ALL_S:-500} - (SECONDS - T0))) --rescue-set ""
  left=$((585 - (SECONDS - T0)))
  [ -f $P/out/observer_done ] && [ $left -gt 60 ] && timeout -k 5 $left python3 benchmarks/gpu_pipeline.py finish \
    --ws $P/ws --out $P/out --reference /root/p22/ref
  tar czf "$OUT/out.tgz" -C $P out
  ;;
wait)
  python3 benchmarks/gpu_pipeline.py wait --out $P/out --seconds ${WAIT_S:-560} --rescue-set ""
  tar czf "$OUT/out.tgz" -C $P out
  ;;
finish)
  timeout -k 5 200 python3 benchmarks/gpu_pipeline.py finish --ws $P/ws --out $P/out \
    $([ "${REF:-0}" = 1 ] && echo --reference /root/p22/ref)
  tar czf "$OUT/out.tgz" -C $P out
  [ -n "${NO_CHECKS:-}" ] && exit 0
  ;&
checks)
  # Issue 18 items 1 and 2 on the engine as it is now: the MoE shape first (in memory, then on disk), then
  # the demo target; each closing `extract: time:` line says what bounded the run.
  left=$((${CHECK_S:-585} - (SECONDS - T0)))
  [ $left -gt 120 ] || { echo "checks: ${left} s left, none run"; exit 0; }
  timeout -k 5 $left python3 benchmarks/sglang_engine_check.py --shape moe --layers 8 --samples ${MOE_SAMPLES:-256} \
    --outs /dev/shm/moe,/root/moe --verify 2 --work /root/moe-target --json $P/out/check_moe.json >$P/out/check_moe.log 2>&1
  echo "check moe: exit $? at $((SECONDS - T0)) s"; grep -vE "^\s*$" $P/out/check_moe.log | tail -n 24
  rm -rf /dev/shm/moe /root/moe /root/moe-target
  left=$((${CHECK_S:-585} - (SECONDS - T0)))
  if [ $left -gt 90 ]; then
    timeout -k 5 $left python3 benchmarks/sglang_engine_check.py --workspace $DEMO --dtype bfloat16 \
      --outs /dev/shm/sgc --verify 4 --json $P/out/check_demo.json >$P/out/check_demo.log 2>&1
    echo "check demo: exit $? at $((SECONDS - T0)) s"; tail -n 14 $P/out/check_demo.log; rm -rf /dev/shm/sgc
  else
    echo "check demo: not run (${left} s left)"
  fi
  tar czf "$OUT/checks.tgz" -C $P out/check_moe.log out/check_moe.json out/check_demo.log out/check_demo.json 2>/dev/null
  ;;
esac
