"""Fault battery 4 (issue 37), the runs' and actions' items: a worker that
survives `stop` outside its group (M2), an interrupted stop (Q67), clean
interrupted right after its `started` record (Q68), a forged exit record
(Q72), a watch whose first pass meets a bad pipeline file (Q73), and the
minor items (events' folding and target count, watch's repeated alerts,
`logs -f` on Ctrl-C, `run --dry-run`, a string for a numeric param, clean's
plan order). Real CLI processes, real signals, real SQLite; every process a
test starts is ended, also when it fails. Each test failed on the main
branch it was written against (961f033)."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.conftest import PY, extract_pipeline, stage_cmd, wait_for
from tests.procs import alive

# A stage whose worker leaves the stage's process group for a session of its
# own and ignores SIGTERM (as a daemonized data loader can): the leader exits
# on SIGTERM, the worker lives on. The worker's pid goes to argv[1]; it ends
# when argv[2] appears (the tests end it themselves too).
SETSID_WORKER = r"""
import os, signal, sys, time
pidfile, finish = sys.argv[1], sys.argv[2]
pid = os.fork()
if pid == 0:
    os.setsid()
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with open(pidfile + ".tmp", "w") as fh:
        fh.write(str(os.getpid()))
    os.rename(pidfile + ".tmp", pidfile)
    while not os.path.exists(finish):
        time.sleep(0.05)
    os._exit(0)
print("leader up", flush=True)
while not os.path.exists(finish):
    time.sleep(0.05)
"""

# A stage that says when SIGTERM reaches it, goes on, and exits 0 once argv[1] appears.
TERM_SAYER = r"""
import os, signal, sys, time
finish = sys.argv[1]
signal.signal(signal.SIGTERM, lambda *_: print("got SIGTERM, going on", flush=True))
print("up", flush=True)
while not os.path.exists(finish):
    time.sleep(0.05)
print("finished", flush=True)
"""


def _terminal_sigint():
    """SIGINT as a terminal's foreground job has it (a suite in the background ignores it)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _env() -> dict:
    e = dict(os.environ)
    e.pop("EAGLE3_WORKSPACE", None)
    e.pop("COLUMNS", None)
    return e


def _popen(ws, *args: str, **kw) -> subprocess.Popen:
    kw.setdefault("stdout", subprocess.PIPE)
    kw.setdefault("stderr", subprocess.PIPE)
    return subprocess.Popen([PY, "-m", "eagle3_console.cli", "-w", str(ws.root), *args], text=True, env=_env(),
                            cwd=str(ws.root), preexec_fn=_terminal_sigint, **kw)


