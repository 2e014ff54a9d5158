#!/usr/bin/env bash
# Online against offline training on the real target (issue 35, item 4), one GPU, from the repository root.
# Here, first:  python -m benchmarks.online_data --target "$(python -c 'from ops.demo.realmodel import
#               ensure_smollm2; print(ensure_smollm2())')" --output .devwork/online     (conversations, prepare, vocab)
#               python3 /tmp/slices44.py <that folder> smollm2   (../shared/device-sglang/slices.py at 44 MiB a
#               slice: a call carries 64 MiB with the tree)
# On the device: `bash .devslices/smollm2/bin/stage.sh NN` a call per slice, then
#   bash benchmarks/gpu_online.sh     carry [".devslices/smollm2/bin", ".devwork/online"]
# The same prepared samples feed extract -> train (offline) and train --mode online, with the same seed and
# Params; the figures (held-out simulated AL, train tok/s, disk) are printed and left in $OUT.
set -u
# $OUT gets three files back (a call returns 8 at most): summary.txt, times.txt and everything in online.tgz.
RET=${OUT:-/tmp/online-out}
OUT=/root/online/out
M=/root/models/smollm2
D=.devwork/online
W=/root/online
EPOCHS=${EPOCHS:-3}
mkdir -p "$OUT" "$RET" $W
[ -f $M/.devslices-smollm2 ] || bash .devslices/smollm2/bin/unpack.sh $M || exit 1
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'; } \
  2>&1 | tee "$OUT/env.txt"
t() { local name=$1; shift; local t0=$SECONDS; "$@" > "$OUT/$name.log" 2>&1; local rc=$?
      echo "$name: exit $rc in $((SECONDS - t0)) s" | tee -a "$OUT/times.txt"; cp "$OUT/times.txt" "$RET/"
      # Each run's records come back as soon as it ended (a call cut at its limit keeps them).
      case $name in train_*) cp "$W/${name#train_}/metrics.jsonl" "$RET/metrics_${name#train_}.jsonl" 2>/dev/null;; esac; }
rm -rf $W/hs $W/offline $W/online
t extract python3 -m ops.extract --input $D/prepared --output $W/hs --target $M --engine hf --dtype bfloat16 \
  --max-seq-len 1024 --token-budget 16384
COMMON=(--vocab $D/vocab --target $M --epochs "$EPOCHS" --lr 1e-3 --ttt-steps 3 --token-budget 16384 --max-len 1024
        --holdout 200 --seed 0 --device cuda --save-every 100000 --log-every 20 --workers 4)
t train_offline python3 -m ops.train "${COMMON[@]}" --data $W/hs --output $W/offline
t train_online python3 -m ops.train "${COMMON[@]}" --mode online --samples $D/prepared --output $W/online
# Streamed: the producer (extract, HF engine) fills a 4 GB spool that the consumer reads and deletes;
# the spool's size sampled every 0.2 s while they run.
rm -rf $W/spool $W/streamed
python3 -m ops.extract --input $D/prepared --output $W/spool --target $M --engine hf --dtype bfloat16 \
  --max-seq-len 1024 --token-budget 16384 --spool-bytes "${SPOOL_BYTES:-4000000000}" > "$OUT/producer.log" 2>&1 &
PROD=$!
( while kill -0 $PROD 2>/dev/null; do du -sb $W/spool 2>/dev/null | cut -f1; sleep 0.2; done | sort -n | tail -1 \
  > "$OUT/spool_max_bytes.txt" ) &
t train_streamed python3 -m ops.train "${COMMON[@]}" --mode streamed --samples $D/prepared --spool $W/spool --output $W/streamed
wait $PROD; echo "producer: exit $?" | tee -a "$OUT/times.txt"
wait
echo "spool max bytes: $(cat "$OUT/spool_max_bytes.txt") (cap ${SPOOL_BYTES:-4000000000})" | tee -a "$OUT/times.txt"
du -sb $W/hs $W/offline $W/online $W/streamed $W/spool $D/prepared | tee "$OUT/du.txt"
python3 - "$W" "$OUT" <<'PY' | tee "$OUT/summary.txt"
import json, sys
from pathlib import Path
w, out = Path(sys.argv[1]), Path(sys.argv[2])
rows = {}
for mode in ("offline", "online", "streamed"):
    recs = [json.loads(x) for x in (w / mode / "metrics.jsonl").read_text().splitlines()]
    last = recs[-1]
    # Mean tok/s over the windows after the first (the first holds warm-up and the first held-out walk).
    rates = [r["tok_s"] for r in recs[1:]] or [recs[0]["tok_s"]]
    rows[mode] = {"steps": last["step"], "loss": last["loss"], "acc": last["acc"],
                  "simulated_al": last["simulated_acceptance_length"], "tok_s_mean": sum(rates) / len(rates),
                  "online": last.get("online")}
for mode in ("online", "streamed"):
    rows[f"al_diff_{mode}"] = rows[mode]["simulated_al"] - rows["offline"]["simulated_al"]
    rows[f"tok_s_ratio_{mode}_over_offline"] = rows[mode]["tok_s_mean"] / rows["offline"]["tok_s_mean"]
print(json.dumps(rows, indent=1))
PY
tail -3 "$OUT"/extract.log; grep -h "online:" "$OUT/train_online.log" "$OUT/train_streamed.log" | tail -4
cp "$OUT/summary.txt" "$OUT/times.txt" "$RET/"; tar czf "$RET/online.tgz" -C "$OUT" .
