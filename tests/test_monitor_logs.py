"""LogFollower on real log files appended, truncated and rotated during the test."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from eagle3_console.monitor.logs import LogFollower

FIXTURES = Path(__file__).parent / "fixtures_logs"


def append(path, data):
    with open(path, "ab") as fh:
        fh.write(data.encode() if isinstance(data, str) else data)


def follow_text(tmp_path, text, **kw):
    log = tmp_path / "run.log"
    log.write_text(text)
    return LogFollower(log, **kw).refresh()


# ---- reading ---------------------------------------------------------------

def test_missing_then_growing_with_partial_lines(tmp_path):
    log = tmp_path / "run.log"
    f = LogFollower(log)
    st = f.refresh()
    assert st.size == 0 and st.tail == [] and st.findings == {}
    append(log, "starting\nerrors: 0\npartial li")
    st = f.refresh()
    assert st.tail == ["starting", "errors: 0"] and st.errors == 0
    assert f.offset == len("starting\nerrors: 0\n")
    append(log, "ne\nerrors: 3\n")
    st = f.refresh()
    assert st.tail == ["starting", "errors: 0", "partial line", "errors: 3"]
    assert st.errors == 3 and st.findings["errors"].line == "errors: 3"
    assert st.findings["errors"].at_offset == len("starting\nerrors: 0\npartial line\n")
    # Nothing new: nothing changes, nothing is parsed twice.
    before = f.offset
    assert f.refresh().tail == st.tail and f.offset == before


def test_real_tqdm_carriage_return_updates(tmp_path):
    from tqdm import tqdm

    log = tmp_path / "run.log"
    f = LogFollower(log)
    with open(log, "w") as fh:
        bar = tqdm(total=1000, desc="extract", unit="sample", file=fh, mininterval=0,
                   miniters=1, ascii=True, ncols=80)
        bar.update(100)
        fh.flush()
        st = f.refresh()
        # tqdm's latest state has no line end yet: progress is read from it at once.
        assert st.progress_done == 100 and st.progress_total == 1000
        assert st.rate_unit == "sample/s"
        bar.update(872)
        fh.flush()
        st = f.refresh()
        assert st.progress_done == 972
        bar.close()
    st = f.refresh()
    assert st.progress_done == 972 and st.findings["progress"].kind == "progress"
    # Each \r update replaced the previous one in the tail: one line, the last state.
    assert len(st.tail) == 1 and "972/1000" in st.tail[0]


def test_cr_split_across_refreshes_and_crlf(tmp_path):
    log = tmp_path / "run.log"
    f = LogFollower(log)
    append(log, "\r  1%|| 10/1000 [00:01<01:39, 9.9it/s]\r  2%|| 20/1")
    st = f.refresh()
    assert st.progress_done == 10 and st.tail == ["  1%|| 10/1000 [00:01<01:39, 9.9it/s]"]
    append(log, "000 [00:02<01:38, 10.0it/s]\r\nnext line\r\n")
    st = f.refresh()
    assert st.progress_done == 20 and st.rate == 10.0 and st.eta_s == 98
    assert [line.strip() for line in st.tail] == ["2%|| 20/1000 [00:02<01:38, 10.0it/s]", "next line"]


@pytest.mark.parametrize("line, done, total, rate, unit, eta", [
    ("972/1000 [02:48<00:04, 5.80it/s]", 972, 1000, 5.80, "it/s", 4),
    ("extract:  97%|#########7| 972/1000 [02:48<00:04, 5.80sample/s]", 972, 1000, 5.80, "sample/s", 4),
    ("Epoch 3:  45%|####5     | 45/100 [01:00<01:13, 1.25s/it, loss=2.13]", 45, 100, 0.8, "it/s", 73),
    ("972it [02:48, 5.80it/s]", 972, None, 5.80, "it/s", None),
    ("train: 0/30 [00:00<?, ?it/s]", 0, 30, None, "it/s", None),
    ("tokens: 1.20k/5.00k [1:02:03<3:00:00, 1.50kit/s]", 1200, 5000, 1500.0, "it/s", 10800),
])
def test_tqdm_variants(tmp_path, line, done, total, rate, unit, eta):
    st = follow_text(tmp_path, line + "\n")
    assert (st.progress_done, st.progress_total, st.rate_unit, st.eta_s) == (done, total, unit, eta)
    assert st.rate == (pytest.approx(rate) if rate is not None else None)
    assert st.findings["progress"].line == line


def test_weight_loading_is_not_stage_progress(tmp_path):
    st = follow_text(tmp_path,
                     "Loading safetensors checkpoint shards:  86% Completed | 55/64 [24:45<04:03, 27.00s/it]\n")
    assert st.load_pct == 86 and st.progress_done is None
    assert st.findings["loading"].line.startswith("Loading safetensors checkpoint shards:  86%")
    st = follow_text(tmp_path, "Loading checkpoint shards:  50%|#####     | 2/4 [00:01<00:01,  1.9it/s]\n")
    assert st.load_pct == 50 and st.progress_done is None
    # A \r-updated loading bar shows its latest percentage before the line ends.
    st = follow_text(tmp_path, "\rLoading checkpoint shards:  25%|##| 1/4 [00:01<00:03,  1.0it/s]"
                               "\rLoading checkpoint shards:  75%|######| 3/4 [00:03<00:01,  1.0it/s]")
    assert st.load_pct == 75 and st.progress_done is None


# ---- signatures ------------------------------------------------------------

@pytest.mark.parametrize("line", [
    "RuntimeError: Worker failed with error 'CUDA out of memory. Tried to allocate 896.00 MiB.",
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.75 GiB. GPU 5 has a total capacity of 94.97 GiB",
    "torch.cuda.OutOfMemoryError: CUDA out of memory.",
    "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.",
    "[2025-06-02 14:25:03 TP0] Prefill out of memory. Try to lower your batch size.",
    "ValueError: Out of memory. Try to lower your batch size.",
    "RuntimeError: CUDA error: out of memory",
])
def test_out_of_memory_signatures(tmp_path, line):
    st = follow_text(tmp_path, "ok\n" + line + "\nmore\n")
    assert st.oom is not None and st.oom.kind == "oom" and st.oom.line == line.strip()
    assert st.oom.at_offset == 3


@pytest.mark.parametrize("line", [
    "Killed",
    "./extract.sh: line 12: 48211 Killed                  python -m ops.extract --batch-size 2000",
    "Worker 3 exited with code -9",
    "torch.distributed.elastic.multiprocessing.api: exitcode  : -9 (pid: 48213)",
    "subprocess.CalledProcessError: Command died with return code -9.",
    "[2025-06-02 14:25:04] Child process unexpectedly failed with exitcode=-9. pid=48219",
    "Signal 9 (SIGKILL) received by PID 48211",
    "ChildFailedError: worker died with <Signals.SIGKILL: 9>",
])
def test_worker_killed_with_9_counts_as_out_of_memory(tmp_path, line):
    st = follow_text(tmp_path, line + "\n")
    assert st.findings["killed"].line == line.strip()
    assert st.oom is not None and st.oom.kind == "killed" and st.oom.line == line.strip()


@pytest.mark.parametrize("line", [
    "Killed 3 stale lock files",                         # not a process
    "exit code -90",
    "[eagle3-console] run 3 killed (signal SIGKILL) after 12.0 s",   # our supervisor's own records
    "[eagle3-console] run 7 stage fake: ['python', 'tests/stages/oom.py', '--text', 'CUDA out of memory']",
    "Tip: lower --mem-fraction-static to avoid running out of memory during prefill",
])
def test_lines_that_are_not_signatures(tmp_path, line):
    st = follow_text(tmp_path, line + "\n")
    assert "killed" not in st.findings and st.oom is None


@pytest.mark.parametrize("line", [
    "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:275, "
    "internal error - please report this issue to the NCCL developers, NCCL version 2.21.5",
    "RuntimeError: ncclInternalError: Internal check failed.",
    "node01:48211:48290 [3] NCCL WARN Call to ibv_reg_mr failed with error Cannot allocate memory",
    "[rank3]:[E602 16:50:00.123456 ProcessGroupNCCL.cpp:632] [Rank 3] Watchdog caught collective operation "
    "timeout: WorkNCCL(SeqNum=88231, OpType=ALLREDUCE) ran for 600041 milliseconds before timing out.",
    "ncclUnhandledCudaError: Call to CUDA function failed.",
])
def test_nccl_signatures(tmp_path, line):
    st = follow_text(tmp_path, line + "\n")
    assert st.findings["nccl"].line == line.strip()


def test_traceback_keeps_the_final_exception_line(tmp_path):
    log = tmp_path / "run.log"
    f = LogFollower(log)
    append(log, "Traceback (most recent call last):\n  File \"run.py\", line 3, in <module>\n")
    st = f.refresh()
    assert st.findings["traceback"].line == "Traceback (most recent call last):"
    append(log, "    main()\n    ^^^^^^\nValueError: --layer-ids 70 is beyond the target's 61 layers\n"
                "[eagle3-console] run 4 failed (exit code 1) after 2.0 s\n")
    st = f.refresh()
    assert st.findings["traceback"].line == "ValueError: --layer-ids 70 is beyond the target's 61 layers"
    assert st.oom is None


def test_chained_and_prefixed_tracebacks(tmp_path):
    st = follow_text(tmp_path,
                     "Traceback (most recent call last):\n  File \"a.py\", line 1, in f\n"
                     "KeyError: 'input_ids'\n\nDuring handling of the above exception, another exception occurred:\n\n"
                     "Traceback (most recent call last):\n  File \"a.py\", line 9, in g\n"
                     "ops.formats.BadSampleFile: data_7.safetensors: truncated (10 of 400 bytes)\n")
    assert st.findings["traceback"].line.startswith("ops.formats.BadSampleFile: data_7")


def test_fixture_extract_run1_oom():
    f = LogFollower(FIXTURES / "extract_run1_oom.log")
    st = f.refresh()
    assert st.load_pct == 100 and st.progress_done is None
    assert st.oom.line.startswith("RuntimeError: Worker failed with error 'CUDA out of memory. Tried to allocate 896.00 MiB.")
    assert st.findings["traceback"].line == st.oom.line
    assert "killed" not in st.findings         # the supervisor's last line is not parsed
    assert st.tail[-1].startswith("[eagle3-console] run 3 failed")


def test_fixture_sglang_server_oom_and_nccl():
    st = LogFollower(FIXTURES / "sglang_server_oom.log").refresh()
    assert st.findings["traceback"].line.startswith("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.75 GiB")
    assert st.findings["killed"].line == "Killed" and st.oom.line == "Killed"
    st = LogFollower(FIXTURES / "sglang_nccl_timeout.log").refresh()
    assert "Watchdog caught collective operation timeout" in st.findings["nccl"].line
    assert st.oom is None and st.progress_done is None


def test_our_summary_line_and_ranks(tmp_path):
    st = follow_text(tmp_path, "progress: samples 972/1000 tokens 502983 errors 0 tok/s 2910.5\n")
    assert (st.progress_done, st.progress_total, st.tokens_done, st.errors) == (972, 1000, 502983, 0)
    assert st.tokens_per_s == 2910.5 and st.findings["progress"].line.startswith("progress: samples 972")
    st = follow_text(tmp_path,
                     "progress: samples 100/500 tokens 5000 errors 0 tok/s 100.0 rank 0/2\n"
                     "progress: samples 120/500 tokens 6000 errors 2 tok/s 150.0 rank 1/2\n"
                     "progress: samples 110/500 tokens 5500 errors 0 tok/s 110.0 rank 0/2\n"
                     "progress: items 3/9 samples/s 1.5 eta_s 4\n")
    # The last (single-process) line supersedes the per-rank ones.
    assert (st.progress_done, st.progress_total, st.rate, st.rate_unit, st.eta_s) == (3, 9, 1.5, "samples/s", 4)
    st = follow_text(tmp_path,
                     "progress: samples 100/500 tokens 5000 errors 0 tok/s 100.0 rank 0/2\n"
                     "progress: samples 120/500 tokens 6000 errors 2 tok/s 150.0 rank 1/2\n"
                     "progress: samples 110/500 tokens 5500 errors 0 tok/s 110.0 rank 0/2\n")
    assert (st.progress_done, st.progress_total, st.tokens_done, st.errors) == (230, 1000, 11500, 2)
    assert st.tokens_per_s == 260.0


# ---- truncation, rotation, big files, state ----------------------------------

def test_truncation_restarts_from_zero(tmp_path):
    log = tmp_path / "run.log"
    append(log, "x" * 100 + "\nprogress: samples 50/100 tokens 10 errors 0 tok/s 1.0\n")
    f = LogFollower(log)
    assert f.refresh().progress_done == 50
    with open(log, "w") as fh:           # `> run.log`, then the program goes on
        fh.write("progress: samples 60/100 tokens 12 errors 0 tok/s 1.0\n")
    st = f.refresh()
    assert st.progress_done == 60 and st.findings["progress"].at_offset == 0
    assert st.tail[-1].startswith("progress: samples 60/100")


def test_rotation_follows_the_new_file(tmp_path):
    log = tmp_path / "run.log"
    append(log, "torch.OutOfMemoryError: CUDA out of memory.\n")
    f = LogFollower(log)
    f.refresh()
    os.rename(log, tmp_path / "run.log.1")
    # The new file is already longer than the old one: only the inode tells.
    append(log, "Killed\n" + "y" * 60 + "\nerrors: 7\n")
    st = f.refresh()
    assert st.findings["killed"].line == "Killed" and st.findings["killed"].at_offset == 0
    assert st.errors == 7 and st.tail[-2:] == ["y" * 60, "errors: 7"]
    append(tmp_path / "run.log.1", "errors: 99\n")   # the old file is no longer followed
    append(log, "errors: 8\n")
    assert f.refresh().errors == 8


def big_log(path):
    """An old OOM, traceback, progress and errors counter, then 52 KB of filler."""
    with open(path, "wb") as fh:
        fh.write(b"CUDA out of memory long ago\n"
                 b"progress: samples 5/1000 tokens 900 errors 2 tok/s 10.0\n"
                 b"Traceback (most recent call last):\n  File \"w.py\", line 3, in run\n"
                 b"    step()\nKeyError: 'input_ids'\n")
        fh.write(b"filler line of a busy log\n" * 2000)
    return path.stat().st_size


def test_first_open_of_a_big_file_parses_its_end_and_scans_before_it(tmp_path):
    log = tmp_path / "big.log"
    size = big_log(log)
    f = LogFollower(log, tail_lines=3, first_open_bytes=4096)
    st = f.refresh()
    # Signatures before the parsed end are found by the scan ...
    assert st.oom.line == "CUDA out of memory long ago" and st.oom.at_offset == 0
    assert st.findings["traceback"].line == "KeyError: 'input_ids'"
    # ... but old progress is not parsed, and the tail holds the end only.
    assert st.progress_done is None and "progress" not in st.findings
    assert st.tail == ["filler line of a busy log"] * 3
    assert f.offset == size and st.skipped_bytes < 26      # at most the rest of a cut line

    # With a small scan window the oldest lines are skipped, and counted.
    st = LogFollower(log, first_open_bytes=4096, max_scan_bytes=8192).refresh()
    assert st.oom is None and "traceback" not in st.findings
    assert size - 4096 - 8192 <= st.skipped_bytes < size - 4096 - 8192 + 26


def test_a_burst_is_parsed_at_its_end_and_scanned_before(tmp_path):
    log = tmp_path / "run.log"
    append(log, "starting\n")
    f = LogFollower(log, tail_lines=2, max_read_bytes=1000)
    f.refresh()
    append(log, b"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
                + b"progress: samples 1/9 tokens 1 errors 0 tok/s 1.0\n" + b"more filler here\n" * 500
                + b"errors: 4\n")
    st = f.refresh()
    assert st.errors == 4 and st.tail == ["more filler here", "errors: 4"]
    assert st.oom.line.startswith("torch.OutOfMemoryError") and st.progress_done is None
    # Without a scan window, what the burst held before its end is skipped.
    g = LogFollower(log, max_read_bytes=1000, max_scan_bytes=0)
    g.refresh()
    append(log, b"NCCL error: unhandled system error\n" + b"more filler here\n" * 500)
    st = g.refresh()
    assert "nccl" not in st.findings and 35 + 8500 - 1000 <= st.skipped_bytes < 35 + 8500 - 1000 + 17


def test_very_long_line_is_cut_to_bound_memory(tmp_path):
    from eagle3_console.monitor import logs

    log = tmp_path / "run.log"
    append(log, b"A" * (logs.MAX_LINE + 10))
    f = LogFollower(log)
    st = f.refresh()
    assert f.offset == logs.MAX_LINE + 10 and len(st.tail) == 1
    append(log, "errors: 1\n")
    assert f.refresh().errors == 1


def test_state_round_trip_resumes_at_the_offset(tmp_path):
    log = tmp_path / "run.log"
    lines = [f"line {i}" for i in range(50)]
    append(log, "\n".join(lines) + "\nTraceback (most recent call last):\n  File \"x.py\", line 1\n    fo")
    f = LogFollower(log, tail_lines=5)
    f.refresh()
    state = json.loads(json.dumps(f.to_state()))
    # Rewrite already-read lines in place, same size: only a re-read would see `errors: 9`.
    data = log.read_bytes()
    log.write_bytes(data.replace(b"line 10\nline 11", b"errors: 9\nline1"))
    assert log.stat().st_size == len(data)
    g = LogFollower.from_state(state)
    append(log, "o()\nRuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB\n")
    st = g.refresh()
    assert st.errors is None
    # The open traceback carried over, and the partial frame line was read whole.
    assert st.findings["traceback"].line == "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB"
    assert st.oom.line == st.findings["traceback"].line
    assert st.tail == ["line 49", "Traceback (most recent call last):", '  File "x.py", line 1',
                       "    foo()", "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB"]
    assert g.offset == log.stat().st_size
    with pytest.raises(ValueError, match="version"):
        LogFollower.from_state({"version": 99})
    with pytest.raises(ValueError, match="'offset'"):
        LogFollower.from_state({"version": 1, "path": str(log)})


def test_the_out_of_memory_finding_of_a_log(tmp_path):
    """The one decision of "this run ran out of memory" (model.oom_finding reads it)."""
    assert LogFollower(FIXTURES / "extract_run1_oom.log").refresh().oom.line.startswith("RuntimeError: Worker failed")
    assert LogFollower(FIXTURES / "sglang_nccl_timeout.log").refresh().oom is None
    assert LogFollower(tmp_path / "absent.log").refresh().oom is None


def test_transformers_weight_loading_bar_is_loading_not_progress(tmp_path):
    from eagle3_console.monitor.logs import LogFollower
    log = tmp_path / "bench.log"
    log.write_text("Loading weights:  40%|####      | 30/75 [00:00<00:00, 18787.00it/s]\n"
                   "Loading weights: 100%|##########| 75/75 [00:00<00:00, 18787.00it/s]\n"
                   "progress: prompt 3/8 accept length 2.71\n")
    st = LogFollower(log).refresh()
    assert st.load_pct == 100.0
    assert (st.progress_done, st.progress_total) == (3, 8)


# ---- SGLang's server (strings from sglang 0.5.23's source; logparse cites the files)

def test_fixture_sglang_server_loading_then_ready():
    from eagle3_console.monitor.logparse import line_time
    st = LogFollower(FIXTURES / "sglang_server_ready.log").refresh()
    assert st.load_pct == 100 and st.progress_done is None
    ready = st.findings["ready"].line
    assert ready == "[2026-12-01 10:29:52] The server is fired up and ready to roll!"
    import time
    assert line_time(ready) == time.mktime((2026, 12, 1, 10, 29, 52, 0, 0, -1))
    assert line_time("The server is fired up and ready to roll!") is None
    assert st.oom is None and "server_died" not in st.findings


@pytest.mark.parametrize("line", [
    "[2026-12-01 10:25:03 TP5] Scheduler hit an exception: Traceback (most recent call last):",
    "[2026-12-01 10:25:03] DetokenizerManager hit an exception: Traceback (most recent call last):",
    "[2026-12-01 10:25:03] TokenizerManager hit an exception: Traceback (most recent call last):",
    "[2026-12-01 10:25:03] DataParallelController hit an exception: Traceback (most recent call last):",
    "[2026-12-01 10:25:03] Received sigquit from a child process. It usually means the child failed.",
    "RuntimeError: Rank 3 scheduler died during initialization (exit code: -9). If exit code is -9 (SIGKILL), "
    "a common cause is the OS OOM killer. Run `dmesg -T | grep -i oom` to check.",
])
def test_sglang_server_death_signatures(tmp_path, line):
    st = follow_text(tmp_path, line + "\n")
    assert st.findings["server_died"].line == line


@pytest.mark.parametrize("line", [
    "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. Current value: mem_fraction_static=0.95",
    "RuntimeError: Decode out of memory. Try to lower your batch size.",
    "RuntimeError: Prefill out of memory. Try to lower your batch size.",
])
def test_sglang_out_of_memory_messages(tmp_path, line):
    assert follow_text(tmp_path, line + "\n").oom.line == line


def test_sglang_death_is_found_by_the_signature_scan_of_an_old_part(tmp_path):
    log = tmp_path / "run.log"
    log.write_text("[2026-12-01 10:25:03] Received sigquit from a child process. It usually means the child failed.\n"
                   + "x" * 100 + "\n" + "filler line\n" * 20000)
    st = LogFollower(log, first_open_bytes=4096).refresh()
    assert "Received sigquit" in st.findings["server_died"].line


def test_fixture_sglang_server_oom_also_says_the_server_died():
    st = LogFollower(FIXTURES / "sglang_server_oom.log").refresh()
    assert st.findings["server_died"].line.startswith("[2025-06-02 14:25:03] Received sigquit")


def test_train_figures_come_from_one_source(tmp_path):
    """train's tqdm refreshes every 2 s while its `progress: step S/T` line and
    metrics.jsonl are written together: the pane said `done 25/72` (tqdm),
    `so far: step 30/72` (metrics) and `overall 34%` at once. The step line is
    progress too, and the record says at which step its loss was measured, not
    a second progress figure."""
    from eagle3_console.kernel.model import StageStatus
    from ops.train.spec import result_line
    from eagle3_console.tui.panes.progress import bar_rows, summary

    log = tmp_path / "train.log"
    log.write_text("train:  35%|###       | 25/72 [00:20<00:38, 1.23step/s]\n"
                   "progress: step 30/72 loss 2.1234 acc [0.610,0.420,0.300] tok/s 5123 lr 1.000e-03 epoch 0\n")
    state = LogFollower(log).refresh()
    assert (state.progress_done, state.progress_total) == (30, 72)
    record = {"step": 30, "total": 72, "loss": 2.1234, "acc": [0.61, 0.42, 0.3]}
    line = result_line(record)
    assert line.startswith("loss 2.1234 at step 30, accuracy per step 0.61/0.42/0.30") and "/72" not in line
    st = StageStatus("train", "train", "running", progress=30 / 72, log=state, result_line=line)
    text = summary(st, 0.0).plain
    assert "done 30/72" in text
    assert [r[3] for r in bar_rows(st) if r[0] == "overall"] == ["41%"]      # 30/72, floored
