"""The persisted collector cache (snapshot.Collector, persist=True): a settled
output answers from its summary (monitor/settled.py) without its per-file
state, and anything a listing would find (a file added, removed or renamed, a
shard folder gone, data_config.json or sample_lengths.json rewritten) still
shows in the next one-shot process; the per-file state is rewritten only when
it changed."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest

from eagle3_console.observe.snapshot import Collector
from eagle3_console.kernel.workspace import Workspace

from tests.test_monitor_shards import sample

OLD = time.time() - 3600       # outside the rate window and every racy / hot margin


def _age(root: Path) -> None:
    """Files and folders written an hour ago (a finished output)."""
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            os.utime(os.path.join(dirpath, name), (OLD, OLD))
    for dirpath, _dirs, _files in sorted(os.walk(root), key=lambda t: -len(t[0])):
        os.utime(dirpath, (OLD, OLD))


@pytest.fixture
def settled_ws(ws):
    ws.write("""
[stages.extract]
argv = ["true"]
outputs = ["data/hs"]
expected_samples = 12
""")
    out = ws.root / "data" / "hs"
    for i in range(12):
        sample(out / f"rows_{i // 4 * 4}-{i // 4 * 4 + 4}" / f"data_{i}.safetensors", 5 + i)
    (out / "data_config.json").write_text(json.dumps({"status": "complete", "total_samples": 12}))
    _age(out)
    Workspace(ws.root).ensure_state()
    return ws, out


def _process(ws):
    """One `status` process: a fresh collector on the persisted cache."""
    col = Collector(Workspace(ws.root), persist=True, gpus=False)
    snap = col.collect()
    (mon,) = col._shards.values()
    return snap.stage("extract").shards, mon


def _settle(ws) -> None:
    """After a change: the next process lists the changed folders (and
    re-stats a file _age() moved back in time) and then summarises again."""
    for _ in range(3):
        if _process(ws)[1].summarized:
            return
    raise AssertionError("the output never settled into a summary")


def _fresh(ws):
    return Collector(Workspace(ws.root), gpus=False).collect().stage("extract").shards


def _comparable(sp):
    d = dict(sp.__dict__)
    d["shards"] = [s.__dict__ for s in sp.shards]
    return d


def test_a_settled_output_answers_from_its_summary_as_a_full_listing_would(settled_ws):
    ws, out = settled_ws
    first, mon = _process(ws)
    assert not mon.summarized and first.samples_done == 12 and first.tokens_done == sum(range(5, 17))
    second, mon = _process(ws)
    assert mon.summarized
    assert _comparable(second) == _comparable(_fresh(ws)) == _comparable(first)
    # The summary alone answered: the per-file state is not even needed.
    for f in (ws.root / ".eagle3" / "cache").glob("shards-*.json"):
        f.unlink()
    third, mon = _process(ws)
    assert mon.summarized and _comparable(third) == _comparable(first)


def test_a_file_removed_from_a_complete_output_is_noticed(settled_ws):
    ws, out = settled_ws
    _process(ws)
    assert _process(ws)[1].summarized
    (out / "rows_4-8" / "data_5.safetensors").unlink()
    sp, mon = _process(ws)
    assert not mon.summarized and sp.samples_done == 11
    assert [s.done for s in sp.shards] == [4, 3, 4]
    assert _comparable(sp) == _comparable(_fresh(ws))


def test_a_file_added_a_folder_removed_or_a_file_renamed_is_noticed(settled_ws):
    ws, out = settled_ws
    _process(ws)
    assert _process(ws)[1].summarized
    sample(out / "rows_12-16" / "data_12.safetensors", 40)
    sp, _mon = _process(ws)
    assert sp.samples_done == 13 and sp.tokens_done == sum(range(5, 17)) + 40
    _age(out)
    _settle(ws)
    shutil.rmtree(out / "rows_0-4")
    sp, _mon = _process(ws)
    assert sp.samples_done == 9 and [s.name for s in sp.shards] == ["rows_4-8", "rows_8-12", "rows_12-16"]
    _age(out)
    _settle(ws)
    os.rename(out / "rows_4-8" / "data_4.safetensors", out / "rows_4-8" / "data_4.safetensors.tmp")
    sp, _mon = _process(ws)
    assert sp.samples_done == 8 and sp.tmp_files == 1


def test_files_rewritten_in_place_at_the_root_are_seen_from_the_summary(settled_ws):
    """data_config.json and sample_lengths.json are rewritten in place by other
    tools (no folder mtime changes): stat'ed every time, summary or not."""
    ws, out = settled_ws
    (out / "data_config.json").write_text(json.dumps({"status": "running", "total_samples": 12}))
    _age(out)
    _process(ws)
    sp, mon = _process(ws)
    assert mon.summarized and not sp.complete
    with open(out / "data_config.json", "w") as fh:
        fh.write(json.dumps({"status": "complete", "total_samples": 12}))
    sp, mon = _process(ws)
    assert mon.summarized and sp.complete and sp.eta_s == 0.0
    lengths = out / "sample_lengths.json"
    lengths.write_text(json.dumps({str(i): 100 for i in range(12)}))
    os.utime(out, (OLD, OLD))        # as if written in place long ago: only its own stat shows it
    sp, _mon = _process(ws)
    assert sp.tokens_done == 1200
    with open(lengths, "w") as fh:
        fh.write(json.dumps({str(i): 10 for i in range(12)}))
    sp, _mon = _process(ws)
    assert sp.tokens_done == 120


