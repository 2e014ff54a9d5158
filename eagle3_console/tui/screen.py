"""The console's one screen: composes the panes, renders each snapshot, keeps
the selection, and runs the guarded actions of guarded.ACTIONS.

Data flow: the sampler worker (one Collector.collect() pass at a time, in a
daemon thread, refresh_s after the previous pass ended, or at once after an
action) hands each Snapshot to show(); the panes (panes/) render their
parts of it; announce.announce() says which new critical alerts become a
notification. Keys run a guarded action: plan in a thread, the dialog shows
that plan, confirming executes it in a thread (guarded.py says why the plan
travels inside the dialog).
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys
import threading
import time
import traceback
from typing import TYPE_CHECKING, Any, Callable

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.css.query import NoMatches
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Footer

from eagle3_console.tui import announce
from eagle3_console.kernel import config as cfg
from eagle3_console import runs
from eagle3_console.kernel.model import Snapshot, StageStatus
from eagle3_console.kernel.registry import MAY_BE_ALIVE, RunStatus
from eagle3_console.tui.guarded import ACTIONS, Context, Guarded, refused_spec
from eagle3_console.tui.dialogs import ActionDialog, DialogSpec, Option, QuitDialog
from eagle3_console.tui.panes.disk import DiskPane
from eagle3_console.tui.panes.gpus import GpuPane
from eagle3_console.tui.panes.header import HeaderBar
from eagle3_console.tui.help import HelpScreen
from eagle3_console.tui.panes.log import LogPane
from eagle3_console.tui.panes.progress import ProgressPane
from eagle3_console.tui.panes.stages import StageTable

if TYPE_CHECKING:
    from eagle3_console.tui.host import ConsoleHost


class UiCall(Message):
    """A call scheduled from a thread without waiting for it (call_from_thread
    blocks, and would hang a thread whose app is already gone)."""

    def __init__(self, fn: Callable[..., Any], *args: Any) -> None:
        super().__init__()
        self.fn, self.args = fn, args


def default_stage(snap: Snapshot) -> str | None:
    """The stage to show first: a live one, else a failed one, else the one
    that ran last (a finished pipeline shows its bench result)."""
    for wanted in (MAY_BE_ALIVE, (RunStatus.FAILED, RunStatus.KILLED)):
        for st in snap.stages:
            if st.status in wanted:
                return st.name
    ran = [st for st in snap.stages if st.started is not None]
    if ran:
        return max(ran, key=lambda st: st.started).name
    return snap.stages[0].name if snap.stages else None


class ConsoleScreen(Screen[None]):
    BINDINGS = [
        Binding("s", "guard('start')", "start"),
        Binding("r", "guard('restart')", "restart"),
        Binding("x", "guard('stop')", "stop"),
        Binding("k", "guard('kill')", "kill"),
        Binding("c", "guard('clean')", "clean"),
        Binding("l", "focus_log", "log"),
        Binding("slash", "filter", "filter"),
        Binding("question_mark", "help", "help"),
        Binding("q", "quit_console", "quit"),
    ]
    app: "ConsoleHost"       # the App that holds it (tui/app.py), as the screen sees it

    def __init__(self) -> None:
        super().__init__()
        self.snapshot: Snapshot | None = None
        self.sampler_error: str | None = None
        self.selected: str | None = None
        self.passes = 0
        self.busy: set[str] = set()          # stages with an action in flight
        self._wake = asyncio.Event()
        self._idle = threading.Event()       # no collect() pass in flight
        self._idle.set()
        self._header_at = 0.0
        self._first_seen: dict[announce.Key, float] = {}

    # ------------------------------------------------------------------ layout
    def compose(self) -> ComposeResult:
        yield HeaderBar(id="header")
        with Vertical(id="main"):
            yield GpuPane(id="gpus")
            with Horizontal(id="middle"):
                yield StageTable(id="stages")
                with Vertical(id="side"):
                    yield ProgressPane(id="progress")
                    yield DiskPane(id="disk")
            yield LogPane(id="log")
        yield Footer()

    def on_mount(self) -> None:
        self._render_header()
        self.query_one(StageTable).focus()
        self.run_worker(self._sample(), name="sampler", group="sampler", exclusive=True)
        self.set_interval(1.0, self._tick)

    # ------------------------------------------------------------------ sampling
    async def _sample(self) -> None:
        """The sampler: one pass, then wait refresh_s (or an early wake after
        an action). Each pass runs in a daemon thread: a hung NVML call or a
        slow disk never blocks the UI, and never holds the exit."""
        loop = asyncio.get_running_loop()
        while True:
            done: asyncio.Future = loop.create_future()
            self._idle.clear()
            threading.Thread(target=self._one_pass, args=(loop, done), name="eagle3-sampler", daemon=True).start()
            snap, error = await done
            self.show(snap, error)
            if not self.app.terminal_alive():
                self.app.terminal_gone()
                return
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), self.app.refresh_s)
            except TimeoutError:
                pass

    def _one_pass(self, loop: asyncio.AbstractEventLoop, done: asyncio.Future) -> None:
        try:
            result: tuple[Snapshot | None, str | None] = (self.app.collector.collect(), None)
        except cfg.ConfigError as exc:
            result = (None, str(exc))
        except Exception as exc:     # a sampler failure is shown, never fatal to the UI
            result = (None, f"{type(exc).__name__}: {exc}")
            if os.environ.get("EAGLE3_DEBUG"):
                traceback.print_exc(file=sys.__stderr__)
        finally:
            self._idle.set()
        try:
            loop.call_soon_threadsafe(lambda: done.done() or done.set_result(result))
        except RuntimeError:
            pass        # the loop is closed: the console is gone

    def wait_idle(self, timeout: float) -> bool:
        return self._idle.wait(timeout)

    def refresh_now(self) -> None:
        """Sample again without waiting for the next tick (after an action)."""
        self._wake.set()

    def show(self, snap: Snapshot | None, error: str | None) -> None:
        self.passes += 1
        self.sampler_error = error
        if snap is not None:
            previous, self.snapshot = self.snapshot, snap
            self._announce(previous, snap)
        try:
            if snap is not None:
                self._render_snapshot()
            self._render_header()
        except NoMatches:
            pass        # the console is closing: its panes are gone

    def _announce(self, previous: Snapshot | None, snap: Snapshot) -> None:
        new, self._first_seen = announce.announce(previous, snap, self._first_seen)
        for a in new:
            # The header keeps the alert; the toast only has to be seen, not to cover the log.
            self.app.notify(announce.notice_text(a, self.app.readonly), title="CRITICAL", severity="error",
                            timeout=10)

    # ------------------------------------------------------------------ rendering
    def _now(self) -> float:
        f = self.app.frozen
        return f.time if f and f.time is not None else time.time()

    def _data_now(self) -> float:
        """Elapsed times are measured against the snapshot's own clock (or the frozen one)."""
        f = self.app.frozen
        if f and f.time is not None:
            return f.time
        return self.snapshot.time if self.snapshot else time.time()

    def _tick(self) -> None:
        # The clock moves with each snapshot (one repaint a second, not two);
        # it ticks on its own only while the sampler is slow.
        if self.app.frozen and self.app.frozen.time is not None:
            return
        if time.monotonic() - self._header_at > 1.5:
            self._render_header()

    def _render_header(self) -> None:
        self._header_at = time.monotonic()
        snap, f = self.snapshot, self.app.frozen
        self.query_one(HeaderBar).show(
            snap, workspace=(f and f.workspace) or (snap.workspace if snap else str(self.app.ws.root)),
            host=(f and f.host) or (snap.host if snap else socket.gethostname()), now=self._now(),
            readonly=self.app.readonly, sampler_error=self.sampler_error)

    def _render_snapshot(self) -> None:
        snap = self.snapshot
        self.query_one(GpuPane).show(snap.gpus, snap.hosts)
        table = self.query_one(StageTable)
        table.show(snap.stages, self._data_now())
        # Until the operator moves the cursor, the selection follows the
        # active stage (a pipeline advancing stage by stage stays in view).
        if not table.user_moved or self.selected is None or snap.stage(self.selected) is None:
            want = default_stage(snap)
            if want != self.selected:
                self.selected = want
                if want:
                    table.follow(want)
        self._render_selected()

    def _render_selected(self) -> None:
        snap = self.snapshot
        if snap is None:
            return
        st = snap.stage(self.selected) if self.selected else None
        self.query_one(ProgressPane).show(st, self._data_now())
        self.query_one(DiskPane).show(self.selected, snap.disk, st.outputs if st else None)
        self.query_one(LogPane).show(self.selected, st.run_id if st else None, st.log if st else None)

    @on(StageTable.Selected)
    def _stage_selected(self, message: StageTable.Selected) -> None:
        if not message.by_user:
            return          # the cursor moved because the console moved it (or the rows were redrawn)
        if message.stage != self.selected:
            self.selected = message.stage
            try:
                self._render_selected()
            except NoMatches:
                pass    # the console is closing: its panes are gone

    # ------------------------------------------------------------------ keys
    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "guard" and self.app.readonly:
            return False       # hidden from the footer and not run
        return True

    def action_focus_log(self) -> None:
        self.query_one(LogPane).view.focus()

    def on_log_pane_leave(self, _message: LogPane.Leave) -> None:
        # Esc from the log: keys act on the stage table's selection again, visibly.
        self.query_one(StageTable).focus()

    def action_filter(self) -> None:
        self.query_one(LogPane).open_filter()

    def action_help(self) -> None:
        self.app.push_screen(HelpScreen(readonly=self.app.readonly))

    def action_quit_console(self) -> None:
        live = self.live_runs()
        if not live:
            self.app.exit(0)
            return

        def done(quit_: bool | None) -> None:
            if quit_:
                self.app.exit_note = "still running (supervised): " + ", ".join(live)
                self.app.exit(0)
        self.app.push_screen(QuitDialog(live), done)

    def live_runs(self) -> list[str]:
        if self.snapshot is None:
            return []
        return [f"{s.name} (run {s.run_id}, pid {s.pid}, {s.status})" for s in self.snapshot.stages
                if s.status in MAY_BE_ALIVE]

    # ------------------------------------------------------------------ guarded actions
    def action_guard(self, verb: str) -> None:
        if self.snapshot is None or self.selected is None:
            self.app.notify("no stage selected yet", severity="warning")
            return
        st = self.snapshot.stage(self.selected)
        if st is None:
            return
        if st.name in self.busy:
            self.app.notify(f"{st.name}: an action is still in progress", severity="warning")
            return
        a = self.app
        ctx = Context(a.ws, a.nvml, self.snapshot, stop_grace_s=a.stop_grace_s,
                      kill_release_timeout_s=a.kill_release_timeout_s)
        self._thread(lambda: self._plan(ACTIONS[verb], ctx, st), f"plan-{verb}")

    def _thread(self, fn: Callable[[], Any], name: str) -> None:
        threading.Thread(target=fn, name=f"eagle3-{name}", daemon=True).start()

    def _call(self, fn: Callable[..., Any], *args: Any) -> None:
        """From an action thread: run fn(*args) on the UI thread."""
        try:
            self.post_message(UiCall(fn, *args))
        except RuntimeError:
            pass            # the loop is closed: the console is gone

    def on_ui_call(self, message: UiCall) -> None:
        message.fn(*message.args)

    def _plan(self, g: Guarded, ctx: Context, st: StageStatus) -> None:
        """Action thread: plan, then ask (or, with nothing to confirm, execute at once)."""
        try:
            planned: DialogSpec | Option = g.plan(ctx, st)
        except (runs.Refused, cfg.ConfigError) as exc:
            planned = refused_spec(g.verb, st.name, str(exc))
        except Exception as exc:
            planned = refused_spec(g.verb, st.name, f"planning failed: {type(exc).__name__}: {exc}")
        if isinstance(planned, Option):
            self._call(self._execute_now, g, ctx, st, planned)
            return
        # The dialog carries its options, and each option its plan: confirming executes that one.
        self._call(self._ask, ActionDialog(planned, lambda dialog, option: self._confirmed(g, ctx, st, dialog, option)))

    def _ask(self, dialog: ActionDialog) -> None:
        # The operator is acting: alert notifications would cover the dialog's buttons.
        self.app.clear_notifications()
        self.app.push_screen(dialog)

    def _execute_now(self, g: Guarded, ctx: Context, st: StageStatus, option: Option) -> None:
        if st.name in self.busy:
            self.app.notify(f"{st.name}: an action is still in progress", severity="warning")
            return
        self.app.notify(f"{g.verb} {st.name}...")
        self._confirmed(g, ctx, st, None, option)

    def _confirmed(self, g: Guarded, ctx: Context, st: StageStatus, dialog: ActionDialog | None,
                   option: Option) -> None:
        self.busy.add(st.name)
        progress = (lambda line: self._call(lambda: dialog.is_attached and dialog.progress(line))) if dialog \
            else (lambda line: None)

        def execute() -> None:
            try:
                ok, lines = g.execute(ctx, st, option, progress)
            except runs.NothingToDo as exc:
                # Another terminal did it first (a clean that raced ours): done, not a failure.
                ok, lines = True, [f"nothing to do: {exc}"]
            except runs.Refused as exc:
                ok, lines = False, [f"refused: {exc}"]
            except Exception as exc:
                ok, lines = False, [f"failed: {type(exc).__name__}: {exc}"]
            self._call(self._finished, g, dialog, st.name, ok, lines)
        self._thread(execute, g.verb)

    def _finished(self, g: Guarded, dialog: ActionDialog | None, stage: str, ok: bool, lines: list[str]) -> None:
        self.busy.discard(stage)
        attached = dialog is not None and dialog.is_attached
        if attached:
            dialog.finished(ok, lines)
        if attached and ok and g.closes_on_success:
            # The new run is what the operator wants to watch now: the dialog
            # gives the screen back and the outcome becomes a notification.
            dialog.dismiss(None)
            self.app.notify(f"{g.verb}: " + "; ".join(lines), timeout=8)
        elif not attached:
            self.app.notify(f"{g.verb} {stage}: " + "; ".join(lines), severity="information" if ok else "error",
                            timeout=5 if ok else 15)
        self.refresh_now()