def _end(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    try:
        proc.communicate(timeout=30)
    except (ValueError, subprocess.TimeoutExpired):
        pass


def _kill_pid(pid: int | None) -> None:
    if pid:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _events(ws, stage=None) -> list[dict]:
    args = ("events", "--json") + (("--stage", stage) if stage else ())
    return json.loads(ws.cli(*args, check=0).stdout)


@contextmanager
def _stage_cleanup(ws, *stages: str):
    """Ends what the tests' runs left: each stage's process group, and workers named in pidfiles."""
    pids: list[int] = []
    try:
        yield pids
    finally:
        for st in stages:
            r = ws.latest(st)
            if r is not None and r.pgid:
                try:
                    os.killpg(r.pgid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        for pid in pids:
            _kill_pid(pid)


# ------------------------------------------------------------------ M2
def test_stop_says_a_worker_survived_and_run_refuses_beside_it(ws, tmp_path):
    """Before: `stop` said `killed`, exit 0, over a worker in its own session that
    ignores SIGTERM, and `run` started a new run beside it (restart refused)."""
    script = tmp_path / "setsid_worker.py"
    script.write_text(SETSID_WORKER)
    pidfile, finish = tmp_path / "worker.pid", tmp_path / "finish"
    ws.write(f'[stages.w]\nargv = ["{PY}", "{script}", "{pidfile}", "{finish}"]\noutputs = ["out/w"]\n')
    with _stage_cleanup(ws, "w") as pids:
        ws.cli("run", "w", check=0)
        wait_for(pidfile.exists, timeout=30)
        worker = int(pidfile.read_text())
        pids.append(worker)
        stop = ws.cli("stop", "w", "--grace", "5")
        said = stop.stdout + stop.stderr
        assert stop.returncode == 2, said
        assert str(worker) in said and "kill-workers w" in said, said
        assert alive(worker)
        stop_events = [e for e in _events(ws, "w") if e["action"] == "stop"]
        assert stop_events and str(worker) in stop_events[0]["outcome"], stop_events
        first = ws.latest("w")
        assert first.status == "killed", first
        again = ws.cli("run", "w")
        said = again.stdout + again.stderr
        assert again.returncode == 2, said
        assert str(worker) in said and "kill-workers w" in said, said
        assert ws.latest("w").id == first.id, "a run was started beside the surviving worker"
        # kill-workers ends it; then the stage runs again.
        ws.cli("kill-workers", "w", "--yes", "--grace", "2", "--wait", "1", check=0)
        assert not alive(worker)
        finish.write_text("")
        ws.cli("run", "w", check=0)
        assert ws.latest("w").id == first.id + 1


# ------------------------------------------------------------------ Q67
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["int", "term"])
def test_an_interrupted_stop_is_recorded_and_said(ws, tmp_path, sig):
    """Before: Ctrl-C or SIGTERM on `stop` during its grace: exit 130, no line,
    no event; the run that then exited 0 was recorded killed with nothing to say why."""
    script = tmp_path / "term_sayer.py"
    script.write_text(TERM_SAYER)
    finish = tmp_path / "finish"
    ws.write(f'[stages.w]\nargv = ["{PY}", "{script}", "{finish}"]\noutputs = ["out/w"]\n')
    with _stage_cleanup(ws, "w"):
        ws.cli("run", "w", check=0)
        run = ws.wait_status("w", ("running",))
        wait_for(lambda: "up" in Path(run.log_path).read_text(), timeout=30)
        stop = _popen(ws, "stop", "w", "--grace", "300")
        try:
            # The stop is in its grace once the stage got its SIGTERM.
            wait_for(lambda: "got SIGTERM" in Path(run.log_path).read_text(), timeout=30)
            stop.send_signal(sig)
            out, err = stop.communicate(timeout=30)
        finally:
            _end(stop)
        name = signal.Signals(sig).name
        assert stop.returncode == 128 + sig, (stop.returncode, out, err)
        assert f"stop w: interrupted by {name}" in err and "SIGKILL was not sent" in err, err
        assert "Traceback" not in err, err
        stops = [e for e in _events(ws, "w") if e["action"] == "stop"]
        assert stops and stops[0]["outcome"] == f"interrupted: {name}", stops
        assert "SIGTERM sent" in stops[0]["detail"] and "still alive" in stops[0]["detail"], stops
        assert ws.latest("w").live, "the interrupted stop ended the run"
        finish.write_text("")
        done = ws.wait_status("w", ("killed", "succeeded", "failed"))
        # It got the stop's SIGTERM: an exit 0 after it is not trusted as finished work, and says why.
        assert done.status == "killed" and "after the stop signal" in done.reason, done


# ------------------------------------------------------------------ Q68
def test_sigint_right_after_cleans_started_record_is_recorded(ws):
    """Before: the handlers were installed after the `started` record was
    committed: a SIGINT at that moment left `started` with no end and said nothing
    (1 of 2 tries). Real signals from another process, a few tries: every
    instruction of the stretch after the record is interrupted by the test below
    (which found the window this test hit once in CI at the 16th try of 20)."""
    ws.write('[stages.w]\nargv = ["bash", "-c", "exit 1"]\noutputs = ["out/w"]\n')
    ws.cli("run", "w", check=0)
    ws.wait_status("w", ("failed",))
    db = ws.root / ".eagle3" / "state.db"
    import sqlite3
    for attempt in range(8):
        out = ws.root / "out" / "w" / "d"
        out.mkdir(parents=True, exist_ok=True)
        for i in range(500):
            (out / f"p_{attempt}_{i:05d}.bin").write_bytes(b"p")
        with sqlite3.connect(db) as c:
            last = c.execute("select coalesce(max(id), 0) from events").fetchone()[0]
        proc = _popen(ws, "clean", "w", "--yes")
        try:
            ro = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
            try:
                def started():
                    return ro.execute("select 1 from events where id > ? and action = 'clean'",
                                      (last,)).fetchall() or proc.poll() is not None
                wait_for(started, timeout=60, poll=0.001)
            finally:
                ro.close()
            proc.send_signal(signal.SIGINT)
            _o, err = proc.communicate(timeout=60)
        finally:
            _end(proc)
        cleans = [e for e in _events(ws, "w") if e["action"] == "clean"]
        assert cleans[0]["outcome"] != "started", (attempt, cleans[:2], proc.returncode, err)
        if proc.returncode == 130:
            assert cleans[0]["outcome"] == "interrupted: SIGINT", cleans[:2]
            assert "clean w: interrupted by SIGINT" in err, err
        assert "Traceback" not in err, err


def _interrupt_at(n: int, exc: BaseException):
    """A tracer that raises `exc` at the n-th bytecode instruction run after
    clean's `started` record was written and before execute_clean begins, as a
    signal's handler raises at the instruction where the interpreter runs it
    (Python runs handlers between instructions). Returns the tracer's state
    (`fired`: whether it raised) and the Registry.record that arms it.
    Instruction by instruction, so no window between the record and the action
    is left to a race."""
    import sys

    from eagle3_console.kernel.registry import Registry
    state = {"armed": False, "count": 0, "fired": False}

    def tracer(frame, event, _arg):
        if not state["armed"]:
            return None
        if event == "call" and frame.f_code.co_name == "execute_clean":
            state["armed"] = False      # the action began: its own interruptions are Q68's real-signal test
            sys.settrace(None)
            return None
        frame.f_trace_opcodes = True
        if event == "opcode":
            if state["count"] == n:
                state["armed"], state["fired"] = False, True
                sys.settrace(None)
                raise exc
            state["count"] += 1
        return tracer

    real = Registry.record

    def record(self, action, outcome, *a, **kw):
        real(self, action, outcome, *a, **kw)
        if action == "clean" and outcome == "started" and not state["fired"]:
            state["armed"] = True
            f = sys._getframe(0)
            while f is not None:        # the frames already running: from here up to the CLI
                f.f_trace, f.f_trace_opcodes = tracer, True
                f = f.f_back
            sys.settrace(tracer)
    return state, record


@pytest.mark.parametrize("exc", [KeyboardInterrupt(), "SIGTERM"], ids=["int", "term"])
def test_an_interruption_at_any_instruction_after_started_gets_its_end(ws, monkeypatch, exc):
    """Before (CI at 82d191b, 1 in 16 tries of the test above): a SIGINT handled
    right after the `started` record, when recorded()'s generator had yielded
    and contextlib's __enter__ had not returned, escaped the context manager:
    typer's silent exit 130, `started` with no end. Every instruction of that
    stretch is interrupted here, one run each."""
    import sys

    from eagle3_console.kernel.interrupts import Signalled
    from eagle3_console.kernel.registry import Registry
    if exc == "SIGTERM":
        exc = Signalled(signal.SIGTERM)
    name = "SIGINT" if isinstance(exc, KeyboardInterrupt) else "SIGTERM"
    ws.write('[stages.w]\nargv = ["bash", "-c", "exit 1"]\noutputs = ["out/w"]\n')
    ws.cli("run", "w", check=0)
    ws.wait_status("w", ("failed",))
    n = 0
    try:
        while True:
            out = ws.root / "out" / "w" / "d"
            out.mkdir(parents=True, exist_ok=True)
            (out / f"p_{n:05d}.bin").write_bytes(b"p")
            state, record = _interrupt_at(n, exc)
            # Its own context: undo() would also take back the test token that conftest set.
            with monkeypatch.context() as patched:
                patched.setattr(Registry, "record", record)
                try:
                    proc = ws.call("clean", "w", "--yes")
                finally:
                    sys.settrace(None)
            with ws.registry() as reg:
                cleans = [(e.outcome, e.detail) for e in reg.events("w", 4) if e.action == "clean"]
            assert cleans[0][0] != "started", (n, cleans[:2], proc.returncode, proc.stderr)
            if not state["fired"]:
                break       # n passed the last instruction before the action: every one was tried
            assert proc.returncode == 128 + signal.Signals[name], (n, proc.returncode, proc.stderr)
            assert cleans[0][0] == f"interrupted: {name}", (n, cleans[:2])
            assert f"clean w: interrupted by {name}" in proc.stderr, (n, proc.stderr)
            n += 1
    finally:
        sys.settrace(None)
    assert n > 5, n     # the stretch was there to interrupt


# ------------------------------------------------------------------ Q72
def test_a_forged_exit_record_of_a_live_run_is_not_trusted(ws, tmp_path):
    """Before: status showed `succeeded, exit 0` for a run whose stage still ran."""
    script = tmp_path / "term_sayer.py"
    script.write_text(TERM_SAYER)
    finish = tmp_path / "finish"
    ws.write(f'[stages.w]\nargv = ["{PY}", "{script}", "{finish}"]\noutputs = ["out/w"]\n')
    with _stage_cleanup(ws, "w"):
        ws.cli("run", "w", check=0)
        run = ws.wait_status("w", ("running",))
        forged = json.dumps({"status": "succeeded", "exit_code": 0, "ended": time.time()}).encode()
        with open(Path(run.log_path).with_suffix(".exit"), "r+b") as fh:
            fh.write(forged + b" " * (1024 - len(forged)))
        # With an error too (what a supervisor that could not write state.db leaves): still not trusted.
        snap = json.loads(ws.call("status", "--json", "--no-gpus").stdout)
        st = next(s for s in snap["stages"] if s["name"] == "w")
        assert st["status"] == "running", st
        forged = json.dumps({"status": "succeeded", "exit_code": 0, "ended": time.time(),
                             "error": "state.db: disk full"}).encode()
        with open(Path(run.log_path).with_suffix(".exit"), "r+b") as fh:
            fh.write(forged + b" " * (1024 - len(forged)))
        ws.call("runs", "--json", check=0)          # reconciles
        snap = json.loads(ws.call("status", "--json", "--no-gpus").stdout)
        st = next(s for s in snap["stages"] if s["name"] == "w")
        assert st["status"] == "running", st
        assert ws.latest("w").live
        finish.write_text("")
        assert ws.wait_status("w", ("succeeded", "failed", "killed", "lost")).status == "succeeded"


# ------------------------------------------------------------------ Q73
class _Lines:
    """A process's stdout, line by line, read by a thread (no fixed waits)."""

    def __init__(self, proc: subprocess.Popen):
        self.q: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, args=(proc.stdout,), daemon=True).start()

    def _read(self, fh) -> None:
        for line in fh:
            self.q.put(line)

    def wait(self, text: str, timeout: float = 60) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.q.get(timeout=0.1)
            except queue.Empty:
                continue
            self.seen.append(line)
            if text in line:
                return line
        raise AssertionError(f"{text!r} not said within {timeout} s: {self.seen}")


