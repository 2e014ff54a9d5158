#!/usr/bin/env bash
# Issue 36 items 4-5 on a real SGLang 0.5.23 (staged: ../shared/device-sglang/README.md, its slices re-cut
# to 48 MiB as benchmarks/gpu_real.sh says): the demo's tiny target served alone (the baseline) and with its
# EAGLE3 drafter through `python -m ops.serve` (the argv with --cuda-graph-backend-decode full, checked by
# SGLang's parser), both with SGLang's device timer on; then bench engine sglang at concurrency 1,8 and at 1
# (the x8 floor pass): drift, cycle, draft step. Captures to $OUT. Not run yet (no machine came, session of
# issue 36 items 4-5). Prepared here, on CPU, from the repository root:
#   eagle3-console demo .devwork/dws --no-open; cd .devwork/dws; T=assets/target
#   python -m ops.prepare --target $T --input assets/data/conversations.jsonl --output data/prepared --max-seq-len 256
#   python -m ops.vocab --target $T --input data/prepared --output data/vocab --draft-vocab-size 128
#   python -m ops.extract --target $T --input data/prepared --output data/hidden_states --max-seq-len 256 \
#     --token-budget 4096 --device cpu --writers 2
#   python -m ops.train --target $T --data data/hidden_states --vocab data/vocab --output runs/drafter --epochs 12 \
#     --lr 3e-3 --ttt-steps 3 --token-budget 4096 --holdout 24 --workers 0 --device cpu --save-every 100
#   python -m ops.export --target $T --checkpoint runs/drafter --output runs/export --dtype float32 --data data/hidden_states
# then on the device, carry [".sglang-rt/bin", ".devwork/dws"]:  bash benchmarks/gpu_bench_cycle.sh
set -u
T0=$SECONDS
source .sglang-rt/bin/env.sh || exit 1
ROOT=$PWD
export PYTHONPATH=$ROOT:$PYTHONPATH SGLANG_ENABLE_METRICS_DEVICE_TIMER=1
cd .devwork/dws
up() { for i in $(seq 1 ${2:-300}); do curl -sf -o /dev/null "http://127.0.0.1:$1/health_generate" && return 0; sleep 1; done; return 1; }
setsid python3 -m ops.serve --target assets/target --mode target --port 30000 --mem-fraction-static 0.3 \
  >$OUT/serve_target.log 2>&1 &
PID_T=$!
up 30000 400 || { echo "target not up"; tail -30 $OUT/serve_target.log; }
echo "target up after $((SECONDS - T0)) s"
setsid python3 -m ops.serve --target assets/target --mode speculative --drafter runs/export --num-steps 3 --topk 1 \
  --num-draft-tokens 4 --port 30001 --mem-fraction-static 0.3 >$OUT/serve_spec.log 2>&1 &
PID_S=$!
trap 'kill -- -$PID_S -$PID_T 2>/dev/null' EXIT
up 30001 400 || { echo "spec not up"; tail -40 $OUT/serve_spec.log; }
echo "spec up after $((SECONDS - T0)) s"
grep -E "^serve: (exec|argv)" $OUT/serve_spec.log
curl -s -X POST http://127.0.0.1:30001/generate -H 'Content-Type: application/json' \
  -d '{"input_ids": [1, 5, 9, 14, 20, 33], "sampling_params": {"temperature": 0, "max_new_tokens": 24}}' >$OUT/generate_spec.json
python3 -c "import json; m=json.load(open('$OUT/generate_spec.json'))['meta_info']; print({k: m.get(k) for k in ('completion_tokens','spec_verify_ct','e2e_latency','first_token_latency','decode_throughput')})"
curl -s http://127.0.0.1:30001/server_info | python3 -c "import json,sys; d=json.load(sys.stdin); print({k: d.get(k) for k in ('attention_backend','speculative_draft_attention_backend','speculative_attention_mode','disable_overlap_schedule','cuda_graph_config','version')})"
python3 -m ops.bench --engine sglang --url http://127.0.0.1:30001 --baseline-url http://127.0.0.1:30000 \
  --drafter runs/export --num-prompts 24 --max-new-tokens 128 --concurrency 1,8 --output $OUT/b18 --ready-timeout-s 60
echo "bench 1,8 exit $?"
python3 -m ops.bench --engine sglang --url http://127.0.0.1:30001 --baseline-url http://127.0.0.1:30000 \
  --drafter runs/export --num-prompts 24 --max-new-tokens 128 --output $OUT/b1 --ready-timeout-s 60 | tail -3
echo "bench 1 exit $?"
curl -s http://127.0.0.1:30001/metrics | grep -E "forward_execution_seconds|spec_verify_calls" >$OUT/metrics_spec.txt
curl -s http://127.0.0.1:30000/metrics | grep -E "forward_execution_seconds" >$OUT/metrics_target.txt
head -20 $OUT/metrics_spec.txt
python3 - <<'PY'
import json, os
for name in ("b18", "b1"):
    p = os.path.join(os.environ["OUT"], name, "bench.json")
    if not os.path.exists(p):
        print(name, "no bench.json"); continue
    r = json.load(open(p))
    print(name, "cycle", r.get("cycle")); print(name, "drift", {k: v for k, v in (r.get("drift") or {}).items() if k != "first_diff"})
    for x in r.get("table") or []:
        print(name, x["label"], x["concurrency"], {k: x.get(k) for k in ("cycle_s", "step_s", "draft_step_s", "verify_s", "time_source", "differing_from_baseline", "differing_from_concurrency_1")})
PY
tail -5 $OUT/serve_spec.log
echo "total $((SECONDS - T0)) s"
