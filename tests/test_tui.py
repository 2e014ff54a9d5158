"""The console end to end with App.run_test(): a real workspace, real stage
processes launched through the supervisor, real signals and files; only NVML
is a stand-in (tests/fake_pynvml.py; no driver here). Each key action is
driven through its dialog as an operator would."""

from __future__ import annotations

import psutil
import pytest
from textual.widgets import Button, Footer, Input

from eagle3_console import runs
from eagle3_console.kernel import config as cfg
from eagle3_console.monitor.procs import process_alive
from eagle3_console.kernel.workspace import Workspace
from tests.conftest import wait_for
from tests.test_tui_helpers import (GiB, make_app, pane_text, pipeline, rendered, run, select, stage_of,
                                     wait_until)
from eagle3_console.tui.dialogs import ActionDialog, QuitDialog
from eagle3_console.tui.help import HelpScreen
from eagle3_console.tui.panes.log import LogPane


def launch(ws, stage: str, **overrides):
    w = Workspace.at(ws.root)
    return runs.launch(w, cfg.load(w.config_path), stage, overrides, force=True)


async def open_dialog(pilot, app, key: str) -> ActionDialog:
    await pilot.press(key)
    dialog = await wait_until(pilot, lambda: isinstance(app.screen, ActionDialog) and app.screen)
    await pilot.pause()
    # The footer on screen is the dialog's own: its keys, not the main screen's s/k/c/r.
    footer_keys = {b.key for _ns, b, enabled, _tip in dialog.query_one(Footer).screen.active_bindings.values()
                   if enabled and b.show}
    assert "escape" in footer_keys and not footer_keys & {"s", "k", "c", "r", "x"}, footer_keys
    return dialog


async def confirm(pilot, dialog: ActionDialog) -> None:
    # Focus starts on Cancel: the operator tabs to the confirm button on purpose.
    assert dialog.focused is dialog.query_one("#cancel", Button)
    await pilot.press("tab")
    assert dialog.focused is dialog.query_one("#confirm", Button)
    await pilot.press("enter")


def plan_text(dialog: ActionDialog) -> str:
    return rendered(dialog.query_one("#plan-text"))


def progress_text(dialog: ActionDialog) -> str:
    return rendered(dialog.query_one("#progress-text"))


def test_panes_follow_real_runs_and_the_selected_stage(ws):
    ws.write(pipeline(ws.root))
    launch(ws, "slow")
    launch(ws, "extract")            # crashes with an OOM traceback at sample 12
    ws.wait_status("extract", ("failed",))

    async def main():
        app = make_app(ws.root, refresh_s=0.2)
        async with app.run_test(size=(160, 48)) as pilot:
            await wait_until(pilot, lambda: (s := stage_of(app, "slow")) and s.status == "running")
            # The running stage is selected at first.
            assert app.main_screen.selected == "slow"
            table = app.query_one("#stages")
            assert "running" in str(table.get_row("slow")[1])
            await select(pilot, app, "extract")
            await wait_until(pilot, lambda: "failed OOM" in str(table.get_row("extract")[1]))
            progress = pane_text(app, "progress")
            # 12 whole samples and the truncated one the crash left (counted, and flagged unreadable).
            assert "samples 13/20" in progress and "1 unreadable" in progress and "rows_0-10" in progress and "10/10" in progress
            disk = pane_text(app, "disk")
            assert "out/hs" in disk and "written" in disk
            log = app.query_one(LogPane)
            assert any("CUDA out of memory" in ln for ln in log.view.lines)
            header = rendered(app.query_one("#header"))
            assert "CRITICAL" in header and str(ws.root) in header
            gpus = pane_text(app, "gpus")
            assert "GPUs (2" in str(app.query_one("#gpus").border_title) and "94.97" not in gpus
            # `/` filters the log; esc clears the filter.
            await pilot.press("slash")
            await pilot.press(*"memory")
            await wait_until(pilot, lambda: log.view.lines and all("memory" in ln.lower() for ln in log.view.lines))
            # What is typed is visible while typing (one row, no border eating it), and the
            # pane says which filter is on even when a longer word keeps the same lines.
            box = log.filter_input
            assert box.has_focus and box.content_region.height == 1 and "memory" in box.render_line(0).text
            assert "filter 'memory'" in str(log.border_subtitle)
            await pilot.press("escape")
            await wait_until(pilot, lambda: any("progress: samples 1/20" in ln for ln in log.view.lines))
            # A second esc leaves the log: keys act on the stage table again, which has the focus.
            await pilot.press("escape")
            await wait_until(pilot, lambda: app.focused is table)
        runs.stop(Workspace.at(ws.root), "slow", grace_s=2)
    run(main())


