"""Fault injection: the hostile-operator trial of issue 8, played end to end.

Each test is one reproduction from that trial (real OS processes racing, real
files, a real SQLite database deleted or corrupted under a live run); each
failed on the main branch it was written against. A change that breaks a
guard fails here.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import EXPORT_PIPELINE, PY, ROOT, stage_cmd

SLEEPER = f"""
[stages.sleeper]
argv = {stage_cmd("sleeper.py", "--seconds", "{seconds}")}
params = {{ seconds = 30.0 }}
"""


def _env() -> dict:
    e = dict(os.environ)
    e.pop("EAGLE3_WORKSPACE", None)
    return e


def _cli_popen(ws, *args: str) -> subprocess.Popen:
    return subprocess.Popen([PY, "-m", "eagle3_console.cli", "-w", str(ws.root), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(),
                            cwd=str(ws.root))


# What the TUI's `s` key does (app.action_start): runs.launch in its own process.
TUI_START = """
import sys
from eagle3_console import runs
from eagle3_console.kernel import config as cfg
from eagle3_console.kernel.workspace import Workspace
ws = Workspace.at(sys.argv[1])
try:
    r = runs.launch(ws, cfg.load(ws.config_path), sys.argv[2])
    print("started", r.id)
except runs.Refused as exc:
    print("refused", exc)
"""


def _stop_all(ws, stage: str) -> None:
    with ws.registry() as reg:
        for r in reg.runs(stage, limit=100):
            if r.pgid and r.status in ("pending", "running"):
                try:
                    os.killpg(r.pgid, 9)
                except ProcessLookupError:
                    pass


# ------------------------------------------------------------------ 1. one live run per stage
@pytest.mark.slow
def test_concurrent_launchers_start_exactly_one_run(ws):
    """8 `run`s, 2 `watch --advance --once` and 2 TUI-style launches of one
    stage at once, three rounds: each round starts exactly one run."""
    ws.write(SLEEPER)
    for round_ in range(3):
        procs = [_cli_popen(ws, "run", "sleeper") for _ in range(8)]
        procs += [_cli_popen(ws, "watch", "--advance", "--once", "--no-gpus") for _ in range(2)]
        procs += [subprocess.Popen([PY, "-c", TUI_START, str(ws.root), "sleeper"], stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True, env=_env(), cwd=str(ROOT))
                  for _ in range(2)]
        outs = [p.communicate(timeout=120) for p in procs]
        for p, (o, e) in zip(procs, outs):
            assert "Traceback" not in e, e
        with ws.registry() as reg:
            live = [r for r in reg.runs("sleeper", limit=100) if r.status in ("pending", "running")]
        assert len(live) == 1, (round_, [(r.id, r.status) for r in live], outs)
        refused = sum(1 for p in procs[:8] if p.returncode == 2)
        started = sum(1 for p in procs[:8] if p.returncode == 0)
        assert started + refused == 8 and started <= 1
        _stop_all(ws, "sleeper")
        ws.wait_status("sleeper", ("failed", "killed"))
        # watch would otherwise count the failure of the killed runs
        ws.write(SLEEPER)


# ------------------------------------------------------------------ 2. clean stays inside outputs
CUSTOM_OUT = """
[stages.writer]
argv = ["python", "-c", "import sys; sys.exit(1)"]
outputs = [{out!r}]
"""


def _tree_digest(root: Path) -> dict[str, str]:
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file():
            out[str(p.relative_to(root))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def test_output_climbing_out_of_the_workspace_is_normalised_and_cleaned_in_place(ws, tmp_path):
    outside = tmp_path / "outside"
    (outside / "decoy").mkdir(parents=True)
    (outside / "keep.txt").write_text("not ours")
    root = tmp_path / "w" / "a" / "b"
    root.mkdir(parents=True)
    ws.root = root
    # `out/../../../../outside/decoy` from w/a/b is tmp_path/outside/decoy
    ws.write(CUSTOM_OUT.format(out="out/../../../../outside/decoy"))
    ws.cli("run", "writer", check=0)
    ws.wait_status("writer", ("failed",))
    (outside / "decoy" / "partial.tmp").write_text("x")
    before = _tree_digest(tmp_path)
    plan = ws.cli("clean", "writer")
    assert str(outside / "decoy" / "partial.tmp") in plan.stdout, plan.stdout
    ws.cli("clean", "writer", "--yes", check=0)
    after = _tree_digest(tmp_path)
    # The console's own state (its database, logs, cache) changes; trash is compared.
    state = "w/a/b/.eagle3/"
    before = {k: v for k, v in before.items() if not k.startswith(state)}
    after = {k: v for k, v in after.items() if not k.startswith(state) or k.startswith(state + "trash/")}
    moved = {k for k in before if k not in after}
    assert moved == {"outside/decoy/partial.tmp"}
    new = {k for k in after if k not in before}
    # The moved file sits in the workspace's trash and nowhere else.
    assert len(new) == 1 and new.pop().startswith("w/a/b/.eagle3/trash/")
    assert all(after[k] == before[k] for k in before if k in after)


def test_trash_never_overwrites_between_two_cleans(ws):
    ws.write(CUSTOM_OUT.format(out="out/x/../../../decoy/d3"))
    ws.cli("run", "writer", check=0)
    ws.wait_status("writer", ("failed",))
    d3 = ws.root.parent / "decoy" / "d3"
    d3.mkdir(parents=True, exist_ok=True)
    (d3 / "f.tmp").write_text("first")
    ws.cli("clean", "writer", "--yes", check=0)
    (d3 / "f.tmp").write_text("second")
    ws.cli("clean", "writer", "--yes", check=0)
    trashed = sorted((ws.root / ".eagle3" / "trash").rglob("f.tmp"))
    assert sorted(p.read_text() for p in trashed) == ["first", "second"]


@pytest.mark.parametrize("out", [".", "./", "x/..", ".eagle3", ".eagle3/logs", "..", "/"])
def test_an_output_that_is_the_workspace_or_holds_its_state_is_refused(ws, out):
    ws.write(CUSTOM_OUT.format(out=out))
    proc = ws.call("status", "--no-gpus")
    assert proc.returncode == 3, (proc.stdout, proc.stderr)
    assert "stages.writer.outputs" in proc.stderr and "Traceback" not in proc.stderr


def test_outputs_on_other_disks_stay_allowed(ws, tmp_path):
    other = tmp_path.parent / (tmp_path.name + "-data") / "hs"
    ws.write(CUSTOM_OUT.format(out=str(other)))
    ws.call("status", "--no-gpus", check=0)


def test_run_set_output_is_normalised_too(ws):
    ws.write("""
