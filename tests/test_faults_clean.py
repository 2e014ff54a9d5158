"""Fault injection on `clean` and the registry: the hostile-operator trial of
issue 19 (items 1, 3, 4, 7, 14, 17, 20), played end to end with the real CLI
(in subprocesses where processes race or a run starts; its reads and refusals in this process), real files, symlinks swapped by another process, two
workspaces sharing one output. Each test failed on the main branch it was
written against (see each docstring)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from tests.conftest import PY, WS, stage_cmd, wait_for
from tests.procs import alive

LOCK = ".eagle3-lock"


def _env() -> dict:
    e = dict(os.environ)
    e.pop("EAGLE3_WORKSPACE", None)
    return e


def _cli(ws_root: Path, *args: str, cwd: Path | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", "eagle3_console.cli", "-w", str(ws_root), *args], capture_output=True,
                          text=True, timeout=timeout, env=_env(), cwd=str(cwd or ws_root))


def _digest(root: Path, skip: tuple[str, ...] = ()) -> dict[str, str]:
    """Every file and link under root (not followed) with its content's hash."""
    out = {}
    for dirpath, dirs, names in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        if any(rel_dir == s or rel_dir.startswith(s + os.sep) for s in skip):
            dirs[:] = []
            continue
        for name in names + [d for d in dirs if os.path.islink(os.path.join(dirpath, d))]:
            p = os.path.join(dirpath, name)
            rel = os.path.normpath(os.path.join(rel_dir, name))
            if os.path.islink(p):
                out[rel] = "link:" + os.readlink(p)
            else:
                with open(p, "rb") as fh:
                    out[rel] = hashlib.sha256(fh.read()).hexdigest()
    return out


def _touched(before: dict[str, str], after: dict[str, str]) -> int:
    """Files changed, gone or new."""
    return sum(1 for k in before.keys() | after.keys() if before.get(k) != after.get(k))


def writer_stage(out: str, n: int = 10, **params) -> str:
    """A custom stage `w` running tests/stages/writer.py with these params (`until`: a file
    whose creation ends the run once its files are written)."""
    defaults = {"prefix": "f", "n": n, "every": 0.0, "skew": 0.0, "code": 0, "sub": "", "until": ""}
    defaults.update(params)
    argv = stage_cmd("writer.py", "--output", out, "--sub={sub}", "--n", "{n}", "--prefix", "{prefix}",
                     "--every", "{every}", "--skew-s", "{skew}", "--exit", "{code}", "--until={until}")
    table = ", ".join(f"{k} = {json.dumps(v)}" for k, v in defaults.items())
    return f"[stages.w]\nargv = {argv}\nparams = {{ {table} }}\noutputs = [{json.dumps(out)}]\n"


# ------------------------------------------------------------------ item 1: a path swapped during the walk
SWAPPER = r"""
import os, sys, time
sub, real, outside, stop, started = sys.argv[1:6]
# Swap the output's sub-folder for a symlink to a folder outside and back, holding
# each state 2 ms (the walk must meet both); `started` once the first round is done.
while not os.path.exists(stop):
    for step, hold in ((lambda: os.rename(sub, real), 0), (lambda: os.symlink(outside, sub), 0.002),
                       (lambda: os.unlink(sub), 0), (lambda: os.rename(real, sub), 0.002)):
        try:
            step()
        except OSError:
            pass
        time.sleep(hold)
    if not os.path.exists(started):
        open(started, "w").close()
if os.path.islink(sub):
    os.unlink(sub)
if os.path.isdir(real) and not os.path.exists(sub):
    os.rename(real, sub)
"""