def test_start_key_launches_a_supervised_run(ws):
    ws.write(pipeline(ws.root))

    async def main():
        app = make_app(ws.root, refresh_s=0.2)
        async with app.run_test(size=(120, 40)) as pilot:
            await select(pilot, app, "quick")
            await pilot.press("s")
            await wait_until(pilot, lambda: (s := stage_of(app, "quick")) and s.status == "succeeded")
            assert stage_of(app, "quick").progress == 1.0
    run(main())
    r = ws.latest("quick")
    assert r.status == "succeeded" and r.exit_code == 0


def test_start_refused_is_explained(ws):
    ws.write(pipeline(ws.root))
    launch(ws, "slow")

    async def main():
        app = make_app(ws.root, refresh_s=0.2)
        async with app.run_test(size=(120, 40)) as pilot:
            await select(pilot, app, "slow")
            await pilot.press("s")
            await wait_until(pilot, lambda: any("already has a live run" in str(n.message)
                                                for n in app._notifications))
    run(main())
    runs.stop(Workspace.at(ws.root), "slow", grace_s=2)


def test_stop_key_stops_the_run_after_confirming(ws):
    ws.write(pipeline(ws.root))
    first = launch(ws, "slow")

    async def main():
        app = make_app(ws.root, refresh_s=0.2, stop_grace_s=2)
        async with app.run_test(size=(120, 40)) as pilot:
            await select(pilot, app, "slow")
            dialog = await open_dialog(pilot, app, "x")
            assert f"stop run {first.id} of slow" in plan_text(dialog)
            # Cancel leaves it running.
            await pilot.press("enter")
            await wait_until(pilot, lambda: not isinstance(app.screen, ActionDialog))
            assert process_alive(first.pid, first.create_time)
            dialog = await open_dialog(pilot, app, "x")
            await confirm(pilot, dialog)
            await wait_until(pilot, lambda: dialog.state == "done", timeout=30)
            assert dialog.outcome_ok and "killed" in progress_text(dialog)
    run(main())
    assert ws.latest("slow").status == "killed"
    assert not process_alive(first.pid, first.create_time)


def test_kill_workers_kills_the_process_tree_and_waits_for_gpu_memory(ws):
    """The stage exits (failed) and leaves a worker that holds GPU memory; `k`
    plans it with its pid, GPU and bytes, kills it, and sees the memory freed."""
    ws.write(pipeline(ws.root))
    launch(ws, "orphans")
    worker = int(wait_for(lambda: (ws.root / "worker.pid").exists() and (ws.root / "worker.pid").read_text()))
    ws.wait_status("orphans", ("failed",))
    worker_ct = psutil.Process(worker).create_time()
    assert process_alive(worker, worker_ct)

    async def main():
        app = make_app(ws.root, refresh_s=0.2, kill_release_timeout_s=20)
        app.fake_nvml.gpus[1].compute[worker] = 40 * GiB
        app.fake_nvml.gpus[1].mem_used = 41 * GiB
        async with app.run_test(size=(160, 48)) as pilot:
            await select(pilot, app, "orphans")
            # The GPU pane ties the worker to its run.
            await wait_until(pilot, lambda: "orphans#" in pane_text(app, "gpus"))
            dialog = await open_dialog(pilot, app, "k")
            text = plan_text(dialog)
            assert f"pid {worker:>7}" in text and "GPU 1 40.0 GiB" in text
            await confirm(pilot, dialog)
            await wait_until(pilot, lambda: dialog.state == "done", timeout=40)
            out = progress_text(dialog)
            assert dialog.outcome_ok, out
            assert "GPU memory released (40.0 GiB)" in out
    run(main())
    assert not process_alive(worker, worker_ct)