def test_a_watch_whose_first_pass_meets_a_bad_pipeline_file_retries(ws):
    """Before: exit 3 at once; nothing supervised the pipeline from then on."""
    (ws.root / "eagle3.toml").write_text("garbage [[[")
    watch = _popen(ws, "watch", "--interval", "0.2", "--no-gpus")
    try:
        lines = _Lines(watch)
        said = lines.wait("pass skipped")
        assert "eagle3.toml" in said, said
        assert watch.poll() is None
        ws.write('[stages.a]\nargv = ["true"]\n')
        lines.wait("passes resumed")
        assert watch.poll() is None
        assert sum("pass skipped" in x for x in lines.seen) == 1, lines.seen    # said once, not each pass
    finally:
        _end(watch)
    # cron's one pass still says it and exits 3.
    (ws.root / "eagle3.toml").write_text("garbage [[[")
    assert ws.cli("watch", "--once", "--no-gpus").returncode == 3


# ------------------------------------------------------------------ minors
def test_events_fold_repeated_refusals_of_different_processes(ws, tmp_path):
    """Before: each cron pass is another process, so another actor: nothing folded."""
    ws.write(f'[stages.s]\nargv = {stage_cmd("sleeper.py", "--seconds", "120")}\n')
    with _stage_cleanup(ws, "s"):
        ws.cli("run", "s", check=0)
        for _ in range(3):
            assert ws.cli("run", "s").returncode == 2
        events = _events(ws, "s")
        refused = [e for e in events if e["outcome"].startswith("refused")]
        assert len(refused) == 1 and refused[0]["repeats"] == 3, events
        ws.cli("stop", "s", "--grace", "2", check=0)


