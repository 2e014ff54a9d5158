"""monitor/metrics.py: metrics.jsonl read incrementally (one offset, never the
file again), restarts on truncation, replacement and a new run's step 1;
bounded series; the collector's curves stay out of status --json."""

from __future__ import annotations

import json
import os

from eagle3_console.monitor.metrics import MAX_POINTS, MetricsReader, RateHistory
from ops import get_spec

TRAIN_POINT = get_spec("train").curves.point


def rec(step: int, loss: float, acc=(0.5, 0.25)) -> str:
    return json.dumps({"step": step, "total": 100, "loss": loss, "acc": list(acc)}) + "\n"


def test_reads_only_what_was_appended(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(rec(1, 3.0) + rec(2, 2.5))
    reader = MetricsReader(path, TRAIN_POINT)
    c = reader.refresh()
    assert c.steps == [1, 2] and c.loss == [3.0, 2.5] and c.acc == [[0.5, 0.5], [0.25, 0.25]]
    assert c.sim_al == [1.625, 1.625]          # computed from acc: records without the field
    # A line being written is held back until its newline comes.
    line = rec(3, 2.0)
    with open(path, "a") as fh:
        fh.write(line[:10])
    assert reader.refresh().steps == [1, 2]
    with open(path, "a") as fh:
        fh.write(line[10:])
    assert reader.refresh().steps == [1, 2, 3]
    assert reader.refresh().steps == [1, 2, 3]
    assert reader.reads == path.stat().st_size        # every byte read once


def test_truncated_replaced_or_a_new_run_starts_over(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(rec(1, 3.0) + rec(2, 2.5) + rec(3, 2.0))
    reader = MetricsReader(path, TRAIN_POINT)
    assert reader.refresh().steps == [1, 2, 3]
    path.write_text(rec(1, 9.0))                         # cut shorter
    assert reader.refresh().steps == [1] and reader.curves.loss == [9.0]
    tmp = tmp_path / "new"
    tmp.write_text(rec(5, 1.0) + rec(6, 0.5) + rec(7, 0.25))
    os.replace(tmp, path)                                # replaced (another inode)
    assert reader.refresh().steps == [5, 6, 7]
    with open(path, "a") as fh:                          # a fresh run appending into the same output
        fh.write(rec(1, 4.0, acc=(0.1, 0.0, 0.0)))
    c = reader.refresh()
    assert c.steps == [1] and len(c.acc) == 3


def test_series_stay_bounded_and_keep_the_newest(tmp_path):
    path = tmp_path / "metrics.jsonl"
    n = MAX_POINTS * 4 + 3
    path.write_text("".join(rec(s, 1000.0 / s) for s in range(1, n + 1)))
    c = MetricsReader(path, TRAIN_POINT).refresh()
    assert len(c.steps) <= MAX_POINTS and c.steps[0] == 1 and c.steps[-1] == n
    assert len(c.loss) == len(c.steps) == len(c.acc[0]) == len(c.sim_al)
    assert c.steps == sorted(c.steps)
    h = RateHistory()
    for i in range(n):
        h.add(float(i), float(i))
    assert len(h.curves.tok_s) <= MAX_POINTS and h.curves.tok_s[-1] == n - 1


def test_collector_curves_in_the_tui_never_in_status_json(ws):
    from eagle3_console.observe.snapshot import Collector
    from eagle3_console.kernel.workspace import Workspace

    ws.write("""
[target]
path = "assets/target"
num_layers = 8
hidden_size = 64
dtype = "float32"
vocab_size = 512

[stages.train]
op = "train"
params = { data = "data/hs", vocab = "data/vocab", output = "runs/train" }
""")
    out = ws.root / "runs" / "train"
    out.mkdir(parents=True)
    (out / "metrics.jsonl").write_text(rec(1, 3.0) + rec(2, 2.0))
    w = Workspace.at(ws.root)
    col = Collector(w, gpus=False)
    st = col.collect().stage("train")
    assert st.curves is not None and st.curves.steps == [1, 2]
    with open(out / "metrics.jsonl", "a") as fh:
        fh.write(rec(3, 1.5))
    assert col.collect().stage("train").curves.steps == [1, 2, 3]
    snap = Collector(w, gpus=False, persist=True).collect()
    assert snap.stage("train").curves is None                 # one-shot status: no history kept
    proc = ws.cli("status", "--json", "--no-gpus")
    data = json.loads(proc.stdout)
    train = next(s for s in data["stages"] if s["name"] == "train")
    assert "curves" not in train and train["result"]["step"] == 3
    assert all("curves" not in s for s in Collector(w, gpus=False).collect().to_dict()["stages"])


def test_an_extractions_tok_s_history_is_its_latest_runs():
    from eagle3_console.kernel.model import StageStatus
    from eagle3_console.monitor.metrics import CurveTracker

    tracker = CurveTracker()

    def st(run_id, status, tok_s):
        return StageStatus(name="extract", op="extract", status=status, run_id=run_id, tokens_per_s=tok_s)
    assert tracker.curves(st(1, "running", None), 1.0) is None      # no rate yet: no curve
    tracker.curves(st(1, "running", 100.0), 2.0)
    c = tracker.curves(st(1, "running", 300.0), 3.0)
    assert c.tok_s == [100.0, 300.0] and c.tok_s_times == [2.0, 3.0]
    # Ended: the history stays (no new point); a new run starts its own.
    assert tracker.curves(st(1, "failed", None), 4.0).tok_s == [100.0, 300.0]
    assert tracker.curves(st(2, "running", 50.0), 5.0).tok_s == [50.0]
    assert tracker.curves(st(1, "failed", None), 6.0) is None        # the older run's was dropped
