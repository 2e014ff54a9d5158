"""Data lost or blocked: the third fault battery's claims, partial files and
counts (issue 28), played end to end with the real CLI (its reads and refusals in this process), real
supervisors, real files and lock files. Each test failed on the main branch it
was written against (see each docstring)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time

import pytest

from ops import KNOWN_OPS, get_spec
from tests.conftest import PY, TINY_TARGET, WS, stage_cmd, wait_for
from tests.procs import alive
from tests.test_faults_clean import LOCK, _env, writer_stage

# Ints that are not counts: any value is a seed.
NOT_COUNTS = {"seed"}


# ------------------------------------------------------------------ item 4: counts
def test_every_count_param_of_every_op_is_bounded():
    """Before: train's epochs, keep, holdout, bench's num_prompts and a dozen more
    took any integer (`epochs=-0` ran no step and deleted the checkpoints)."""
    loose = [f"{op}.{p.name}" for op in KNOWN_OPS for p in get_spec(op).params.declared.values()
             if p.kind is int and p.name not in NOT_COUNTS and p.low is None and p.choices is None]
    assert loose == []


TRAIN = TINY_TARGET + """
[stages.train]
op = "train"
params = { data = "data/hs", vocab = "data/vocab", output = "runs/drafter", replace_checkpoints = true }
"""


@pytest.mark.parametrize("setting", ["epochs=0", "epochs=-0", "keep=-1", "holdout=-3", "max_steps=-1"])
def test_a_count_out_of_bounds_is_refused_before_any_run_and_the_checkpoints_stay(ws, setting, capsys):
    """Before: `run train --set epochs=0` with replace_checkpoints=true
    "succeeded" in 7.5 s with 0 steps and the earlier run's checkpoints deleted;
    keep=-1 gave a negative disk estimate."""
    ws.write(TRAIN)
    ckpt = ws.root / "runs" / "drafter" / "checkpoints" / "step_5"
    ckpt.mkdir(parents=True)
    (ckpt / "meta.json").write_text(json.dumps({"step": 5}))
    proc = ws.call("run", "train", "--set", setting)        # a refusal: no process is what is tested
    assert proc.returncode == 3, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    key = setting.split("=")[0]
    assert f"param {key}" in proc.stderr and "expected >=" in proc.stderr, proc.stderr
    assert ws.latest("train") is None
    assert (ckpt / "meta.json").exists()
    # The op's own parser refuses the same value in the same words: its main() as `python -m ops.train`
    # runs it, in this process (a parse, no process is what is tested; a subprocess cost a torch import).
    from ops.train.__main__ import main as train_main
    flag = "--" + key.replace("_", "-")
    capsys.readouterr()
    code = train_main(["--target", "t", "--data", "d", "--vocab", "v", "--output", "o", flag, setting.split("=")[1]])
    err = capsys.readouterr().err
    assert code == 2 and "expected >=" in err and "Traceback" not in err, err


# ------------------------------------------------------------------ item 2: nested outputs across workspaces
def test_a_claim_covers_the_folders_under_and_over_it_across_workspaces(tmp_path):
    """Before: A (live) writing $SH/out/sub with outputs = [$SH/out]; B declaring
    $SH/out/sub and C declaring $SH both ran, failed, and `clean --yes` moved 6
    and 1 of A's live files into their trash: the claim was checked on the exact
    folder only. A then "succeeded" with 13 of its 20 files."""
    sh = tmp_path / "shared"
    a, b, c = (WS(tmp_path / n) for n in "ABC")
    for w in (a, b, c):
        w.root.mkdir()
    # A lives until the test releases it: the refusals below need A live, however long a loaded
    # machine takes over each CLI call (a fixed 20 s of writing was both too long and not sure).
    release = tmp_path / "release-A"
    a.write(writer_stage(str(sh / "out"), n=20, prefix="A_", sub="sub", until=str(release)))
    b.write(writer_stage(str(sh / "out" / "sub"), n=1, prefix="B_", code=1))
    c.write(writer_stage(str(sh), n=1, prefix="C_", code=1))
    for w in (b, c):
        w.cli("run", "w", check=0)
        w.wait_status("w", ("failed",))
    a.cli("run", "w", check=0)
    run_a = a.wait_status("w", ("running",))
    wait_for(lambda: (sh / "out" / LOCK).exists() and (sh / "out" / "sub" / "A_2.bin").exists())
    for w, why in ((b, "overlaps"), (c, "overlaps")):
        again = w.call("run", "w")                  # refusals: in this process
        said = again.stdout + again.stderr
        assert again.returncode == 2 and str(a.root) in said and why in said, said
        assert "Traceback" not in again.stderr
        clean = w.call("clean", "w", "--yes")
        assert clean.returncode == 2 and "owned by" in clean.stdout and f"run {run_a.id}" in clean.stdout, \
            clean.stdout + clean.stderr
    assert a.latest("w").status == "running"       # the refusals above met A live
    release.touch()
    a.wait_status("w", ("succeeded",), timeout=90)
    assert sorted(p.name for p in (sh / "out" / "sub").glob("A_*.bin")) == sorted(f"A_{i}.bin" for i in range(20))
    for w in (b, c):
        assert not list((w.root / ".eagle3" / "trash").rglob("A_*.bin"))
    # A has ended: B's clean takes its own partial file, and only that.
    done = b.cli("clean", "w", "--yes")
    assert done.returncode == 0 and "cleaned" in done.stdout, done.stdout + done.stderr


# ------------------------------------------------------------------ item 8: a lock that is not a file
@pytest.mark.parametrize("kind", ["folder", "FIFO"])
def test_a_lock_path_that_is_a_folder_or_a_fifo_is_one_line_never_a_hang(ws, kind):
    """Before: `<output>/.eagle3-lock` a folder: `run` and `clean --yes` gave an
    IsADirectoryError traceback, exit 1; a FIFO: both hung until killed."""
    ws.write(writer_stage("out/w", n=3, code=1))
    ws.cli("run", "w", check=0)
    failed = ws.wait_status("w", ("failed",))
    lock = ws.root / "out" / "w" / LOCK
    if kind == "folder":
        lock.mkdir()
    else:
        os.mkfifo(lock)
    for args in (("run", "w"), ("clean", "w", "--yes"), ("clean", "w")):
        proc = ws.cli(*args, timeout=60)
        said = proc.stdout + proc.stderr
        assert proc.returncode == 2, (args, proc.returncode, said)
        assert "Traceback" not in proc.stderr and str(lock) in said and kind in said, (args, said)
    assert ws.latest("w").id == failed.id
    assert sorted(p.name for p in (ws.root / "out" / "w").glob("*.bin")) == ["f0.bin", "f1.bin", "f2.bin"]


# ------------------------------------------------------------------ item 28: clean racing a new run
def test_a_run_started_while_clean_moves_files_is_refused(ws):
    """Before: while `clean w --yes` moved 20,000 partial files, `run w` started
    0.9 s later was not refused (clean checked for a live run only when it
    planned): the resuming run counted the old samples as done and clean then
    moved them from under it (3 of 3)."""
    ws.write(writer_stage("out/w", n=1, code=1))
    ws.cli("run", "w", check=0)
    failed = ws.wait_status("w", ("failed",))
    out = ws.root / "out" / "w"
    n = 20000
    for i in range(n):
        (out / f"p{i}.bin").write_bytes(b"partial")
    trash = ws.root / ".eagle3" / "trash"
    clean = subprocess.Popen([PY, "-m", "eagle3_console.cli", "-w", str(ws.root), "clean", "w", "--yes"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(), cwd=str(ws.root))
    try:
        wait_for(lambda: any(trash.rglob("p*.bin")), timeout=120, poll=0.01)
        assert clean.poll() is None, "clean ended before the run was tried: more files needed"
        proc = ws.cli("run", "w")
        still = clean.poll() is None
    finally:
        said, err = clean.communicate(timeout=300)
    assert clean.returncode == 0 and f"cleaned {n + 1} file(s)" in said, said + err
    assert still, "clean ended while `run` was checked: more files needed"
    assert proc.returncode == 2 and "clean" in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    assert ws.latest("w").id == failed.id           # no run started
    assert not (out / LOCK).exists()                # the hold is gone with the clean
    assert len(list(trash.rglob("*.bin"))) == n + 1
    ws.cli("run", "w", check=0)                     # and the stage starts again once clean is done
    assert ws.wait_status("w", ("failed",)).id != failed.id


# ------------------------------------------------------------------ items 3 and 32: what a run vouches for
def test_files_of_a_succeeded_run_touched_since_are_not_partial(ws):
    """Before: run 1 succeeded, `touch -d '+2 hours' out/w/*`, run 2 failed:
    clean listed run 1's good files as partial (the vouch was size + mtime),
    though README says they are kept whatever their dates."""
    ws.write(writer_stage("out/w", n=5))
    ws.cli("run", "w", check=0)
    ws.wait_status("w", ("succeeded",))
    out = ws.root / "out" / "w"
    later = time.time() + 7200
    for p in out.glob("*.bin"):
        os.utime(p, (later, later))
    ws.cli("run", "w", "--set", "prefix=g", "--set", "n=2", "--set", "code=1", check=0)
    ws.wait_status("w", ("failed",))
    plan = ws.cli("clean", "w")
    assert plan.returncode == 0 and "2 partial file(s)" in plan.stdout, plan.stdout
    assert "g0.bin" in plan.stdout and "f0.bin" not in plan.stdout
    ws.cli("clean", "w", "--yes", check=0)
    assert sorted(p.name for p in out.glob("*.bin")) == [f"f{i}.bin" for i in range(5)]


def test_an_output_re_pointed_while_its_run_lives_leaves_the_new_folder_alone(ws):
    """Before: `out/w` changed to `data/important` (5 files there before any run)
    in eagle3.toml while run 1 lived; the run failed; `clean w --yes` planned
    "5 partial file(s) ... files that were not there before run 1" and moved them."""
    important = ws.root / "data" / "important"
    important.mkdir(parents=True)
    for i in range(5):
        (important / f"keep{i}.bin").write_bytes(b"precious %d" % i)
    # The run writes its 8 files and lives until the test has re-pointed its output (not 2.4 s of writing).
    release = ws.root / "release"
    toml = writer_stage("out/w", n=8, code=1, until=str(release))
    ws.write(toml)
    ws.cli("run", "w", check=0)
    ws.wait_status("w", ("running",))
    wait_for(lambda: (ws.root / "out" / "w" / "f7.bin").exists())
    ws.write(toml.replace('outputs = ["out/w"]', 'outputs = ["data/important"]'))
    assert ws.latest("w").status == "running"      # re-pointed while the run lives
    release.touch()
    ws.wait_status("w", ("failed",), timeout=60)
    plan = ws.cli("clean", "w")
    assert plan.returncode == 0 and "8 partial file(s)" in plan.stdout, plan.stdout
    assert "keep0.bin" not in plan.stdout and str(ws.root / "out" / "w") in plan.stdout, plan.stdout
    done = ws.cli("clean", "w", "--yes")
    assert done.returncode == 0 and "cleaned 8 file(s)" in done.stdout, done.stdout
    assert sorted(p.name for p in important.iterdir()) == [f"keep{i}.bin" for i in range(5)]
    assert not list((ws.root / "out" / "w").glob("*.bin"))


# ------------------------------------------------------------------ item 29: a sample replaced by a symlink
def test_clean_honours_verifys_report_of_a_sample_replaced_by_a_symlink(tmp_path, extraction):
    """Before: verify named the link bad ("header length ... is not plausible"),
    but `clean extract` refused ("outputs are complete and are never cleaned"),
    though it honoured the same report for a truncated regular file."""
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
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"not a sample, not the workspace's" * 10)
    link = sample_path(hs, 3)
    link.unlink()
    os.symlink(outside, link)
    ws.cli("run", "verify", check=0)
    ws.wait_status("verify", ("failed",), timeout=120)
    report = json.loads((ws.root / "runs" / "verify.json").read_text())
    assert any(b["path"].endswith(link.name) for b in report["bad_files"]), report["bad_files"]
    plan = ws.cli("clean", "extract")
    assert plan.returncode == 0 and str(link) in plan.stdout and "verify" in plan.stdout, plan.stdout + plan.stderr
    done = ws.cli("clean", "extract", "--yes")
    assert done.returncode == 0 and "cleaned 1 file(s)" in done.stdout, done.stdout + done.stderr
    assert not os.path.lexists(link)
    assert outside.read_bytes() == b"not a sample, not the workspace's" * 10      # the target never touched
    moved = list((ws.root / ".eagle3" / "trash").rglob(link.name))
    assert len(moved) == 1 and moved[0].is_symlink()


# ------------------------------------------------------------------ item 25: a succeeded stage's output vanished
def test_a_vanished_output_of_a_succeeded_stage_is_an_alert_and_refuses_its_dependents(ws):
    """Before: the output of a succeeded stage moved away: status "succeeded",
    health OK, exit 0; a dependent stage was allowed to start and failed on the
    missing input."""
    ws.write(writer_stage("out/w", n=3) + f"""