def test_events_count_one_target_for_a_run(ws):
    """Before: a `run`'s target count was its argv's word count."""
    ws.write('[stages.a]\nargv = ["bash", "-c", "exit 0", "x", "y"]\n')
    ws.cli("run", "a", check=0)
    ws.wait_status("a", ("succeeded",))
    table = ws.call("events", check=0).stdout
    row = next(line for line in table.splitlines() if " run " in line and "│" in line)
    cells = [c.strip() for c in row.split("│")]
    assert "1" == cells[8], (cells, table)      # the "n targets" column
    ev = next(e for e in _events(ws) if e["action"] == "run")
    assert len(ev["targets"]) == 1 and ev["targets"][0]["run"] == ws.latest("a").id, ev
    assert ev["targets"][0]["argv"] == ["bash", "-c", "exit 0", "x", "y"], ev


def test_a_long_watch_says_an_unchanged_alert_once(ws):
    """Before: every pass repeated every alert (a day of 30 s passes: 2,880 lines of one failure)."""
    ws.write('[stages.a]\nargv = ["bash", "-c", "exit 1"]\n[stages.b]\nargv = ["bash", "-c", "exit 1"]\n')
    ws.cli("run", "a", check=0)
    ws.wait_status("a", ("failed",))
    watch = _popen(ws, "watch", "--interval", "0.1", "--no-gpus")
    try:
        lines = _Lines(watch)
        lines.wait("a failed")
        # b fails while the watch runs: passes went on between the two (each pass said every alert before).
        ws.cli("run", "b", check=0)
        lines.wait("b failed")
        assert sum("a failed" in x for x in lines.seen) == 1, lines.seen
        # An alert that clears is said once, as cleared.
        ws.write('[stages.b]\nargv = ["bash", "-c", "exit 1"]\n')
        said = lines.wait("cleared:")
        assert "a failed" in said, said
    finally:
        _end(watch)


