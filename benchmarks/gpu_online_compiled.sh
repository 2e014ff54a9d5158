set -u
M=/root/models/smollm2; D=.devwork/online; W=/root/online
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
COMMON=(--vocab $D/vocab --target $M --epochs 2 --lr 1e-3 --ttt-steps 3 --token-budget 16384 --max-len 1024 --holdout 200 --seed 0 --device cuda --save-every 100000 --log-every 20 --workers 4)
rm -rf $W/online_c
t0=$SECONDS; python3 -m ops.train "${COMMON[@]}" --mode online --samples $D/prepared --target-compile --output $W/online_c > $OUT/train_online_compiled.log 2>&1; echo "exit $? in $((SECONDS-t0)) s"
cp $W/online_c/metrics.jsonl $OUT/metrics_online_compiled.jsonl
grep "online:" $OUT/train_online_compiled.log | tail -3
python3 - <<'PY'
import json, statistics
for m, p in (("offline", "/root/online/offline"), ("online", "/root/online/online"), ("online_compiled", "/root/online/online_c")):
    recs=[json.loads(l) for l in open(p + "/metrics.jsonl")]
    rates=[r["tok_s"] for r in recs]
    print(m, "AL", recs[-1]["simulated_acceptance_length"], "median tok/s %.0f" % statistics.median(rates), "mean after 1st %.0f" % statistics.mean(rates[1:]))
PY
