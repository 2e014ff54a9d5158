"""ShardMonitor on real sample files of every layout, written during the test."""

from __future__ import annotations

import json
import os
import time

import numpy as np
import pytest
from safetensors.numpy import save_file

from eagle3_console.monitor.shards import ShardMonitor

H = 4   # a tiny hidden size: the monitor reads headers only


def sample(path, tokens, *, via_tmp=True, mtime=None):
    """One sample as extract writes it: *.tmp then rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {
        "input_ids": np.arange(tokens, dtype=np.int64),
        "loss_mask": np.ones(tokens, dtype=np.uint8),
        "aux_hidden_states": np.zeros((tokens, 3 * H), dtype=np.float16),
        "final_hidden_states": np.zeros((tokens, H), dtype=np.float16),
    }
    if via_tmp:
        tmp = path.with_name(path.name + ".tmp")
        save_file(tensors, str(tmp))
        os.rename(tmp, path)
    else:
        save_file(tensors, str(path))
    if mtime is not None:
        os.utime(path, (mtime, mtime))


def config(root, **kw):
    root.mkdir(parents=True, exist_ok=True)
    (root / "data_config.json").write_text(json.dumps(kw))


def test_eagle3_layout_grows_to_complete(tmp_path):
    out = tmp_path / "hidden_states"
    mon = ShardMonitor(out)
    p = mon.refresh()
    assert p.layout == "none" and p.samples_done == 0 and p.samples_expected is None
    assert p.tokens_done is None and not p.complete

    config(out, status="running", total_samples=2005)
    for i, t in enumerate([10, 20, 30]):
        sample(out / "rows_0-2000" / f"data_{i}.safetensors", t)
    (out / "rows_0-2000" / "data_3.safetensors.tmp").write_bytes(b"partial")
    p = mon.refresh()
    assert p.layout == "eagle3" and p.samples_done == 3 and p.samples_expected == 2005
    assert p.tokens_done == 60 and p.tmp_files == 1 and not p.complete
    assert [(s.name, s.done, s.expected) for s in p.shards] == [("rows_0-2000", 3, 2000)]

    os.unlink(out / "rows_0-2000" / "data_3.safetensors.tmp")
    sample(out / "rows_0-2000" / "data_3.safetensors", 40)
    sample(out / "rows_2000-4000" / "data_2000.safetensors", 5)
    p = mon.refresh()
    assert p.samples_done == 5 and p.tokens_done == 105 and p.tmp_files == 0
    # The last shard holds only the rows that exist: 2005 - 2000.
    assert [(s.name, s.done, s.expected) for s in p.shards] == [
        ("rows_0-2000", 4, 2000), ("rows_2000-4000", 1, 5)]

    config(out, status="complete", total_samples=2005, total_tokens=105)
    p = mon.refresh()
    assert p.complete and p.eta_s == 0.0 and p.tokens_expected == 105


def test_expected_from_the_caller_wins_over_data_config(tmp_path):
    config(tmp_path, status="running", total_samples=10)
    sample(tmp_path / "rows_0-2000" / "data_0.safetensors", 7)
    p = ShardMonitor(tmp_path, expected_samples=4, expected_tokens=28).refresh()
    assert p.samples_expected == 4 and p.tokens_expected == 28
    assert p.shards[0].expected == 4


def test_seed_specforge_layout_pt_and_ckpt(tmp_path):
    # The seed's data_config.json has no status: complete when all samples exist.
    config(tmp_path, total_samples=3, hidden_size=7168)
    for i, ext in enumerate(["pt", "ckpt"]):
        d = tmp_path / "rows_0-2000"
        d.mkdir(exist_ok=True)
        (d / f"data_{i}.{ext}").write_bytes(b"torch pickle")
    mon = ShardMonitor(tmp_path)
    p = mon.refresh()
    assert p.layout == "specforge" and p.samples_done == 2 and p.samples_expected == 3
    assert p.tokens_done is None and not p.complete
    (tmp_path / "rows_0-2000" / "data_2.pt").write_bytes(b"torch pickle")
    (tmp_path / "sample_lengths.json").write_text(json.dumps({"0": 100, "1": 200, "2": 300}))
    p = mon.refresh()
    assert p.samples_done == 3 and p.complete and p.tokens_done == 600 and p.eta_s == 0.0


def test_speculators_flat_pt(tmp_path):
    for i in range(4):
        (tmp_path / f"data_{i}.pt").write_bytes(b"x")
    (tmp_path / "notes.txt").write_text("not a sample")
    p = ShardMonitor(tmp_path, expected_samples=10).refresh()
    assert p.layout == "speculators_pt" and p.samples_done == 4
    assert [(s.name, s.done, s.expected) for s in p.shards] == [(".", 4, 10)]


def test_speculators_flat_hs_safetensors(tmp_path):
    for i, t in enumerate([3, 4]):
        sample(tmp_path / f"hs_{i}.safetensors", t, via_tmp=False)
    p = ShardMonitor(tmp_path).refresh()
    assert p.layout == "speculators_hs" and p.samples_done == 2 and p.tokens_done == 7


def test_speculators_own_hs_files_count_their_token_ids(tmp_path):
    """speculators 0.9.0 writes `hidden_states` [T, layers, H] and `token_ids` [T] (no
    input_ids) into hs_<i>.safetensors: hs_connectors/fp8_hidden_states_connector.py's
    docstring, hs_connectors/mooncake_hidden_states_connector.py's save, read back by
    speculators/train/data.py as loaded_hs["token_ids"]."""
    for i, t in enumerate([3, 4, 6]):
        save_file({"hidden_states": np.zeros((t, 4, H), dtype=np.float16),
                   "token_ids": np.arange(t, dtype=np.int64)}, str(tmp_path / f"hs_{i}.safetensors"))
    p = ShardMonitor(tmp_path).refresh()
    assert p.layout == "speculators_hs" and p.samples_done == 3 and p.tokens_done == 13


def test_samples_outside_shard_dirs_are_not_counted(tmp_path):
    sample(tmp_path / "rows_0-2000" / "data_0.safetensors", 3)
    sample(tmp_path / "old" / "data_1.safetensors", 3)
    sample(tmp_path / "rows_0-2000" / "nested" / "data_2.safetensors", 3)
    p = ShardMonitor(tmp_path).refresh()
    assert p.samples_done == 1 and p.tokens_done == 3


def test_rate_over_the_sliding_window_with_controlled_now(tmp_path):
    mon = ShardMonitor(tmp_path, expected_samples=100, window_s=60)
    t0 = time.time()
    for i in range(10):
        sample(tmp_path / "rows_0-2000" / f"data_{i}.safetensors", 10, mtime=t0 - 3600)
    p = mon.refresh(now=t0)
    # Nothing finished within the last minute: the run is not moving.
    assert p.samples_per_s == 0.0 and p.eta_s is None
    for i in range(10, 30):
        sample(tmp_path / "rows_0-2000" / f"data_{i}.safetensors", 10)
    p = mon.refresh(now=t0 + 10)
    assert p.samples_per_s == pytest.approx(2.0) and p.tokens_per_s == pytest.approx(20.0)
    assert p.eta_s == pytest.approx(70 / 2.0)
    for i in range(30, 40):
        sample(tmp_path / "rows_0-2000" / f"data_{i}.safetensors", 10)
    p = mon.refresh(now=t0 + 30)
    assert p.samples_per_s == pytest.approx(30 / 30)
    # At t0+75 the observations at t0 and t0+10 left the window; t0+30 remains.
    for i in range(40, 47):
        sample(tmp_path / "rows_0-2000" / f"data_{i}.safetensors", 10)
    p = mon.refresh(now=t0 + 75)
    assert p.samples_per_s == pytest.approx(7 / 45)
    # A clean removed samples: the window restarts instead of showing a negative rate.
    for i in range(40, 47):
        os.unlink(tmp_path / "rows_0-2000" / f"data_{i}.safetensors")
    p = mon.refresh(now=t0 + 80)
    assert p.samples_done == 40 and (p.samples_per_s or 0) >= 0


def test_one_shot_rate_from_sample_mtimes(tmp_path):
    now = time.time()
    # Old samples, then 11 samples finished 2 s apart during the last 20 s.
    for i in range(5):
        sample(tmp_path / "rows_0-2000" / f"data_{i}.safetensors", 50, mtime=now - 900)
    for k in range(11):
        sample(tmp_path / "rows_0-2000" / f"data_{5 + k}.safetensors", 100, mtime=now - 20 + 2 * k)
    p = ShardMonitor(tmp_path, expected_samples=66, window_s=60).refresh(now=now + 1)
    assert p.samples_per_s == pytest.approx(10 / 20)
    assert p.tokens_per_s == pytest.approx(10 * 100 / 20)
    assert p.eta_s == pytest.approx(50 / 0.5)


def test_truncated_sample_is_a_bad_file_and_retried_when_it_changes(tmp_path):
    good = tmp_path / "rows_0-2000" / "data_0.safetensors"
    sample(good, 8)
    bad = tmp_path / "rows_0-2000" / "data_1.safetensors"
    bad.write_bytes(b"\x10\x00")
    mon = ShardMonitor(tmp_path)
    p = mon.refresh()
    assert p.samples_done == 2 and p.bad_files == 1 and p.tokens_done == 8
    sample(bad, 9, via_tmp=False)   # rewritten in place: a new size, same inode
    p = mon.refresh()
    assert p.bad_files == 0 and p.tokens_done == 17


def test_unreadable_data_config_is_reported_with_the_file(tmp_path):
    (tmp_path / "data_config.json").write_text("{not json")
    sample(tmp_path / "rows_0-2000" / "data_0.safetensors", 2)
    p = ShardMonitor(tmp_path).refresh()
    assert p.samples_done == 1 and p.samples_expected is None
    assert "data_config.json" in p.error and "not valid JSON" in p.error
    (tmp_path / "data_config.json").write_text(json.dumps({"status": "running", "total_samples": "ten"}))
    p = ShardMonitor(tmp_path).refresh()
    assert "total_samples should be an integer" in p.error


def _next_process(mon, root):
    """What the next one-shot `status` restores (snapshot.Collector, persist=True):
    the per-folder counts and each folder's per-file state, through JSON."""
    saved = json.loads(json.dumps({"entry": mon.folders(),
                                   "dirs": {rel: mon.folder_state(rel) for rel in mon.index.dirs()}}))
    again = ShardMonitor.from_folders(saved["entry"], root, saved["dirs"].get, now=time.time())
    assert again is not None
    return again