@pytest.mark.parametrize("purge", [True, False], ids=["purge", "trash"])
def test_a_folder_swapped_for_a_symlink_while_clean_runs_touches_nothing_outside(tmp_path, purge):
    """Before: a loop swapping out/w/sub for a symlink to a folder outside while
    `clean w --yes [--purge]` ran: outside files deleted (or moved into the
    trash) in 6 of 6 tries: clean re-resolved each path string, through the
    symlink of the moment."""
    ws = WS(tmp_path / "ws")
    ws.root.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    n = 1000
    for i in range(n):
        (outside / f"f{i}.bin").write_bytes(b"precious %d" % i)
    ws.write(writer_stage("out/w", n=n, sub="sub", code=1))
    ws.cli("run", "w", check=0)
    ws.wait_status("w", ("failed",))
    before = _digest(outside)
    sub = ws.root / "out" / "w" / "sub"
    stop, started = tmp_path / "stop", tmp_path / "started"
    cleaned = 0
    for attempt in range(10):
        sub.mkdir(exist_ok=True)
        for i in range(n):
            (sub / f"f{i}.bin").write_bytes(b"partial")
        swapper = subprocess.Popen([PY, "-c", SWAPPER, str(sub), str(sub) + ".real", str(outside), str(stop),
                                    str(started)])
        try:
            # clean starts once the swapping has (not a fixed 0.2 s a loaded machine may spend starting python)
            wait_for(lambda: started.exists() or swapper.poll() is not None)
            # clean in this process: the race is its walk against the swapper's process, not its own start
            proc = ws.call("clean", "w", "--yes", *(["--purge"] if purge else []))
        finally:
            stop.touch()
            swapper.wait(timeout=30)
            stop.unlink()
            started.unlink(missing_ok=True)
        assert "Traceback" not in proc.stderr, proc.stderr
        assert not os.path.islink(sub)
        touched = _touched(before, _digest(outside))
        assert touched == 0, f"attempt {attempt}: {touched} file(s) outside the workspace touched; {proc.stdout[:300]}"
        cleaned += proc.stdout.count("cleaned")
    assert cleaned >= 1          # the files inside were cleaned all along


# ------------------------------------------------------------------ item 3: two workspaces, one output
def _lock(out: Path) -> dict | None:
    try:
        return json.loads((out / LOCK).read_text())
    except (OSError, ValueError):
        return None


def test_clean_refuses_an_output_that_another_workspaces_live_run_owns(tmp_path):
    """Before: A writing /shared/out, B (same output) failed, `-w B clean w
    --yes` moved A's A_2..A_9 into B's trash and A later succeeded without them."""
    shared = tmp_path / "shared" / "out"
    a, b = WS(tmp_path / "A"), WS(tmp_path / "B")
    a.root.mkdir()
    b.root.mkdir()
    # A lives until the test has seen B refused (the release file), not 5 s of writing.
    release = tmp_path / "release-A"
    a.write(writer_stage(str(shared), n=12, prefix="A_", until=str(release)))
    b.write(writer_stage(str(shared), n=1, prefix="B_", code=1))
    b.cli("run", "w", check=0)
    b.wait_status("w", ("failed",))
    a.cli("run", "w", check=0)
    run_a = a.wait_status("w", ("running",))
    # The lock names A's workspace and run (claimed once the output exists).
    lock = wait_for(lambda: _lock(shared))
    assert lock["workspace"] == str(a.root) and lock["run"] == run_a.id and lock["stage"] == "w", lock
    wait_for(lambda: (shared / "A_2.bin").exists())
    proc = b.call("clean", "w", "--yes")           # refusals: in this process
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "owned by" in proc.stdout and str(a.root) in proc.stdout and f"run {run_a.id}" in proc.stdout, proc.stdout
    # B may not start a second writer into it either.
    again = b.call("run", "w")
    assert again.returncode == 2 and str(a.root) in again.stdout + again.stderr, again.stdout + again.stderr
    assert a.latest("w").status == "running"       # the refusals above met A live
    release.touch()
    a.wait_status("w", ("succeeded",), timeout=60)
    assert sorted(p.name for p in shared.glob("A_*.bin")) == sorted(f"A_{i}.bin" for i in range(12))
    assert not (shared / LOCK).exists()          # released when A ended
    assert "owned by" not in b.call("clean", "w").stdout


SWAPS_ITS_OUTPUT = r"""
import os, shutil, sys, time
out = sys.argv[1]
os.makedirs(out)
while not os.path.exists(os.path.join(out, ".eagle3-lock")):   # until the supervisor claimed it
    time.sleep(0.05)
# What export does for one atomic switch: a new folder, then swapped in.
os.makedirs(out + ".new")
open(os.path.join(out + ".new", "model.bin"), "w").write("new")
os.rename(out, out + ".old")
os.rename(out + ".new", out)
shutil.rmtree(out + ".old")
open(os.path.join(out, "swapped"), "w").close()
time.sleep(600)                       # until the test stops it (or its teardown ends it)
"""