def test_kill_refused_when_nothing_runs(ws):
    ws.write(pipeline(ws.root))

    async def main():
        app = make_app(ws.root, refresh_s=0.2)
        async with app.run_test(size=(120, 40)) as pilot:
            await select(pilot, app, "quick")
            dialog = await open_dialog(pilot, app, "k")
            text = plan_text(dialog)
            # Nothing to kill is good news, not an error: said so, with what was checked.
            assert "NOTHING TO KILL" in text and "REFUSED" not in text and "no live process" in text
            assert "no process of quick" in text and "NVML shows no GPU memory held" in text
            assert not dialog.query_one("#confirm", Button).display
            await pilot.press("escape")
            await wait_until(pilot, lambda: not isinstance(app.screen, ActionDialog))
    run(main())


def test_clean_refused_for_a_succeeded_run(ws):
    ws.write(pipeline(ws.root))
    launch(ws, "extract", crash_at=1000)   # never reached (n = 20); a batch param below 1 is refused
    ws.wait_status("extract", ("succeeded",))
    files = sorted((ws.root / "out" / "hs").rglob("*"))

    async def main():
        app = make_app(ws.root, refresh_s=0.2)
        async with app.run_test(size=(120, 40)) as pilot:
            await select(pilot, app, "extract")
            dialog = await open_dialog(pilot, app, "c")
            text = plan_text(dialog)
            assert "REFUSED" in text and "succeeded" in text and "never cleaned" in text
            assert not dialog.query_one("#confirm", Button).display
            assert not dialog.query_one("#typed", Input).display
            assert str(dialog.query_one("#cancel", Button).label) == "Close"
    run(main())
    assert sorted((ws.root / "out" / "hs").rglob("*")) == files


def test_clean_asks_for_the_stage_name_then_moves_partial_files_to_trash(ws):
    ws.write(pipeline(ws.root))
    launch(ws, "extract")
    ws.wait_status("extract", ("failed",))
    out = ws.root / "out" / "hs"
    tmp = list(out.rglob("*.tmp"))
    assert tmp

    async def main():
        app = make_app(ws.root, refresh_s=0.2)
        async with app.run_test(size=(160, 48)) as pilot:
            await select(pilot, app, "extract")
            dialog = await open_dialog(pilot, app, "c")
            assert "partial file(s)" in plan_text(dialog) and tmp[0].name in plan_text(dialog)
            confirm_btn = dialog.query_one("#confirm", Button)
            assert confirm_btn.disabled
            dialog.query_one("#typed", Input).focus()
            await pilot.press(*"extrac")
            assert confirm_btn.disabled
            await pilot.press("t")
            assert not confirm_btn.disabled
            await pilot.press("enter")
            await wait_until(pilot, lambda: dialog.state == "done", timeout=30)
            assert dialog.outcome_ok and "cleaned" in progress_text(dialog)
    run(main())
    assert not list(out.rglob("*.tmp"))
    assert list((ws.root / ".eagle3" / "trash").rglob("*.tmp"))
    # Complete samples stay.
    assert (out / "rows_0-10" / "data_0.safetensors").exists()


def test_a_clean_that_another_terminal_did_first_says_nothing_to_do_not_refused(ws):
    """Issue 19 item 17 in the console: the dialog lists the partial files, a
    `clean --yes` from another terminal moves them, then the operator confirms.
    The files are gone once, as they should be: nothing to do is the outcome
    (the CLI exits 0 for it), not a red "refused"."""
    ws.write(pipeline(ws.root))
    launch(ws, "extract")
    ws.wait_status("extract", ("failed",))
    out = ws.root / "out" / "hs"
    assert list(out.rglob("*.tmp"))

    async def main():
        app = make_app(ws.root, refresh_s=0.2)
        async with app.run_test(size=(120, 40)) as pilot:
            await select(pilot, app, "extract")
            dialog = await open_dialog(pilot, app, "c")
            assert "partial file(s)" in plan_text(dialog)
            ws.cli("clean", "extract", "--yes", check=0)          # the other terminal wins
            dialog.query_one("#typed", Input).focus()
            await pilot.press(*"extract", "enter")
            await wait_until(pilot, lambda: dialog.state == "done", timeout=30)
            shown = progress_text(dialog)
            assert "nothing to do" in shown and "refused" not in shown, shown
            assert dialog.outcome_ok, shown
    run(main())
    assert not list(out.rglob("*.tmp"))