[stages.extract]
op = "extract"
params = { input = "data/prepared", output = "data/hs" }
""")
    proc = ws.cli("run", "extract", "--force", "--set", "output=data/../.eagle3")
    assert proc.returncode == 3 and ".eagle3" in proc.stderr, (proc.stdout, proc.stderr)


# ------------------------------------------------------------------ 3. watch and a lost run
def test_until_done_waits_for_a_lost_run_whose_processes_live(ws):
    """The supervisor dies (kill -9) while the stage goes on: watch --until-done
    keeps watching until the stage's processes end, not "settled: first lost"."""
    ws.write(f"""
[stages.first]
argv = {stage_cmd("sleeper.py", "--seconds", "4")}
[stages.second]
argv = {stage_cmd("sleeper.py", "--seconds", "0.1")}
depends_on = ["first"]
""")
    ws.cli("run", "first", check=0)
    run = ws.wait_status("first", ("running",))
    os.kill(run.supervisor_pid, 9)
    from eagle3_console.monitor.procs import process_alive
    watch = _cli_popen(ws, "watch", "--advance", "--until-done", "--interval", "0.3", "--no-gpus")
    stage_ended = watch_ended = None
    deadline = time.time() + 60
    while watch_ended is None and time.time() < deadline:
        if stage_ended is None and not process_alive(run.pid, run.create_time):
            stage_ended = time.time()
        if watch.poll() is not None:
            watch_ended = time.time()
        time.sleep(0.05)
    out, err = watch.communicate(timeout=30)
    assert "Traceback" not in err, err
    assert stage_ended is not None and watch_ended >= stage_ended, out
    assert "pipeline settled" in out and "first lost" in out, out