[stages.use]
argv = {stage_cmd("writer.py", "--output", "out/use", "--n", "1")}
depends_on = ["w"]
outputs = ["out/use"]

[stages.never_writes]
argv = ["true"]
outputs = ["out/nothing"]
""")
    for name in ("w", "never_writes"):
        ws.cli("run", name, "--force", check=0)
        ws.wait_status(name, ("succeeded",))
    assert ws.call("status", "--no-gpus").returncode == 0     # an output declared and never written: no alert
    (ws.root / "out" / "w").rename(ws.root / "out" / "w.moved")
    status = ws.call("status", "--no-gpus")
    assert status.returncode == 2 and "gone" in status.stdout and str(ws.root / "out" / "w") in status.stdout, \
        status.stdout
    snap = json.loads(ws.call("status", "--json", "--no-gpus").stdout)
    w = next(s for s in snap["stages"] if s["name"] == "w")
    assert w["vanished"] == [str(ws.root / "out" / "w")]
    assert [a["code"] for a in snap["alerts"]] == ["output_vanished"], snap["alerts"]
    run = ws.call("run", "use")
    assert run.returncode == 2 and "gone" in run.stdout + run.stderr and "out/w" in run.stdout + run.stderr, \
        run.stdout + run.stderr
    watch = ws.cli("watch", "--once", "--advance", "--no-gpus")
    assert "Traceback" not in watch.stderr
    assert ws.latest("use") is None                 # neither run nor watch started it
    (ws.root / "out" / "w.moved").rename(ws.root / "out" / "w")
    assert ws.call("status", "--no-gpus").returncode == 0


# ------------------------------------------------------------------ item 5: a stage removed while its run lives
OTHER = '[stages.other]\nargv = ["true"]\noutputs = ["out/other"]\n'


@pytest.mark.parametrize("command", [("stop", "w"), ("kill-workers", "w", "--yes"), ("restart", "w", "--kill", "--yes")],
                         ids=["stop", "kill-workers", "restart-kill"])
def test_a_stage_removed_while_its_run_lives_stays_visible_and_stoppable(ws, command):
    """Before: with w's run live and [stages.w] deleted from eagle3.toml, status
    said OK (exit 0, no alert) and `stop w`, `kill-workers w --yes`, `restart w
    --kill --yes` said "no such stage", exit 3: the run was unreachable."""
    ws.write(writer_stage("out/w", n=600, every=0.1) + OTHER)
    ws.cli("run", "w", check=0)
    run = ws.wait_status("w", ("running",))
    try:
        _removed_and_stopped(ws, run, command)
    finally:
        try:
            os.killpg(run.pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _removed_and_stopped(ws, run, command):
    ws.write(OTHER)
    status = ws.call("status", "--no-gpus")
    assert status.returncode == 1 and "removed from the pipeline file" in status.stdout, status.stdout
    snap = json.loads(ws.call("status", "--json", "--no-gpus").stdout)
    w = [s for s in snap["stages"] if s["name"] == "w"]
    assert w and w[0]["removed"] is True and w[0]["run_id"] == run.id and w[0]["status"] == "running", w
    assert "stage_removed" in [a["code"] for a in snap["alerts"]]
    proc = ws.cli(*command, timeout=120)
    said = proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr and "no such stage" not in said, said
    if command[0] == "restart":
        assert proc.returncode == 3 and "not restarted" in said, said
    else:
        assert proc.returncode == 0, said
    ended = ws.wait_status("w", ("killed", "failed"), timeout=30)
    assert ended.id == run.id and not alive(run.pid)
    with ws.registry() as reg:
        assert [r.id for r in reg.runs("w")] == [run.id]          # nothing restarted it
    # Once it has ended it is gone from the screen, and its name is unknown again.
    snap = json.loads(ws.call("status", "--json", "--no-gpus").stdout)
    assert [s["name"] for s in snap["stages"]] == ["other"]
    assert ws.call("stop", "w").returncode == 3


# ------------------------------------------------------------------ the supervisor's own check (past launch's)
def _supervised(ws: WS, argv: list[str]):
    """A run created as launch creates it, its supervisor started directly:
    what a launch that passed its checks an instant before a hold or a claim
    was taken meets."""
    from eagle3_console.kernel.workspace import Workspace
    w = Workspace(ws.root)
    w.ensure_state()
    with ws.registry() as reg:
        run = reg.create_run("w", argv, {}, {}, str(ws.root), lambda rid: w.log_path(rid, "w"))
    from eagle3_console.kernel import config as cfg
    from eagle3_console import runs
    handoff = runs.handoff(w, cfg.load(w.config_path).stage("w"), {})
    subprocess.run([PY, "-m", "eagle3_console.runs.supervise", str(ws.root), str(run.id), handoff.to_arg()],
                   check=True, timeout=60, env=_env(), cwd=str(ws.root))
    return ws.wait_status("w", ("failed", "succeeded"), timeout=60)


def test_a_supervisor_never_starts_its_stage_into_an_output_clean_holds(ws):
    from eagle3_console.actions.hold import holding
    from eagle3_console.kernel.workspace import Workspace

    ws.write(writer_stage("out/w", n=1))
    out = ws.root / "out" / "w"
    out.mkdir(parents=True)
    marker = ws.root / "ran"
    with holding(Workspace(ws.root), "x", "w", 0, [out]):
        run = _supervised(ws, ["sh", "-c", f"touch {marker}"])
    assert run.status == "failed" and "moving files" in (run.reason or ""), run.reason
    assert not marker.exists() and not (out / LOCK).exists()


def test_a_supervisor_never_starts_its_stage_into_a_folder_under_a_live_claim(tmp_path):
    sh = tmp_path / "shared"
    a, b = WS(tmp_path / "A"), WS(tmp_path / "B")
    a.root.mkdir()
    b.root.mkdir()
    # A lives until `release` (after the refusal), not a fixed 20 s of writing.
    release = tmp_path / "release-A"
    a.write(writer_stage(str(sh / "out"), n=3, prefix="A_", until=str(release)))
    b.write(writer_stage(str(sh / "out" / "sub"), n=1))
    a.cli("run", "w", check=0)
    try:
        a.wait_status("w", ("running",))
        wait_for(lambda: (sh / "out" / LOCK).exists())
        (sh / "out" / "sub").mkdir()
        marker = tmp_path / "ran"
        run = _supervised(b, ["sh", "-c", f"touch {marker}"])
        assert run.status == "failed" and "overlaps" in (run.reason or "") and str(a.root) in run.reason, run.reason
        assert not marker.exists()
    finally:
        release.touch()


def test_clean_and_run_started_together_never_both_act(ws):
    """The race itself, repeated: `clean w --yes` and `run w` started together
    (the run an instant later each round). Either clean moved the files and no
    run started while it did, or the run started and clean refused: never both
    (on main: both acted in the rounds where the run met clean's move)."""
    # A run that starts in a round lives until the round is over (the release file), so clean meets
    # it live whenever it started; the rounds cost no fixed run time (it was 4 s of writing).
    release = ws.root / "release"
    release.touch()
    ws.write(writer_stage("out/w", n=2, code=1, until=str(release)))
    ws.cli("run", "w", check=0)
    ws.wait_status("w", ("failed",), timeout=60)
    out = ws.root / "out" / "w"
    both = []
    for round_, delay in enumerate((0.3, 0.6, 0.9, 1.2)):
        for i in range(6000):
            (out / f"r{round_}_{i}.bin").write_bytes(b"partial")
        before = ws.latest("w").id
        release.unlink()
        clean = subprocess.Popen([PY, "-m", "eagle3_console.cli", "-w", str(ws.root), "clean", "w", "--yes"],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(),
                                 cwd=str(ws.root))
        time.sleep(delay)
        run = ws.cli("run", "w")
        said, err = clean.communicate(timeout=300)
        assert "Traceback" not in err + run.stderr, err + run.stderr
        latest = ws.latest("w")
        started = latest.id != before and run.returncode == 0
        cleaned = clean.returncode == 0 and "cleaned" in said
        # Both acting one after the other is no race (under load a clean can end before the
        # run's CLI gets going): only a run created before clean's move ended counts.
        if started and cleaned:
            with ws.registry() as reg:
                moved_at = max(e.time for e in reg.events() if e.action == "clean" and e.outcome == "ok")
            if latest.created < moved_at:
                both.append(round_)
        release.touch()
        ws.wait_status("w", ("failed",), timeout=60)
        ws.cli("clean", "w", "--yes")       # the next round starts from no partial files
    assert both == []