def test_ctrl_c_on_logs_follow_exits_130(ws):
    """Before: Ctrl-C on `logs -f` exited 0, as if the run had succeeded."""
    ws.write(f'[stages.s]\nargv = {stage_cmd("sleeper.py", "--seconds", "120")}\n')
    with _stage_cleanup(ws, "s"):
        ws.cli("run", "s", check=0)
        run = ws.wait_status("s", ("running",))
        wait_for(lambda: "sleeping" in Path(run.log_path).read_text(), timeout=30)
        logs = _popen(ws, "logs", "s", "-f")
        try:
            lines = _Lines(logs)
            lines.wait("sleeping")
            # A line written after the tail: once it shows, the follow is under way.
            with open(run.log_path, "a") as fh:
                fh.write("marker for the follow\n")
            lines.wait("marker for the follow")
            logs.send_signal(signal.SIGINT)
            logs.wait(timeout=30)
        finally:
            _end(logs)
        assert logs.returncode == 130
        ws.cli("stop", "s", "--grace", "2", check=0)


def test_run_dry_run_prints_the_plan_and_launches_nothing(ws):
    ws.write('[stages.a]\nargv = ["bash", "-c", "touch started"]\noutputs = ["out/a"]\n')
    proc = ws.cli("run", "a", "--dry-run", check=0)
    assert "argv: bash -c touch started" in proc.stdout, proc.stdout
    assert "dry run" in proc.stdout, proc.stdout
    assert ws.latest("a") is None
    assert not (ws.root / "started").exists()
    assert not any(e["action"] == "run" for e in _events(ws))


def test_a_string_for_a_numeric_param_is_refused_with_its_key(ws):
    """Before: `tp = "8"` in the pipeline file was accepted as the string it is."""
    ws.write(extract_pipeline(', tp = "8"'))
    proc = ws.cli("run", "extract")
    assert proc.returncode == 3, (proc.stdout, proc.stderr)
    assert "stages.extract: param tp" in proc.stderr and "'8'" in proc.stderr, proc.stderr
    assert ws.latest("extract") is None
    proc = ws.cli("run", "extract", "--set", 'tp="2"')
    assert proc.returncode == 3 and "param tp" in proc.stderr, proc.stderr


def test_cleans_plan_is_sorted(ws):
    """Before: the plan listed the files in the directory's order."""
    ws.write('[stages.w]\nargv = ["bash", "-c", "exit 1"]\noutputs = ["out/w"]\n')
    ws.cli("run", "w", check=0)
    ws.wait_status("w", ("failed",))
    out = ws.root / "out" / "w"
    names = [f"f{i:03d}.bin" for i in range(60)]
    for sub in ("zz", "aa", "mm"):
        (out / sub).mkdir(parents=True, exist_ok=True)
        for name in reversed(names):
            (out / sub / name).write_bytes(b"x")
    plan = ws.cli("clean", "w", check=0).stdout
    listed = [line.split()[-1] for line in plan.splitlines() if line.startswith("  ") and "/out/w/" in line]
    assert len(listed) == 40 and listed == sorted(listed), listed
    assert listed[0].endswith("aa/f000.bin"), listed