def test_a_lost_op_run_with_complete_outputs_counts_as_done_for_dependents(ws):
    """Its processes ended; its record (written once at its end, after its start)
    says complete: dependents may start, and the policies do not restart it."""
    from eagle3_console import runs
    from eagle3_console.kernel import config as cfg
    from eagle3_console.actions import policy
    from eagle3_console.observe.snapshot import Collector
    from eagle3_console.kernel.workspace import Workspace
    ws.write(EXPORT_PIPELINE + """
[stages.after]
argv = ["true"]
depends_on = ["export"]
""")
    w = Workspace(ws.root)
    w.ensure_state()
    with ws.registry() as reg:
        run = reg.create_run("export", ["x"], {"checkpoint": "out/ckpt", "output": "out/export"}, {},
                             str(ws.root), lambda rid: w.log_path(rid, "export"))
        reg.update(run.id, status="running", started=time.time() - 5, supervisor_pid=999_999_999,
                   supervisor_create_time=1.0, pid=999_999_998, create_time=1.0)
    pipe = cfg.load(w.config_path)
    col = Collector(w, gpus=False)
    snap = col.collect()
    assert snap.stage("export").status == "lost" and snap.stage("export").outputs_complete is False
    assert policy.ready(pipe, snap) == []
    (ws.root / "out" / "export").mkdir(parents=True)
    (ws.root / "out" / "export" / "export_info.json").write_text('{"format": "sglang"}')
    snap = col.collect()
    assert snap.stage("export").outputs_complete is True
    assert policy.ready(pipe, snap) == ["after"]
    with ws.registry() as reg:
        assert policy.decide(pipe, snap, reg, time.time()) == []
        runs.check_can_start(reg, pipe, pipe.stages["after"], force=False, ws=w)


# ------------------------------------------------------------------ 4. concurrent status
@pytest.mark.slow
def test_parallel_status_calls_never_crash_and_watch_survives(ws):
    ws.write(SLEEPER)
    watch = _cli_popen(ws, "watch", "--interval", "0.05", "--no-gpus")
    loop = (f"for i in $(seq 12); do {PY} -m eagle3_console.cli -w {ws.root} status --json --no-gpus "
            f">/dev/null 2>>{ws.root}/err.txt || echo rc=$? >> {ws.root}/rc.txt; done")
    loops = [subprocess.Popen(["bash", "-c", loop], env=_env()) for _ in range(6)]
    for p in loops:
        p.wait(timeout=300)
    assert watch.poll() is None, watch.communicate()
    watch.terminate()
    watch.communicate(timeout=30)
    err = (ws.root / "err.txt").read_text() if (ws.root / "err.txt").exists() else ""
    assert "Traceback" not in err and not (ws.root / "rc.txt").exists(), err
    assert not list((ws.root / ".eagle3" / "cache").glob("*.tmp*"))


def _cli_read_only(ws, ro: Path, *args: str) -> subprocess.CompletedProcess:
    """The CLI with `ro` on a read-only filesystem: a read-only bind mount in a
    mount namespace of its own when we are root (chmod does not stop root),
    else chmod 0500."""
    cmd = [PY, "-m", "eagle3_console.cli", "-w", str(ws.root), *args]
    if os.geteuid() == 0:
        if subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode != 0:
            pytest.skip("root without mount namespaces: no way to make a folder read-only here")
        script = f'mount --bind "{ro}" "{ro}" && mount -o remount,ro,bind "{ro}" && exec "$@"'
        return subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh", *cmd],
                              capture_output=True, text=True, timeout=60, env=_env(), cwd=str(ws.root))
    os.chmod(ro, 0o500)
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=_env(), cwd=str(ws.root))
    finally:
        os.chmod(ro, 0o700)