def test_an_output_swapped_by_its_stage_is_claimed_again(tmp_path):
    """Before: the lock lived in the folder the stage swapped away (export's
    atomic switch), so the new folder was nobody's and another workspace's
    clean or run was not refused for the rest of the run."""
    shared = tmp_path / "shared" / "out"
    a, b = WS(tmp_path / "A"), WS(tmp_path / "B")
    a.root.mkdir()
    b.root.mkdir()
    script = tmp_path / "swap.py"
    script.write_text(SWAPS_ITS_OUTPUT)
    a.write(f"[stages.w]\nargv = {json.dumps([PY, str(script), str(shared)])}\noutputs = [{json.dumps(str(shared))}]\n")
    b.write(writer_stage(str(shared), n=1, prefix="B_"))
    a.cli("run", "w", check=0)
    run_a = a.wait_status("w", ("running",))
    wait_for(lambda: (shared / "swapped").exists())
    lock = wait_for(lambda: _lock(shared), timeout=60)
    assert lock["workspace"] == str(a.root) and lock["run"] == run_a.id, lock
    again = b.call("run", "w")
    assert again.returncode == 2 and str(a.root) in again.stdout + again.stderr, again.stdout + again.stderr
    a.cli("stop", "w")


def test_a_lock_stays_live_while_the_stage_outlives_its_supervisor(tmp_path):
    """Liveness is the owner's pids with their create times, not only the
    supervisor's lock: kill -9 of A's supervisor leaves A's stage writing."""
    shared = tmp_path / "shared"
    a, b = WS(tmp_path / "A"), WS(tmp_path / "B")
    a.root.mkdir()
    b.root.mkdir()
    # A's stage lives until `release` (after the refusal), not a fixed 20 s of writing.
    release = tmp_path / "release-A"
    a.write(writer_stage(str(shared), n=3, prefix="A_", until=str(release)))
    b.write(writer_stage(str(shared), n=1, prefix="B_", code=1))
    b.cli("run", "w", check=0)
    b.wait_status("w", ("failed",))
    a.cli("run", "w", check=0)
    run_a = a.wait_status("w", ("running",))
    try:
        wait_for(lambda: _lock(shared))
        os.kill(run_a.supervisor_pid, signal.SIGKILL)
        wait_for(lambda: not alive(run_a.supervisor_pid))      # the supervisor gone, its stage alive
        proc = b.call("clean", "w", "--yes")
        assert proc.returncode == 2 and "owned by" in proc.stdout, proc.stdout + proc.stderr
    finally:
        release.touch()
    wait_for(lambda: not alive(run_a.pid))
    # Owner dead (a stale lock naming dead pids): no longer a reason to refuse.
    assert "owned by" not in b.call("clean", "w").stdout


def test_a_forged_lock_naming_a_reused_pid_is_not_live(tmp_path):
    shared = tmp_path / "shared"
    b = WS(tmp_path / "B")
    b.root.mkdir()
    b.write(writer_stage(str(shared), n=3, code=1))
    b.cli("run", "w", check=0)
    b.wait_status("w", ("failed",))
    # pid 1 lives, but not with this create time: a pid reused since.
    (shared / LOCK).write_text(json.dumps({"workspace": "/elsewhere", "registry": "x", "run": 7, "stage": "w",
                                           "host": os.uname().nodename, "pids": [[1, 12.0]]}))
    proc = b.call("clean", "w")
    assert proc.returncode == 0 and "3 partial file(s)" in proc.stdout, proc.stdout
    assert LOCK not in proc.stdout


# ------------------------------------------------------------------ item 4: clock skew
def test_files_of_an_earlier_succeeded_run_dated_ahead_are_not_partial(ws):
    """Before: files of a succeeded run dated +2 h (a file server's clock ahead)
    were listed and moved as partial of a later failed run: partial meant
    "newer than the run's start"."""
    ws.write(writer_stage("out/w", n=5, skew=7200.0))
    ws.cli("run", "w", check=0)
    ws.wait_status("w", ("succeeded",))
    ws.cli("run", "w", "--set", "prefix=g", "--set", "n=2", "--set", "code=1", check=0)
    ws.wait_status("w", ("failed",))
    plan = ws.call("clean", "w")
    assert plan.returncode == 0 and "2 partial file(s)" in plan.stdout, plan.stdout
    assert "g0.bin" in plan.stdout and "f0.bin" not in plan.stdout
    ws.cli("clean", "w", "--yes", check=0)
    out = ws.root / "out" / "w"
    assert sorted(p.name for p in out.glob("*.bin")) == [f"f{i}.bin" for i in range(5)]


def test_a_failed_run_whose_clock_ran_behind_leaves_the_succeeded_runs_files(ws):
    """Before: a run under `faketime -f -1h` recorded its start an hour early,
    and every file of the earlier succeeded run counted as written since."""
    ws.write(writer_stage("out/w", n=4))
    ws.cli("run", "w", check=0)
    ws.wait_status("w", ("succeeded",))
    ws.cli("run", "w", "--set", "prefix=g", "--set", "n=1", "--set", "code=1", check=0)
    failed = ws.wait_status("w", ("failed",))
    with ws.registry() as reg:      # what its supervisor's clock said
        reg.update(failed.id, created=failed.created - 3600, started=failed.started - 3600)
    plan = ws.call("clean", "w")
    assert plan.returncode == 0 and "1 partial file(s)" in plan.stdout and "g0.bin" in plan.stdout, plan.stdout
    assert "f0.bin" not in plan.stdout


