"""TreeIndex and DiskMonitor on real directory trees written during the test."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from eagle3_console.monitor.disk import (DiskMonitor, free_space,
                                        nearest_existing, room_for)
from eagle3_console.monitor.tree import TreeIndex

GiB = 1 << 30
OLD = time.time() - 3600     # an mtime safely outside the racy and hot windows


def backdate(root):
    """Make a tree look written an hour ago (as a finished shard is)."""
    for dirpath, dirnames, filenames in os.walk(root):
        for n in filenames:
            os.utime(os.path.join(dirpath, n), (OLD, OLD))
    for dirpath, dirnames, filenames in os.walk(root, topdown=False):
        os.utime(dirpath, (OLD, OLD))


@pytest.fixture
def fast_tmp(tmp_path):
    """A tmpfs directory when there is one: creating 20,000 files on a busy
    journaling filesystem takes seconds; the index logic is the same."""
    shm = Path("/dev/shm")
    if not (shm.is_dir() and os.access(shm, os.W_OK)):
        yield tmp_path
        return
    d = Path(tempfile.mkdtemp(dir=shm, prefix="eagle3-test-"))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def write(path, size):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * size)


def test_missing_root_then_growing_tree(tmp_path):
    root = tmp_path / "out"
    idx = TreeIndex(root)
    st = idx.refresh()
    assert not st.exists and st.files == 0 and st.total_bytes == 0
    write(root / "rows_0-2000" / "data_0.safetensors", 100)
    write(root / "data_config.json", 10)
    st = idx.refresh()
    assert st.exists and st.files == 2 and st.total_bytes == 110
    assert sorted(st.new_files) == ["data_config.json", "rows_0-2000/data_0.safetensors"]
    write(root / "rows_0-2000" / "data_1.safetensors", 50)
    write(root / "rows_2000-4000" / "data_2000.safetensors", 7)
    st = idx.refresh()
    assert st.files == 4 and st.total_bytes == 167
    assert sorted(st.new_files) == ["rows_0-2000/data_1.safetensors",
                                    "rows_2000-4000/data_2000.safetensors"]
    assert set(idx.dirs()) == {"", "rows_0-2000", "rows_2000-4000"}
    assert sorted(idx.files_in("rows_0-2000")) == ["data_0.safetensors", "data_1.safetensors"]
    shutil.rmtree(root / "rows_0-2000")
    st = idx.refresh()
    assert st.files == 2 and st.total_bytes == 17
    assert sorted(st.removed_files) == ["rows_0-2000/data_0.safetensors",
                                        "rows_0-2000/data_1.safetensors"]
    shutil.rmtree(root)
    st = idx.refresh()
    assert not st.exists and st.files == 0 and len(st.removed_files) == 2


def test_growing_tmp_is_restated_and_rename_is_a_new_file(tmp_path):
    shard = tmp_path / "rows_0-2000"
    shard.mkdir()
    tmp = shard / "data_0.safetensors.tmp"
    with open(tmp, "wb") as fh:
        fh.write(b"a" * 1000)
        fh.flush()
        backdate(tmp_path)          # directory unchanged from now on while the tmp grows
        idx = TreeIndex(tmp_path)
        assert idx.refresh().total_bytes == 1000
        fh.write(b"b" * 4000)
        fh.flush()
        st = idx.refresh()
        assert st.dirs_listed == 0           # no listing needed ...
        assert st.total_bytes == 5000        # ... the .tmp was re-stat'ed
    os.rename(tmp, shard / "data_0.safetensors")
    st = idx.refresh()
    assert st.new_files == ["rows_0-2000/data_0.safetensors"]
    assert st.removed_files == ["rows_0-2000/data_0.safetensors.tmp"]
    assert st.files == 1 and st.total_bytes == 5000


def test_in_place_growth_of_a_recent_file_is_seen(tmp_path):
    ckpt = tmp_path / "model.safetensors"
    with open(ckpt, "wb") as fh:
        fh.write(b"a" * 10)
        fh.flush()
        os.utime(tmp_path, (OLD, OLD))
        idx = TreeIndex(tmp_path)
        assert idx.refresh().total_bytes == 10
        fh.write(b"a" * 90)
        fh.flush()
        st = idx.refresh()
    assert st.dirs_listed == 0 and st.total_bytes == 100


def test_second_refresh_of_unchanged_20000_file_tree_lists_nothing(fast_tmp):
    root = fast_tmp / "hs"
    for s in range(10):
        d = root / f"rows_{s * 2000}-{s * 2000 + 2000}"
        d.mkdir(parents=True)
        for i in range(s * 2000, s * 2000 + 2000):
            os.close(os.open(d / f"data_{i}.safetensors", os.O_CREAT | os.O_WRONLY, 0o644))
    backdate(root)
    idx = TreeIndex(root)
    first = idx.refresh()
    assert first.files == 20000 and first.dirs_listed == 11 and len(first.new_files) == 20000
    second = idx.refresh()
    assert second.dirs_listed == 0 and second.files_stated == 0 and second.new_files == []
    assert second.files == 20000
    # One new sample: only its shard directory is listed again, only it is stat'ed.
    write(root / "rows_4000-6000" / "extra.safetensors", 3)
    third = idx.refresh()
    assert third.dirs_listed == 1 and third.files_stated == 1
    assert third.new_files == ["rows_4000-6000/extra.safetensors"]
    assert third.total_bytes == 3


def test_recently_listed_directory_is_listed_again(tmp_path):
    racy, settled = tmp_path / "racy", tmp_path / "settled"
    write(racy / "a", 1)
    write(settled / "a", 1)
    # `racy` changed in the very tick it is listed (its mtime is not older than
    # the listing); `settled` changed an hour ago.
    tick = time.time_ns() + 5_000_000
    os.utime(racy, ns=(tick, tick))
    os.utime(settled, ns=(int(OLD * 1e9), int(OLD * 1e9)))
    os.utime(tmp_path, ns=(int(OLD * 1e9), int(OLD * 1e9)))
    idx = TreeIndex(tmp_path)
    idx.refresh()
    # A second file lands within the same tick: the directory mtime does not move.
    write(racy / "b", 2)
    write(settled / "b", 2)
    os.utime(racy, ns=(tick, tick))
    os.utime(settled, ns=(int(OLD * 1e9), int(OLD * 1e9)))
    st = idx.refresh()
    assert st.new_files == ["racy/b"]          # listed again because it was racy
    assert "settled/b" not in st.new_files      # an mtime-based index cannot see this one


def test_whole_second_mtimes_get_a_wider_racy_window(tmp_path):
    from eagle3_console.monitor.tree import _racy

    now = 1_700_000_000_500_000_000
    assert _racy(now - 100_000_000, now) is False                  # 100 ms ago, ns precision
    assert _racy(1_700_000_000_000_000_000, now) is True           # whole second, 0.5 s ago
    assert _racy(1_699_999_997_000_000_000, now) is False          # whole second, 3.5 s ago


def test_a_fresh_tree_of_whole_files_is_not_restated_in_full(fast_tmp):
    d = fast_tmp / "rows_0-2000"
    d.mkdir()
    for i in range(300):
        (d / f"data_{i}.safetensors").write_bytes(b"x")
    idx = TreeIndex(fast_tmp)
    assert idx.refresh().files_stated == 300
    # Just written, so maybe still growing: only the newest few are looked at again.
    newest = max(d.iterdir(), key=lambda p: (p.stat().st_mtime_ns, p.name))
    with open(newest, "ab") as fh:
        fh.write(b"more")
    st = idx.refresh()
    assert 1 <= st.files_stated <= 8 and st.total_bytes == 304


def test_symlinks_are_neither_followed_nor_counted(tmp_path):
    outside = tmp_path / "outside"
    write(outside / "big.bin", 5000)
    root = tmp_path / "out"
    write(root / "real.bin", 10)
    os.symlink(outside, root / "linkdir")
    os.symlink(outside / "big.bin", root / "link.bin")
    st = TreeIndex(root).refresh()
    assert st.files == 1 and st.total_bytes == 10 and st.dirs == 1


def test_root_may_be_a_symlink(tmp_path):
    real = tmp_path / "big_disk" / "hs"
    write(real / "rows_0-2000" / "data_0.safetensors", 42)
    os.symlink(real, tmp_path / "hs")
    assert TreeIndex(tmp_path / "hs").refresh().total_bytes == 42


# ---- disk ------------------------------------------------------------------

def test_nearest_existing_and_free_space_of_a_future_output(tmp_path):
    future = tmp_path / "not" / "yet" / "there"
    assert nearest_existing(future) == tmp_path
    free, total = free_space(future)
    assert 0 <= free <= total
    assert shutil.disk_usage(tmp_path).total == total


def test_disk_monitor_projection_and_fit(tmp_path):
    out = tmp_path / "hs"
    mon = DiskMonitor("extract", out, estimate_bytes=1000)
    du = mon.refresh()
    assert du.written_bytes == 0 and du.files == 0 and du.fits is True
    assert du.projected_bytes is None and du.free_bytes > 0
    write(out / "rows_0-2000" / "data_0.safetensors", 300)
    write(out / "rows_0-2000" / "data_1.safetensors", 100)
    du = mon.refresh(fraction_done=0.25)
    assert du.written_bytes == 400 and du.files == 2 and du.projected_bytes == 1600
    assert du.fits is True and du.stage == "extract" and du.path == str(out)
    du = mon.refresh(fraction_done=1.0)
    assert du.projected_bytes == 400

    # A projection larger than the free space does not fit.
    free, _ = free_space(out)
    du = mon.refresh(fraction_done=400 / (free + 400 + GiB))
    assert du.projected_bytes > free and du.fits is False
    # Without a fraction, the estimate decides.
    mon.estimate_bytes = free + 400 + GiB
    assert mon.refresh().fits is False
    mon.estimate_bytes = None
    assert mon.refresh().fits is None


def test_room_for_before_a_run(tmp_path):
    free, _ = free_space(tmp_path)
    assert room_for(tmp_path / "out", 1000) == (True, pytest.approx(free, rel=0.01))
    fits, _ = room_for(tmp_path / "out", free + 10 * GiB)
    assert fits is False
    # On a resume, what is already written does not need room again.
    fits, _ = room_for(tmp_path / "out", free + 10 * GiB, written_bytes=11 * GiB)
    assert fits is True
    assert room_for(tmp_path, None)[0] is None


