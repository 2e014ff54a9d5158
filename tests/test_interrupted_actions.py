"""An interrupted destructive action is in the audit log: `clean --yes`,
`clean --yes --purge` and `kill-workers --yes` record `started` before they act,
and SIGTERM, SIGINT or SIGHUP mid-way records `interrupted: <signal>` with how
far it got; the CLI says so and exits 128 + N; nothing is lost (every file is
either still in place or in the trash). Real runs, real signals to the CLI
process, real files."""

from __future__ import annotations

import json
import os
import signal
import subprocess

import pytest

from tests.conftest import PY, stage_cmd, wait_for

N = 10_000


def _terminal_sigint():
    """SIGINT as a terminal's foreground job has it. A suite started in the background
    (`nohup ... &`, some CI runners) ignores SIGINT, exec keeps that, and Python then installs
    no KeyboardInterrupt: the CLI rightly goes on as a background job does."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _cli(ws, *args, out):
    env = dict(os.environ)
    env.pop("EAGLE3_WORKSPACE", None)
    return subprocess.Popen([PY, "-m", "eagle3_console.cli", "-w", str(ws.root), *args], stdout=out,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=str(ws.root),
                            preexec_fn=_terminal_sigint)


def _events(ws, stage):
    return json.loads(ws.call("events", "--stage", stage, "--json", check=0).stdout)


def _files(root):
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, _s, fs in os.walk(root) for f in fs)


@pytest.mark.parametrize("sig,purge", [(signal.SIGTERM, False), (signal.SIGINT, False), (signal.SIGHUP, False),
                                       (signal.SIGTERM, True)], ids=["term", "int", "hup", "term-purge"])
def test_an_interrupted_clean_is_recorded_and_said(ws, tmp_path, sig, purge):
    ws.write('[stages.w]\nargv = ["false"]\noutputs = ["out/w"]\n')
    ws.cli("run", "w", check=0)
    ws.wait_status("w", ("failed",))
    out = ws.root / "out" / "w"
    out.mkdir(parents=True, exist_ok=True)
    for i in range(N):      # after the run's start: files no record vouches for, i.e. partial
        (out / f"f{i}.bin").write_bytes(b"x" * 64)
    trash = ws.root / ".eagle3" / "trash"
    with open(tmp_path / "plan.txt", "w") as plan:
        proc = _cli(ws, "clean", "w", "--yes", *(["--purge"] if purge else []), out=plan)
        if purge:
            wait_for(lambda: len(os.listdir(out)) < N, timeout=60, poll=0.005)
        else:
            wait_for(lambda: _moving(trash), timeout=60, poll=0.005)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    name = signal.Signals(sig).name
    assert proc.returncode == 128 + sig, (proc.returncode, err)
    assert f"clean w: interrupted by {name}: " in err and "recorded in the audit log" in err, err
    assert "Traceback" not in err, err
    left = len(os.listdir(out))
    assert 0 < left < N, left
    in_trash = [] if purge else _files(trash)
    assert purge or left + len(in_trash) == N           # nothing lost
    events = [e for e in _events(ws, "w") if e["action"] == "clean"]
    assert [e["outcome"] for e in events] == [f"interrupted: {name}", "started"], events
    verb = "deleted" if purge else "moved to the trash"
    assert events[1]["detail"] == f"{N:,} partial file(s) to be {verb}"
    assert events[0]["detail"] == f"{N - left:,} of {N:,} file(s) {verb}, {left:,} left in place"


def test_an_interrupted_kill_workers_is_recorded_and_said(ws, tmp_path):
    ws.write(f"[stages.s]\nargv = {stage_cmd('sleeper.py', '--seconds', '120', '--ignore-term')}\n")
    ws.cli("run", "s", check=0)
    run = ws.wait_status("s", ("running",))
    wait_for(lambda: "sleeping" in open(run.log_path).read())
    try:
        with open(tmp_path / "kill.txt", "w") as said:
            proc = _cli(ws, "kill-workers", "s", "--yes", "--grace", "60", out=said)
            wait_for(lambda: "SIGTERM sent" in (tmp_path / "kill.txt").read_text(), timeout=60)
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=60)
        assert proc.returncode == 128 + signal.SIGTERM, (proc.returncode, err)
        assert "kill-workers s: interrupted by SIGTERM: " in err and "still alive" in err, err
        events = [e for e in _events(ws, "s") if e["action"] == "kill-workers"]
        assert [e["outcome"] for e in events] == ["interrupted: SIGTERM", "started"], events
        assert "process(es) gone, still alive: [" in events[0]["detail"]
    finally:
        ws.cli("kill-workers", "s", "--yes", "--grace", "0")


def test_every_started_clean_has_its_end_when_parallel_cleans_race(ws, tmp_path):
    """The losers of parallel cleans re-plan, find nothing and exit 0: their `started`
    record still gets an end (`nothing to do`), so none reads as an action cut short."""
    ws.write('[stages.w]\nargv = ["false"]\noutputs = ["out/w"]\n')
    ws.cli("run", "w", check=0)
    ws.wait_status("w", ("failed",))
    out = ws.root / "out" / "w"
    out.mkdir(parents=True, exist_ok=True)
    for i in range(200):
        (out / f"f{i}.bin").write_bytes(b"x")
    procs = [_cli(ws, "clean", "w", "--yes", out=subprocess.DEVNULL) for _ in range(4)]
    assert [p.wait(timeout=120) for p in procs] == [0] * 4
    outcomes = [e["outcome"] for e in _events(ws, "w") if e["action"] == "clean"]
    started = outcomes.count("started")
    ends = [o for o in outcomes if o != "started"]
    assert started == len(ends) and started >= 1, outcomes
    assert set(ends) <= {"ok", "nothing to do"} and ends.count("ok") == 1, outcomes


def _moving(trash) -> bool:
    """A file has landed in clean's trash folder: the folder, and the output's path under it
    (`out/w/`), exist a moment before the first file does."""
    return any(files for _d, _s, files in os.walk(trash))