def test_state_round_trip_does_not_reread_headers(tmp_path):
    old = time.time() - 3600
    for i in range(3):
        sample(tmp_path / "rows_0-2000" / f"data_{i}.safetensors", 10 + i, mtime=old)
    os.utime(tmp_path / "rows_0-2000", (old, old))
    os.utime(tmp_path, (old, old))
    mon = ShardMonitor(tmp_path)
    assert mon.refresh().tokens_done == 33
    # Overwrite a header in place, keeping size and mtime: only a re-read would notice.
    f = tmp_path / "rows_0-2000" / "data_0.safetensors"
    size = f.stat().st_size
    with open(f, "r+b") as fh:
        fh.write(b"\xff" * 8)
    os.utime(f, (old, old))
    assert f.stat().st_size == size
    again = _next_process(mon, tmp_path)
    p = again.refresh()
    assert p.tokens_done == 33 and p.bad_files == 0 and again.index.last.dirs_listed == 0
    sample(tmp_path / "rows_0-2000" / "data_3.safetensors", 5)
    p = again.refresh()
    assert p.samples_done == 4 and p.tokens_done == 38
    # A fresh monitor reads every header, and so sees the damage.
    assert ShardMonitor(tmp_path).refresh().bad_files == 1


def test_restored_monitor_reads_sample_lengths_only_when_needed(tmp_path):
    old = time.time() - 3600
    for i, t in enumerate([10, 11]):
        sample(tmp_path / "rows_0-2000" / f"data_{i}.safetensors", t, mtime=old)
    lengths = tmp_path / "sample_lengths.json"
    lengths.write_text(json.dumps({"0": 100, "1": 200}))
    for p in (lengths, tmp_path / "rows_0-2000", tmp_path):
        os.utime(p, (old, old))
    mon = ShardMonitor(tmp_path)
    assert mon.refresh().tokens_done == 300      # sample_lengths.json wins over the headers
    # Same size, same mtime, other content: a restored monitor that re-read it would say 1100.
    lengths.write_text(json.dumps({"0": 900, "1": 200}))
    os.utime(lengths, (old, old))
    again = _next_process(mon, tmp_path)
    assert again.refresh().tokens_done == 300
    # A new sample changes the set: the sum is rebuilt, reading the file now.
    sample(tmp_path / "rows_0-2000" / "data_2.safetensors", 5)
    assert again.refresh().tokens_done == 900 + 200 + 5
    # A damaged sample_lengths.json is reported, and still reported after a restore.
    lengths.write_text("{broken")
    p = again.refresh()
    assert "sample_lengths.json" in p.error and p.tokens_done == 10 + 11 + 5
    restored = _next_process(again, tmp_path)
    assert "sample_lengths.json" in restored.refresh().error


def test_speculators_total_is_read_from_its_own_data_config(tmp_path):
    """speculators records its count under data.num_samples, not total_samples."""
    for i in range(4):
        (tmp_path / f"data_{i}.pt").write_bytes(b"x")
    config(tmp_path, data={"num_samples": 10, "seq_length": 2048})
    p = ShardMonitor(tmp_path).refresh()
    assert (p.samples_done, p.samples_expected, p.complete) == (4, 10, False)
    assert p.eta_s is None or p.eta_s > 0
    for i in range(4, 10):
        (tmp_path / f"data_{i}.pt").write_bytes(b"x")
    config(tmp_path, data={"num_samples": "ten"})
    p = ShardMonitor(tmp_path).refresh()
    assert p.samples_expected is None and "data.num_samples should be an integer" in p.error
    config(tmp_path, data={"num_samples": 10})
    p = ShardMonitor(tmp_path).refresh()
    assert (p.samples_done, p.samples_expected, p.complete) == (10, 10, True)