def test_read_only_cache_degrades_to_no_cache(ws):
    ws.write(SLEEPER)
    ws.call("status", "--no-gpus", check=0)
    proc = _cli_read_only(ws, ws.root / ".eagle3" / "cache", "status", "--json", "--no-gpus")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["stages"][0]["name"] == "sleeper"


# ------------------------------------------------------------------ 5. state.db vanishing
def test_deleted_state_db_under_a_live_run_is_noticed(ws):
    ws.write(SLEEPER)
    ws.cli("run", "sleeper", check=0)
    run = ws.wait_status("sleeper", ("running",))
    log = Path(run.log_path)
    for suffix in ("", "-wal", "-shm"):
        p = ws.root / ".eagle3" / f"state.db{suffix}"
        if p.exists():
            p.unlink()
    try:
        status = ws.call("status", "--no-gpus")
        assert status.returncode == 3, (status.stdout, status.stderr)
        assert "state.db" in status.stderr and "Traceback" not in status.stderr
        again = ws.cli("run", "sleeper")
        assert again.returncode == 3, (again.stdout, again.stderr)
        assert not (ws.root / ".eagle3" / "state.db").exists() or ws.latest("sleeper") is None
        # The operator starts a new registry on purpose: the live stage is an orphan that blocks a run.
        (ws.root / ".eagle3" / "state.id").rename(ws.root / ".eagle3" / "state.id.old")
        status = ws.call("status", "--json", "--no-gpus")
        snap = json.loads(status.stdout)
        codes = [a["code"] for a in snap["alerts"]]
        assert "orphan_workers" in codes, snap["alerts"]
        blocked = ws.cli("run", "sleeper")
        assert blocked.returncode == 2 and str(run.pid) in blocked.stderr, (blocked.stdout, blocked.stderr)
        assert ws.latest("sleeper") is None
    finally:
        os.killpg(run.pgid, 9)
    assert log.exists()


def test_log_files_are_never_reused(ws):
    from eagle3_console.kernel.workspace import Workspace
    ws.write(SLEEPER)
    w = Workspace(ws.root)
    w.ensure_state()
    stale = w.log_path(1, "sleeper")
    stale.write_text("an older registry's run 1\n")
    ws.cli("run", "sleeper", "--set", "seconds=0.1", check=0)
    run = ws.wait_status("sleeper", ("succeeded",))
    assert Path(run.log_path) != stale
    assert stale.read_text() == "an older registry's run 1\n"


# ------------------------------------------------------------------ 8. preflight counts what is written
def test_disk_preflight_compares_what_remains(ws, tmp_path):
    from eagle3_console.monitor.disk import free_space
    out = ws.root / "out"
    out.mkdir()
    (out / "written.bin").write_bytes(b"\0" * (64 << 20))
    free, _ = free_space(str(out))
    # Needs all the free space plus 32 MiB, of which 64 MiB are already written: fits (with 32 MiB
    # to spare for what the other test workers write on this disk meanwhile).
    ws.write(CUSTOM_OUT.format(out="out").replace('sys.exit(1)', 'sys.exit(0)')
             + f"estimate_bytes = {free + (32 << 20)}\n")
    proc = ws.cli("run", "writer")
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    ws.wait_status("writer", ("succeeded",))
    ws.write(CUSTOM_OUT.format(out="out") + f"estimate_bytes = {free + (1 << 30)}\n")
    proc = ws.cli("run", "writer")
    assert proc.returncode == 2
    # No amount said as 0.0 GiB (what is written is 64 MiB); a free space of 40.0 GiB is not one.
    assert "MiB" in proc.stderr and not re.search(r"(?<![\d.])0\.0 GiB", proc.stderr), proc.stderr