def test_a_live_output_is_followed_file_by_file(settled_ws):
    """Files written inside the rate window: no summary, the full state
    (incremental, as before), and a rate from the files' mtimes."""
    ws, out = settled_ws
    (out / "data_config.json").write_text(json.dumps({"status": "running", "total_samples": 16}))
    now = time.time()
    for i in range(12, 16):
        sample(out / "rows_12-16" / f"data_{i}.safetensors", 10, mtime=now - 40 + i)
    sp, mon = _process(ws)
    assert sp.samples_done == 16 and sp.samples_per_s and sp.samples_per_s > 0
    sp, mon = _process(ws)
    assert not mon.summarized and sp.samples_done == 16


def _folder_files(cache: Path) -> dict[str, tuple[int, int]]:
    """Each folder's saved per-file state (its `rel`) -> (mtime_ns, inode) of its file."""
    out = {}
    for f in cache.glob("shards-*.json"):
        st = f.stat()
        out[json.loads(f.read_text())["rel"]] = (st.st_mtime_ns, st.st_ino)
    return out


def test_the_per_file_state_is_rewritten_only_when_it_changed(settled_ws):
    ws, out = settled_ws
    _process(ws)
    cache = ws.root / ".eagle3" / "cache"
    before = _folder_files(cache)
    assert set(before) == {"", "rows_0-4", "rows_4-8", "rows_8-12"}
    small = (cache / "monitors.json").stat().st_mtime_ns
    time.sleep(0.01)
    _process(ws)
    _process(ws)
    assert _folder_files(cache) == before
    assert (cache / "monitors.json").stat().st_mtime_ns != small
    sample(out / "rows_12-16" / "data_12.safetensors", 40)
    _process(ws)
    after = _folder_files(cache)
    # The root (a new folder in it) and the new folder: the others' state is neither read nor rewritten.
    assert after[""] != before[""] and "rows_12-16" in after
    assert {k: after[k] for k in ("rows_0-4", "rows_4-8", "rows_8-12")} == \
        {k: before[k] for k in ("rows_0-4", "rows_4-8", "rows_8-12")}


def test_a_damaged_cache_costs_one_listing_never_a_wrong_count(settled_ws):
    ws, out = settled_ws
    _process(ws)
    cache = ws.root / ".eagle3" / "cache"
    for full in cache.glob("shards-*.json"):
        full.write_text("{not json")
    (out / "rows_8-12" / "data_9.safetensors").unlink()
    sp, _mon = _process(ws)
    assert sp.samples_done == 11
    assert _comparable(sp) == _comparable(_fresh(ws))
    (cache / "monitors.json").write_text(json.dumps({"version": 3, "shards": {"x": 1}, "logs": []}))
    assert _process(ws)[0].samples_done == 11