def test_a_file_the_succeeded_run_wrote_and_a_failed_run_rewrote_is_partial(ws):
    ws.write(writer_stage("out/w", n=3))
    ws.cli("run", "w", check=0)
    ws.wait_status("w", ("succeeded",))
    ws.cli("run", "w", "--set", "n=1", "--set", "code=1", "--set", "skew=-7200.0", check=0)
    ws.wait_status("w", ("failed",))
    plan = ws.call("clean", "w")
    # f0.bin was rewritten by the failed run (dated two hours back): not the file the succeeded run vouched for.
    assert plan.returncode == 0 and "1 partial file(s)" in plan.stdout and "f0.bin" in plan.stdout, plan.stdout


# ------------------------------------------------------------------ item 7: stage names
@pytest.mark.parametrize("name", ["../../../../../x", "a/b", "..", ".", ".hidden", "-rf", "a b", "", "x" * 65])
def test_an_unsafe_stage_name_is_refused_at_load(tmp_path, name):
    """Before: `[stages."../../../../../x"]` with a lost run, then `clean --yes --
    NAME`, made a folder outside the workspace; `run a/b` said "pending, pid
    None", exit 0, and the run became lost."""
    ws = WS(tmp_path / "a" / "b" / "c" / "d" / "e" / "ws")
    ws.root.mkdir(parents=True)
    ws.write(f'[stages.{json.dumps(name)}]\nargv = ["false"]\noutputs = ["out/x"]\n')
    before = _digest(tmp_path, skip=(str(Path("a/b/c/d/e/ws/.eagle3")),))
    for args in (("status", "--no-gpus"), ("run", "--", name), ("clean", "--yes", "--", name)):
        proc = ws.call(*args)
        assert proc.returncode == 3, (args, proc.returncode, proc.stdout, proc.stderr)
        assert "Traceback" not in proc.stderr
        assert str(ws.root / "eagle3.toml") in proc.stderr and json.dumps(name) in proc.stderr, proc.stderr
        assert "stage name" in proc.stderr, proc.stderr
    assert _digest(tmp_path, skip=(str(Path("a/b/c/d/e/ws/.eagle3")),)) == before
    assert not [p for p in tmp_path.rglob("*") if p.is_dir() and ".eagle3" not in p.parts and "x" in p.name]


def test_safe_stage_names_still_load(ws):
    ws.write('[stages."bench-1.5_b"]\nargv = ["true"]\noutputs = ["out/x"]\n'
             '[stages._x]\nargv = ["true"]\ndepends_on = ["bench-1.5_b"]\n')
    proc = ws.call("status", "--no-gpus")
    assert proc.returncode != 3, proc.stderr


# ------------------------------------------------------------------ item 14: zero-byte state.db
def test_a_zero_byte_state_db_beside_its_id_is_reported_and_never_recreated(ws):
    """Before: the read created a new registry in the empty file, then said
    "replaced: holds registry <the id it just made>"."""
    ws.write('[stages.a]\nargv = ["true"]\noutputs = ["out/a"]\n')
    ws.cli("run", "a", check=0)
    ws.wait_status("a", ("succeeded",))
    state = ws.root / ".eagle3"
    registry = (state / "state.id").read_text().strip()
    for extra in ("state.db-wal", "state.db-shm"):
        (state / extra).unlink(missing_ok=True)
    (state / "state.db").write_bytes(b"")
    for args in (("status", "--no-gpus"), ("runs",), ("status", "--json", "--no-gpus"), ("run", "a"),
                 ("clean", "a")):
        proc = ws.call(*args)
        assert proc.returncode == 3, (args, proc.returncode, proc.stdout, proc.stderr)
        assert "Traceback" not in proc.stderr
        said = proc.stderr + proc.stdout
        assert "state.db" in said and registry in said and "empty" in said, said
        assert "holds registry" not in said, said
        assert (state / "state.db").stat().st_size == 0, args


