"""The plan shown is the plan executed: guarded actions in the console with
real stage processes (tests/stages/), real signals and a real registry; only
NVML is the fake of tests/fake_pynvml.py, wrapped here to hold one planning
pass (the one way to make the racing order of keys deterministic)."""

from __future__ import annotations

import threading

from eagle3_console.kernel import config as cfg
from eagle3_console import runs
from eagle3_console.monitor.procs import process_alive
from eagle3_console.kernel.workspace import Workspace
from tests.conftest import stage_cmd
from tests.test_tui import confirm, open_dialog, plan_text, progress_text
from tests.test_tui_helpers import make_app, run, select, stage_of, wait_until
from eagle3_console.tui.dialogs import ActionDialog


class HeldNvml:
    """The console's NVML, whose first sample() waits until released: the
    first kill plan is made after the second one."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.release = threading.Event()
        self._first = True
        self._lock = threading.Lock()

    def sample(self):
        with self._lock:
            first, self._first = self._first, False
        if first:
            assert self.release.wait(30), "never released"
        return self.inner.sample()

    def __getattr__(self, name):
        return getattr(self.inner, name)


def two_sleepers() -> str:
    return f"""
[stages.a]
argv = {stage_cmd("sleeper.py", "--seconds", "60")}

[stages.b]
argv = {stage_cmd("sleeper.py", "--seconds", "60")}
"""


def launch(ws, stage: str):
    w = Workspace.at(ws.root)
    return runs.launch(w, cfg.load(w.config_path), stage, force=True)


def dialogs(app) -> list[ActionDialog]:
    return [s for s in app.screen_stack if isinstance(s, ActionDialog)]


def test_each_kill_dialog_executes_the_plan_it_shows_when_keys_race(ws):
    """k on a, move to b, k on b before a's dialog appears (a's planning is
    held): two dialogs. b's dialog, confirmed, kills b's processes - those it
    listed - and not a's, whose plan was made last."""
    ws.write(two_sleepers())
    ra, rb = launch(ws, "a"), launch(ws, "b")

    async def main():
        app = make_app(ws.root, refresh_s=0.2, kill_release_timeout_s=5)
        held = app.nvml = HeldNvml(app.nvml)
        async with app.run_test(size=(160, 48)) as pilot:
            await select(pilot, app, "a")
            await wait_until(pilot, lambda: stage_of(app, "a").status == "running")
            await pilot.press("k")                        # a's plan waits in NVML
            await select(pilot, app, "b")
            await pilot.press("k")
            await wait_until(pilot, lambda: len(dialogs(app)) == 1)
            held.release.set()                            # a's plan is made now, after b's
            await wait_until(pilot, lambda: len(dialogs(app)) == 2)
            top, under = dialogs(app)[1], dialogs(app)[0]
            assert top.spec.title == "Kill the workers of a" and under.spec.title == "Kill the workers of b"
            assert f"pid {ra.pid:>7}" in plan_text(top)
            await pilot.press("escape")                   # leave a's dialog unconfirmed
            await wait_until(pilot, lambda: app.screen is under)
            shown = plan_text(under)
            assert f"pid {rb.pid:>7}" in shown and f"pid {ra.pid:>7}" not in shown
            await confirm(pilot, under)
            await wait_until(pilot, lambda: under.state == "done", timeout=30)
            assert under.outcome_ok, progress_text(under)
    try:
        run(main())
        assert not process_alive(rb.pid, rb.create_time)
        assert process_alive(ra.pid, ra.create_time), "a's processes were signalled from b's dialog"
    finally:
        for r in (ra, rb):
            if process_alive(r.pid, r.create_time):
                runs.stop(Workspace.at(ws.root), r.stage, grace_s=2)


def chain() -> str:
    return f"""
[stages.up]
argv = {stage_cmd("progress.py", "--n", "2", "--sleep", "0.01")}

[stages.down]
argv = {stage_cmd("progress.py", "--n", "2", "--sleep", "0.01")}
depends_on = ["up"]
"""


def test_start_on_complete_outputs_asks_first_and_names_what_it_makes_stale(ws):
    """`s` on a succeeded stage goes through plan-and-confirm as `r` does
    (it used to rerun at once and rewrite the outputs); afterwards the
    downstream stage shows stale."""
    ws.write(chain())
    for name in ("up", "down"):
        launch(ws, name)
        ws.wait_status(name, ("succeeded",))
    first = ws.latest("up").id

    async def main():
        app = make_app(ws.root, refresh_s=0.2)
        async with app.run_test(size=(160, 48)) as pilot:
            await select(pilot, app, "up")
            dialog = await open_dialog(pilot, app, "s")
            text = plan_text(dialog)
            assert "start up again (last run 1: succeeded)" in text and "its outputs are complete" in text
            assert "makes stale (their outputs were made from the current ones): down" in text
            assert "argv: " in text and "progress.py" in text
            await pilot.press("escape")           # cancelled: nothing started
            await wait_until(pilot, lambda: not isinstance(app.screen, ActionDialog))
            assert ws.latest("up").id == first
            dialog = await open_dialog(pilot, app, "s")
            await confirm(pilot, dialog)
            await wait_until(pilot, lambda: (r := ws.latest("up")) and r.id != first and r.status == "succeeded")
            await wait_until(pilot, lambda: stage_of(app, "down").status == "stale")
            from eagle3_console.tui.panes.stages import StageTable
            table = app.query_one(StageTable)
            cells = [str(c) for c in table.get_row("down")]
            assert "stale" in cells
    run(main())


def test_start_on_a_stage_that_never_ran_starts_at_once(ws):
    ws.write(chain())

    async def main():
        app = make_app(ws.root, refresh_s=0.2)
        async with app.run_test(size=(160, 48)) as pilot:
            await select(pilot, app, "up")
            await pilot.press("s")
            await wait_until(pilot, lambda: (s := stage_of(app, "up")) and s.status == "succeeded")
            assert not any(isinstance(s, ActionDialog) for s in app.screen_stack)
    run(main())