def _without_rate(sp):
    d = _comparable(sp)
    for key in ("samples_per_s", "tokens_per_s", "eta_s"):
        d.pop(key)
    return d


def test_under_a_live_output_only_the_changed_folders_are_loaded(settled_ws):
    """A live extraction: the folder being written has files inside the rate
    window, the finished ones do not. The next process loads only the live
    folder (and the root); a finished folder that changes is loaded then, and
    every count is what a full listing finds."""
    ws, out = settled_ws
    (out / "data_config.json").write_text(json.dumps({"status": "running", "total_samples": 16}))
    now = time.time()
    for i in (12, 13):
        sample(out / "rows_12-16" / f"data_{i}.safetensors", 20 + i, mtime=now - 30 + i)
    for d in (out, out / "rows_12-16"):
        os.utime(d, (now - 20, now - 20))       # past the racy margin
    _process(ws)
    sp, mon = _process(ws)
    assert not mon.summarized
    assert set(mon.index.dirs()) == {"", "rows_12-16"}
    assert set(mon.index.frozen_dirs()) == {"rows_0-4", "rows_4-8", "rows_8-12"}
    assert sp.samples_done == 14 and sp.tokens_done == sum(range(5, 17)) + 32 + 33
    assert _without_rate(sp) == _without_rate(_fresh(ws))

    # A finished folder changes (a file removed), the live one grows.
    (out / "rows_4-8" / "data_5.safetensors").unlink()
    sample(out / "rows_12-16" / "data_14.safetensors", 7, mtime=time.time() - 5)
    sp, mon = _process(ws)
    assert set(mon.index.frozen_dirs()) == {"rows_0-4", "rows_8-12"}
    assert sp.samples_done == 14 and [s.done for s in sp.shards] == [4, 3, 4, 3]
    assert sp.tokens_done == sum(range(5, 17)) - 10 + 32 + 33 + 7
    assert _without_rate(sp) == _without_rate(_fresh(ws))

    # With no observation of its own in the window, the rate comes from the
    # live folder's mtimes, as a full listing's does: frozen folders have none there.
    cache = ws.root / ".eagle3" / "cache" / "monitors.json"
    data = json.loads(cache.read_text())
    for entry in data["shards"].values():
        entry["obs"] = []
    cache.write_text(json.dumps(data))
    sp, mon = _process(ws)
    fresh = _fresh(ws)
    assert sp.samples_per_s and sp.samples_per_s == pytest.approx(fresh.samples_per_s)
    assert sp.tokens_per_s == pytest.approx(fresh.tokens_per_s)


def test_sample_lengths_written_under_frozen_folders_recount_every_folder(settled_ws):
    """A frozen folder's token count was taken with the lengths of then: a new
    sample_lengths.json loads every folder again."""
    ws, out = settled_ws
    now = time.time()
    sample(out / "rows_12-16" / "data_12.safetensors", 9, mtime=now - 10)
    os.utime(out / "rows_12-16", (now - 20, now - 20))
    os.utime(out, (now - 20, now - 20))
    _process(ws)
    sp, mon = _process(ws)
    assert mon.index.frozen_dirs()
    lengths = out / "sample_lengths.json"
    lengths.write_text(json.dumps({str(i): 100 for i in range(13)}))
    os.utime(out, (now - 20, now - 20))
    sp, mon = _process(ws)
    assert sp.tokens_done == 1300 and not mon.index.frozen_dirs()
    fresh = _without_rate(_fresh(ws))
    # Bytes a token counts the root's files too: the new sample_lengths.json under a root whose
    # mtime the test held back is in a fresh scan's bytes only (133 B of 9.5 KB here).
    mine = _without_rate(sp)
    assert abs(mine.pop("bytes_per_token") - fresh.pop("bytes_per_token")) < 0.02 * 7.3
    assert mine == fresh