# ------------------------------------------------------------------ 9. exit 3, never a traceback
def test_non_utf8_pipeline_file_exits_3(ws):
    (ws.root / "eagle3.toml").write_bytes(b"[stages.a]\nargv = [\"echo\", \"\xff\xfe\"]\n")
    for args in (("status",), ("run", "a"), ("watch", "--once")):
        proc = ws.cli(*args)
        assert proc.returncode == 3, (args, proc.stdout, proc.stderr)
        assert "eagle3.toml" in proc.stderr and "UTF-8" in proc.stderr and "Traceback" not in proc.stderr


def test_corrupt_state_db_exits_3_everywhere(ws):
    ws.write(SLEEPER)
    ws.call("status", "--no-gpus", check=0)
    db = ws.root / ".eagle3" / "state.db"
    for suffix in ("-wal", "-shm"):
        Path(str(db) + suffix).unlink(missing_ok=True)
    db.write_bytes(b"this is not a database" * 200)
    for args in (("runs",), ("run", "sleeper"), ("stop", "sleeper"), ("clean", "sleeper"),
                 ("kill-workers", "sleeper"), ("restart", "sleeper"), ("logs", "sleeper"),
                 ("status", "--no-gpus"), ("watch", "--once", "--no-gpus")):
        proc = ws.cli(*args)
        assert proc.returncode == 3, (args, proc.returncode, proc.stdout, proc.stderr)
        assert "state.db" in proc.stderr and "Traceback" not in proc.stderr, (args, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1, (args, proc.stderr)


def test_read_only_state_dir_exits_3(ws):
    ws.write(SLEEPER)
    ws.call("status", "--no-gpus", check=0)
    # Reading works on a read-only state folder (status: 0); what must write says
    # which file it cannot write (3); stop with nothing to stop is a refusal (2).
    for args, codes in ((("status", "--no-gpus"), (0,)), (("run", "sleeper"), (3,)),
                        (("watch", "--once", "--no-gpus"), (3,)), (("stop", "sleeper"), (2, 3))):
        proc = _cli_read_only(ws, ws.root / ".eagle3", *args)
        assert proc.returncode in codes, (args, proc.returncode, proc.stdout, proc.stderr)
        assert "Traceback" not in proc.stderr, (args, proc.stderr)
        if proc.returncode == 3:
            assert ".eagle3" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, (args, proc.stderr)
    assert ws.latest("sleeper") is None


# ------------------------------------------------------------------ 10. smaller ones
def test_negative_estimate_bytes_is_refused(ws):
    ws.write(CUSTOM_OUT.format(out="out") + "estimate_bytes = -5\n")
    proc = ws.call("status", "--no-gpus")
    assert proc.returncode == 3 and "stages.writer.estimate_bytes" in proc.stderr


def test_huge_pipeline_file_is_refused_quickly(ws):
    body = "".join(f'[stages.s{i}]\nargv = ["true"]\n' for i in range(20_000))
    (ws.root / "eagle3.toml").write_text(body)
    proc = ws.call("status", "--no-gpus", timeout=60)
    assert proc.returncode == 3 and "stages" in proc.stderr and "at most" in proc.stderr, proc.stderr


def test_env_tie_is_bounded_by_the_run_time_window():
    """A process carrying a run's EAGLE3_RUN_ID, started long after that run ended,
    is not the run's (the id was reused by someone copying the environment)."""
    from eagle3_console.monitor.procs import ProcessTable, RunRef
    env = dict(os.environ, EAGLE3_RUN_ID="77", EAGLE3_WORKSPACE="/nonexistent/ws-window")
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], env=env,
                             start_new_session=True)
    try:
        import psutil
        ct = psutil.Process(child.pid).create_time()
        # A run that started and ended well before the child existed (its leader pid long gone).
        ended_ref = RunRef(run_id=77, stage="s", pid=999_999_999, create_time=ct - 100, workspace="/nonexistent/ws-window",
                           ended=ct - 50)
        live_ref = RunRef(run_id=77, stage="s", pid=999_999_999, create_time=ct - 100, workspace="/nonexistent/ws-window")
        table = ProcessTable.snapshot()
        assert child.pid not in table.owners((ended_ref,))
        assert child.pid in table.owners((live_ref,))
    finally:
        child.kill()
        child.wait()