# ------------------------------------------------------------------ item 17: parallel cleans
def test_the_losers_of_parallel_cleans_say_nothing_to_do_and_exit_0(ws):
    """Before: 4 parallel `clean w --yes` moved the files once, but the losers
    printed "refused: no partial files", exit 2 (README: nothing to do is 0).
    Six at once here, four rounds: on main every run of this test had losers exit 2."""
    ws.write(writer_stage("out/w", n=40, code=1))
    ws.cli("run", "w", check=0)
    ws.wait_status("w", ("failed",))
    out = ws.root / "out" / "w"
    for round_ in range(4):
        if round_:
            for i in range(40):
                (out / f"f{i}.bin").write_bytes(b"again %d" % round_)
        procs = [subprocess.Popen([PY, "-m", "eagle3_console.cli", "-w", str(ws.root), "clean", "w", "--yes"],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(), cwd=str(ws.root))
                 for _ in range(6)]
        outs = [p.communicate(timeout=120) for p in procs]
        codes = [p.returncode for p in procs]
        assert codes == [0] * 6, (round_, codes, outs)
        assert sum("cleaned 40 file(s)" in o for o, _e in outs) == 1, outs
        assert all("cleaned 40" in o or "\nnothing to do: " in "\n" + o for o, _e in outs), outs
        assert not list(out.glob("*.bin"))
    assert len(list((ws.root / ".eagle3" / "trash").rglob("*.bin"))) == 160


# ------------------------------------------------------------------ item 20: verify's report from another cwd
def test_clean_from_another_directory_lists_what_verify_reported(tmp_path, extraction):
    """Before: from another directory, `-w WS clean extract` after verify
    reported a bad sample refused "outputs complete" (the report's relative
    paths were resolved against the cwd); from inside WS it listed the file."""
    pytest.importorskip("torch")
    from ops.formats import sample_path

    ws = WS(tmp_path / "ws")
    ws.root.mkdir()
    _target, prepared, ref = extraction         # tests/conftest.py: made once a run, copied (damaged here)
    hs = ws.root / "data" / "hs"
    shutil.copytree(ref, hs)
    ws.write(f"""
[stages.extract]
op = "extract"
params = {{ input = "{prepared}", output = "data/hs" }}

[stages.verify]
op = "verify"
depends_on = ["extract"]
params = {{ input = "data/hs", report = "runs/verify.json" }}
""")
    ws.record_finished_run("extract", {"input": str(prepared), "output": "data/hs"}, status="succeeded")
    cut = sample_path(hs, 5)
    cut.write_bytes(cut.read_bytes()[:-7])
    ws.cli("run", "verify", check=0)
    ws.wait_status("verify", ("failed",), timeout=120)
    assert json.loads((ws.root / "runs" / "verify.json").read_text())["output"] == "data/hs"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    inside = _cli(ws.root, "clean", "extract")
    assert inside.returncode == 0 and str(cut) in inside.stdout, inside.stdout
    plan = _cli(ws.root, "clean", "extract", cwd=elsewhere)
    assert plan.returncode == 0 and str(cut) in plan.stdout and "verify" in plan.stdout, plan.stdout + plan.stderr
    done = _cli(ws.root, "clean", "extract", "--yes", cwd=elsewhere)
    assert done.returncode == 0 and "cleaned 1 file(s)" in done.stdout, done.stdout
    assert not cut.exists() and len(list((ws.root / ".eagle3" / "trash").rglob(cut.name))) == 1


def test_a_re_pointed_output_keeps_what_was_there_before_the_run_that_first_named_it(ws):
    """Issue 28 item 3, replayed after its fix: run 1 fails on data/important, the
    output is re-pointed to data/other (3 files there before any run) and run 2 fails
    there writing g0.bin. Before: run 1's start record, which names no data/other,
    counted as "the 3 files were absent", and clean moved them with g0.bin."""
    for i in range(5):
        (ws.root / "data" / "important").mkdir(parents=True, exist_ok=True)
        (ws.root / "data" / "important" / f"keep{i}.bin").write_bytes(b"k")
    for i in range(3):
        (ws.root / "data" / "other").mkdir(parents=True, exist_ok=True)
        (ws.root / "data" / "other" / f"old{i}.bin").write_bytes(b"o")
    ws.write(writer_stage("data/important", n=0, code=1))
    ws.cli("run", "w", check=0)
    ws.wait_status("w", ("failed",))
    ws.write(writer_stage("data/other", n=1, prefix="g", code=1))
    ws.cli("run", "w", check=0)
    ws.wait_status("w", ("failed",))
    plan = ws.call("clean", "w")
    assert plan.returncode == 0 and "1 partial file(s)" in plan.stdout and "g0.bin" in plan.stdout, plan.stdout
    ws.cli("clean", "w", "--yes", check=0)
    assert sorted(p.name for p in (ws.root / "data" / "other").iterdir()) == ["old0.bin", "old1.bin", "old2.bin"]
    assert len(list((ws.root / "data" / "important").iterdir())) == 5
