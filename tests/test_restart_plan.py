"""`restart`'s dry run says what the launch will do: the argv with the `--force`
that `--ignore-disk` adds for an op that repeats the disk check itself, and
`--halve-batch` after a failure that was not out of memory says that nothing
was halved (the CLI, its refusals in
this process, the runs recorded in a real registry)."""

from __future__ import annotations

from tests.conftest import extract_pipeline


def test_ignore_disk_dry_run_shows_the_force_the_launch_adds(ws):
    ws.write(extract_pipeline(", tokens = 1000000000000000"))
    (ws.root / "models" / "target").mkdir(parents=True)     # run refuses a target that is not there
    ws.record_finished_run("extract", {"input": "data/prepared", "output": "data/hs", "tokens": 10 ** 15})
    refused = ws.call("restart", "extract", check=2)
    assert "free space or pass --ignore-disk" in refused.stdout + refused.stderr
    proc = ws.cli("restart", "extract", "--ignore-disk", check=0)
    argv = next(x for x in proc.stdout.splitlines() if x.startswith("argv: "))
    assert " --force" in argv, proc.stdout
    plain = ws.cli("restart", "extract", "--ignore-disk", "--set", "tokens=10", check=0)
    argv = next(x for x in plain.stdout.splitlines() if x.startswith("argv: "))
    assert " --force" in argv, plain.stdout     # asked for: the launch adds it whatever the estimate


def test_halve_batch_after_a_failure_that_was_not_oom_says_nothing_was_halved(ws):
    ws.write('[stages.w]\nargv = ["echo", "{batch}"]\nparams = { batch = 8 }\nbatch_param = "batch"\n')
    ws.record_finished_run("w", {"batch": 8})
    proc = ws.cli("restart", "w", "--halve-batch", check=0)
    assert ("--halve-batch: nothing halved: its last run did not run out of memory (no OOM in its log); "
            "batch stays as it was") in proc.stdout, proc.stdout
    assert "argv: echo 8" in proc.stdout


def test_an_input_that_does_not_exist_is_refused_before_launch(ws):
    """Before: the run started (with tp 8: eight torchrun ranks) and failed on the missing
    folder 72 s later. Refused even with --force, which skips only the dependency check."""
    ws.write(extract_pipeline(""))
    (ws.root / "models" / "target").mkdir(parents=True)     # an empty folder (run refuses none): the op fails on it
    for extra in ((), ("--force",)):
        proc = ws.call("run", "extract", *extra, check=2)
        assert f"stage 'extract': params.input {ws.root / 'data' / 'prepared'} does not exist" in proc.stderr, \
            proc.stderr
    assert ws.latest("extract") is None
    with ws.registry() as reg:
        assert [e.outcome for e in reg.events("extract")] == ["refused: input", "refused: input"]
    (ws.root / "data" / "prepared").mkdir(parents=True)
    proc = ws.cli("run", "extract", "--ignore-disk", check=0)
    assert "does not exist" not in proc.stderr, proc.stderr
    ws.wait_status("extract", ("failed", "succeeded"), timeout=120)      # no target here: the op fails
