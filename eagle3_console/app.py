"""The console: a Textual App over the snapshot and the guarded actions.

Data flow: Collector.collect() (snapshot.py) runs in a sampler thread, once a
second after each pass completes (passes never overlap, a slow disk or a hung
NVML call never blocks the UI), and posts the Snapshot to the UI thread; the
panes in widgets/ render their parts of it. Keys plan an action in a thread
(actions.plan_*), show the plan in widgets.dialogs.ActionDialog, and execute
it in a thread once confirmed, streaming progress back to the dialog.

This is the only module of eagle3_console that imports textual. cli.py calls
run_app() for the bare command and `tui`.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable

from textual import on
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.css.query import NoMatches
from textual.message import Message
from textual.screen import ModalScreen
from textual.widgets import Footer

from eagle3_console import actions
from eagle3_console import config as cfg
from eagle3_console import runs
from eagle3_console.model import Snapshot, StageStatus
from eagle3_console.workspace import Workspace
from widgets.dialogs import ActionDialog, DialogSpec, Option, QuitDialog
from widgets.disk import DiskPane
from widgets.gpus import GpuPane
from widgets.header import HeaderBar
from widgets.help import HelpScreen
from widgets.log import LogPane
from widgets.progress import ProgressPane
from widgets.stages import StageTable, is_oom

REFRESH_S = 1.0
STOP_GRACE_S = 10.0
# Reproducible screens (snapshot tests, screenshots in docs): a fixed clock and host.
ENV_FROZEN_TIME = "EAGLE3_CONSOLE_FROZEN_TIME"
ENV_FROZEN_HOST = "EAGLE3_CONSOLE_FROZEN_HOST"
DESTRUCTIVE = {"start", "restart", "stop", "kill", "clean"}
LIVE = ("running", "pending", "lost")
# An OOM (or NCCL error) seen this long before a stage's exit still explains it.
CAUSE_WINDOW_S = 120.0
# What an operator can do about a critical alert, from this console.
NEXT_STEP = {
    "oom": "select it, then k: kill its workers, c: clean the partial output, r: restart with a halved batch",
    "orphan_gpu_memory": "select the stage, then k: kill the workers that still hold GPU memory",
    "leftover_workers": "select it, then k: kill them (they may hold GPU memory and files; clean refuses while they live)",
    "stage_failed": "select it to read its log; r: restart",
    "lost": "its supervisor is gone: k kills what is left of it, r restarts",
}


@dataclass
class Frozen:
    """Shown instead of the live clock/host/workspace path (the data stay live)."""
    time: float | None = None
    host: str | None = None
    workspace: str | None = None

    @classmethod
    def from_env(cls) -> "Frozen | None":
        t, h = os.environ.get(ENV_FROZEN_TIME), os.environ.get(ENV_FROZEN_HOST)
        if t is None and h is None:
            return None
        return cls(time=float(t) if t else None, host=h)


class SnapshotReady(Message):
    def __init__(self, snap: Snapshot | None, error: str | None) -> None:
        super().__init__()
        self.snap, self.error = snap, error


class UiCall(Message):
    """A call scheduled from a thread without waiting for it (call_from_thread
    blocks, and would hang a thread whose app is already gone)."""

    def __init__(self, fn: Callable[..., Any], *args: Any) -> None:
        super().__init__()
        self.fn, self.args = fn, args


class ConsoleApp(App[int]):
    TITLE = "eagle3-console"
    # Every key is listed in the footer and in `?`; the palette would only
    # take footer room at 80 columns.
    ENABLE_COMMAND_PALETTE = False
    CSS = """
    Screen { layout: vertical; }
    #main { height: 1fr; }
    #middle { height: 18; }
    LogPane { min-height: 6; }
    /* The table gets the larger share: every column fits from about 150 columns. */
    #middle > StageTable { width: 3fr; max-height: 100%; height: 1fr; }
    #middle > #side { width: 2fr; }
    #side > ProgressPane { height: 1fr; }
    #side > DiskPane { height: 6; }
    GpuPane { max-height: 20; }

    /* Short terminals (80x24 over SSH): borders become a title rule, the GPU
       pane and the stage table shrink and scroll, the log keeps the rest. */
    Screen.-short GpuPane { max-height: 6; border: none; border-top: solid $primary-darken-1; padding: 0; }
    Screen.-short #middle { height: 10; }
    Screen.-short StageTable, Screen.-short ProgressPane, Screen.-short DiskPane, Screen.-short LogPane {
        border: none; border-top: solid $primary-darken-1;
    }
    Screen.-short StageTable:focus { border: none; border-top: solid $accent; }
    Screen.-short LogPane:focus-within { border: none; border-top: solid $accent; }
    Screen.-short #side > DiskPane { height: 4; }
    Screen.-short LogView { scrollbar-size-horizontal: 0; }
    Screen.-medium #middle { height: 14; }

    /* Narrow terminals: the selected stage's Progress and Disk sit under the table. */
    Screen.-narrow #middle { layout: vertical; }
    Screen.-narrow #middle > StageTable { width: 1fr; height: auto; max-height: 9; }
    Screen.-narrow #middle > #side { width: 1fr; height: 1fr; layout: horizontal; }
    Screen.-narrow #side > ProgressPane { width: 1fr; height: 1fr; }
    Screen.-narrow #side > DiskPane { width: 1fr; height: 1fr; }
    Screen.-narrow.-short #middle { height: 11; }
    Screen.-narrow.-short #middle > StageTable { max-height: 6; }
    """
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (120, "-wide")]
    VERTICAL_BREAKPOINTS = [(0, "-short"), (32, "-medium"), (44, "-tall")]
    BINDINGS = [
        Binding("s", "start", "start"),
        Binding("r", "restart", "restart"),
        Binding("x", "stop", "stop"),
        Binding("k", "kill", "kill"),
        Binding("c", "clean", "clean"),
        Binding("l", "focus_log", "log"),
        Binding("slash", "filter", "filter"),
        Binding("question_mark", "help", "help"),
        Binding("q", "quit_console", "quit"),
    ]

    def __init__(self, ws: Workspace, *, readonly: bool = False, nvml: Any = None, collector: Any = None,
                 refresh_s: float = REFRESH_S, frozen: Frozen | None = None, stop_grace_s: float = STOP_GRACE_S,
                 kill_release_timeout_s: float = 60.0) -> None:
        super().__init__()
        self.ws = ws
        self.readonly = readonly
        self.refresh_s = refresh_s
        self.frozen = frozen
        self.stop_grace_s = stop_grace_s
        self.kill_release_timeout_s = kill_release_timeout_s
        if nvml is None and collector is None:
            from eagle3_console.monitor.gpus import Nvml
            nvml = Nvml()
        # One NVML session for sampling and for the kill action's release check.
        self.nvml = nvml
        if collector is None:
            from eagle3_console.snapshot import Collector
            collector = Collector(ws, nvml=nvml)
        self.collector = collector
        self.snapshot: Snapshot | None = None
        self.sampler_error: str | None = None
        self.selected: str | None = None
        self.passes = 0
        self.busy: set[str] = set()          # stages with an action in flight
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._sampler: threading.Thread | None = None
        self.exit_note: str | None = None
        self._header_at = 0.0
        self._alerts_seen: set[tuple[str, str | None]] | None = None
        self._alert_first_seen: dict[tuple[str, str | None], float] = {}

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
        try:
            # The terminal went away (SSH dropped, tmux pane killed): leave, do not spin.
            self._loop.add_signal_handler(signal.SIGHUP, self._terminal_gone)
        except (NotImplementedError, RuntimeError, ValueError, AttributeError):
            pass
        self._sampler = threading.Thread(target=self._sample_loop, name="eagle3-sampler", daemon=True)
        self._sampler.start()
        self.set_interval(1.0, self._tick)

    def _terminal_gone(self) -> None:
        self.exit_note = "terminal went away"
        self.exit(0)
        # Restoring a terminal that no longer exists can block in the driver;
        # nothing is left to show, so do not linger (supervised runs are not ours).
        watchdog = threading.Timer(5.0, os._exit, args=(0,))
        watchdog.daemon = True
        watchdog.start()

    # ------------------------------------------------------------------ sampling
    def _sample_loop(self) -> None:
        """Sampler thread: one pass, then wait refresh_s (or an early wake after an action)."""
        while not self._stop.is_set():
            try:
                snap, error = self.collector.collect(), None
            except cfg.ConfigError as exc:
                snap, error = None, str(exc)
            except Exception as exc:     # a sampler failure is shown, never fatal to the UI
                snap, error = None, f"{type(exc).__name__}: {exc}"
                traceback.print_exc(file=sys.__stderr__) if os.environ.get("EAGLE3_DEBUG") else None
            if self._stop.is_set():
                break
            self._post(SnapshotReady(snap, error))
            if not _terminal_alive():
                self._post(UiCall(self._terminal_gone))
                break
            self._wake.wait(self.refresh_s)
            self._wake.clear()

    def _post(self, message: Message) -> None:
        try:
            self.post_message(message)
        except RuntimeError:       # the loop is closed: the app is gone
            self._stop.set()

    def refresh_now(self) -> None:
        """Sample again without waiting for the next tick (after an action)."""
        self._wake.set()

    def on_ui_call(self, message: UiCall) -> None:
        message.fn(*message.args)

    def on_snapshot_ready(self, message: SnapshotReady) -> None:
        self.passes += 1
        self.sampler_error = message.error
        if message.snap is not None:
            self.snapshot = message.snap
            self._announce(message.snap)
        try:
            if message.snap is not None:
                self._render_snapshot()
            self._render_header()
        except NoMatches:
            pass        # the app is closing: its panes are gone

    def _announce(self, snap: Snapshot) -> None:
        """A critical alert that appears while the console is open is also a
        notification, with what can be done about it (the header shows only
        the worst one). Alerts present at opening are the header's alone."""
        seen = {(a.code, a.stage) for a in snap.alerts if a.level == "critical"}
        now = time.monotonic()
        for key in seen:
            self._alert_first_seen.setdefault(key, now)
        if self._alerts_seen is not None:
            new: dict[str | None, Any] = {}
            # A stage whose OOM (or other cause) was announced moments ago gets no
            # second notice when it then exits: the failure is that cause's
            # consequence. A cause from long before does not hide a failure.
            explained = {a.stage for a in snap.alerts if a.level == "critical"
                         and a.code not in ("stage_failed", "leftover_workers")     # an aftermath, not a cause
                         and now - self._alert_first_seen[(a.code, a.stage)] <= CAUSE_WINDOW_S}
            for a in snap.alerts:
                if a.code == "stage_failed" and a.stage in explained:
                    continue
                if a.level == "critical" and (a.code, a.stage) not in self._alerts_seen:
                    new.setdefault(a.stage, a)
            for a in new.values():
                hint = "" if self.readonly else NEXT_STEP.get(a.code, "")
                # The header keeps the alert; the toast only has to be seen, not to cover the log.
                self.notify(a.message + (f"\n{hint}" if hint else ""), title="CRITICAL", severity="error",
                            timeout=10)
        self._alerts_seen = seen
        for key in [k for k in self._alert_first_seen if k not in seen]:
            del self._alert_first_seen[key]

    def _now(self) -> float:
        if self.frozen and self.frozen.time is not None:
            return self.frozen.time
        return time.time()

    def _tick(self) -> None:
        # The clock moves with each snapshot (one repaint a second, not two);
        # it ticks on its own only while the sampler is slow.
        if self.frozen and self.frozen.time is not None:
            return
        if time.monotonic() - self._header_at > 1.5:
            self._render_header()

    def _render_header(self) -> None:
        self._header_at = time.monotonic()
        snap = self.snapshot
        f = self.frozen
        self.query_one(HeaderBar).show(
            snap, workspace=(f and f.workspace) or (snap.workspace if snap else str(self.ws.root)),
            host=(f and f.host) or (snap.host if snap else socket.gethostname()), now=self._now(),
            readonly=self.readonly, sampler_error=self.sampler_error)

    def _render_snapshot(self) -> None:
        snap = self.snapshot
        now = self._data_now()
        self.query_one(GpuPane).show(snap.gpus)
        table = self.query_one(StageTable)
        table.show(snap.stages, now)
        # Until the operator moves the cursor, the selection follows the
        # active stage (a pipeline advancing stage by stage stays in view).
        if not table.user_moved or self.selected is None or snap.stage(self.selected) is None:
            want = self._default_stage(snap)
            if want != self.selected:
                self.selected = want
                if want:
                    table.follow(want)
        self._render_selected()

    def _data_now(self) -> float:
        """Elapsed times are measured against the snapshot's own clock (or the frozen one)."""
        if self.frozen and self.frozen.time is not None:
            return self.frozen.time
        return self.snapshot.time if self.snapshot else time.time()

    @staticmethod
    def _default_stage(snap: Snapshot) -> str | None:
        """The stage to show first: a live one, else a failed one, else the
        one that ran last (a finished pipeline shows its bench result)."""
        for wanted in (("running", "lost", "pending"), ("failed", "killed")):
            for st in snap.stages:
                if st.status in wanted:
                    return st.name
        ran = [st for st in snap.stages if st.started is not None]
        if ran:
            return max(ran, key=lambda st: st.started).name
        return snap.stages[0].name if snap.stages else None

    def _render_selected(self) -> None:
        snap = self.snapshot
        if snap is None:
            return
        st = snap.stage(self.selected) if self.selected else None
        now = self._data_now()
        self.query_one(ProgressPane).show(st, now)
        self.query_one(DiskPane).show(self.selected, snap.disk, st.outputs if st else None)
        self.query_one(LogPane).show(self.selected, st.run_id if st else None, st.log if st else None)

    @on(StageTable.Selected)
    def _stage_selected(self, message: StageTable.Selected) -> None:
        if not message.by_user:
            return          # the cursor moved because the app moved it (or the rows were redrawn)
        if message.stage != self.selected:
            self.selected = message.stage
            try:
                self._render_selected()
            except NoMatches:
                pass    # the app is closing: its panes are gone

    # ------------------------------------------------------------------ bindings
    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in DESTRUCTIVE:
            if self.readonly:
                return False       # hidden from the footer and not run
            if isinstance(self.screen, ModalScreen):
                return False
        return True

    def _stage(self) -> StageStatus | None:
        if self.snapshot is None or self.selected is None:
            self.notify("no stage selected yet", severity="warning")
            return None
        return self.snapshot.stage(self.selected)

    def action_focus_log(self) -> None:
        self.query_one(LogPane).view.focus()

    def on_log_pane_leave(self, _message: LogPane.Leave) -> None:
        # Esc from the log: keys act on the stage table's selection again, visibly.
        self.query_one(StageTable).focus()

    def action_filter(self) -> None:
        self.query_one(LogPane).open_filter()

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen(readonly=self.readonly))

    def action_quit_console(self) -> None:
        live = self.live_runs()
        if not live:
            self.exit(0)
            return

        def done(quit_: bool | None) -> None:
            if quit_:
                self.exit_note = "still running (supervised): " + ", ".join(live)
                self.exit(0)
        self.push_screen(QuitDialog(live), done)

    def live_runs(self) -> list[str]:
        if self.snapshot is None:
            return []
        return [f"{s.name} (run {s.run_id}, pid {s.pid}, {s.status})" for s in self.snapshot.stages
                if s.status in LIVE]

    # ------------------------------------------------------------------ actions
    def _thread(self, fn: Callable[[], Any], name: str) -> None:
        threading.Thread(target=fn, name=f"eagle3-{name}", daemon=True).start()

    def _call(self, fn: Callable[..., Any], *args: Any) -> None:
        """From an action thread: run fn(*args) on the UI thread."""
        self._post(UiCall(fn, *args))

    def _plan_then_ask(self, what: str, stage: str, plan_fn: Callable[[], DialogSpec],
                       execute: Callable[[ActionDialog, Option], tuple[bool, list[str]]]) -> None:
        """Plan in a thread, show the dialog, execute in a thread once confirmed."""
        if stage in self.busy:
            self.notify(f"{stage}: an action is still in progress", severity="warning")
            return

        def plan() -> None:
            try:
                spec = plan_fn()
            except (runs.Refused, cfg.ConfigError) as exc:
                spec = DialogSpec(title=f"{what} {stage}", confirm_label=what,
                                  options=[Option("refused", what, [], refusal=str(exc))])
            except Exception as exc:
                spec = DialogSpec(title=f"{what} {stage}", confirm_label=what,
                                  options=[Option("error", what, [], refusal=f"planning failed: "
                                                                           f"{type(exc).__name__}: {exc}")])
            self._call(self._ask, ActionDialog(spec, on_confirm))

        def on_confirm(dialog: ActionDialog, option: Option) -> None:
            self.busy.add(stage)

            def run() -> None:
                try:
                    ok, lines = execute(dialog, option)
                except runs.Refused as exc:
                    ok, lines = False, [f"refused: {exc}"]
                except Exception as exc:
                    ok, lines = False, [f"failed: {type(exc).__name__}: {exc}"]
                self._call(self._finished, dialog, what, stage, ok, lines)
            self._thread(run, what)

        self._thread(plan, f"plan-{what}")

    def _ask(self, dialog: ActionDialog) -> None:
        # The operator is acting: alert notifications would cover the dialog's buttons.
        self.clear_notifications()
        self.push_screen(dialog)

    def _finished(self, dialog: ActionDialog, what: str, stage: str, ok: bool, lines: list[str]) -> None:
        self.busy.discard(stage)
        if dialog.is_attached and ok and what == "restart":
            # The new run is what the operator wants to watch now: the dialog
            # gives the screen back and the outcome becomes a notification.
            dialog.finished(ok, lines)
            dialog.dismiss(None)
            self.notify("restarted: " + "; ".join(lines), timeout=8)
        elif dialog.is_attached:
            dialog.finished(ok, lines)
        else:
            self.notify(f"{what} {stage}: " + "; ".join(lines), severity="information" if ok else "error",
                        timeout=15)
        self.refresh_now()

    def _progress(self, dialog: ActionDialog) -> Callable[[str], None]:
        return lambda line: self._call(lambda: dialog.is_attached and dialog.progress(line))

    def action_start(self) -> None:
        st = self._stage()
        if st is None:
            return
        if st.name in self.busy:
            self.notify(f"{st.name}: an action is still in progress", severity="warning")
            return
        self.busy.add(st.name)
        self.notify(f"starting {st.name}...")

        def run() -> None:
            try:
                pipe = cfg.load(self.ws.config_path)
                r = runs.launch(self.ws, pipe, st.name)
                msg, sev = f"started {st.name}: run {r.id}, {r.status}, pid {r.pid}", "information"
            except (runs.Refused, cfg.ConfigError) as exc:
                msg, sev = f"start {st.name} refused: {exc}", "error"
            except Exception as exc:
                msg, sev = f"start {st.name} failed: {type(exc).__name__}: {exc}", "error"
            self._call(self._started, st.name, msg, sev)
        self._thread(run, "start")

    def _started(self, stage: str, msg: str, severity: str) -> None:
        self.busy.discard(stage)
        self.notify(msg, severity=severity, timeout=10 if severity == "error" else 5)
        self.refresh_now()

    def action_stop(self) -> None:
        st = self._stage()
        if st is None:
            return
        grace = self.stop_grace_s

        def plan() -> DialogSpec:
            if st.status not in LIVE:
                last = f"its last run {st.run_id} {st.status}" if st.run_id else "it never ran"
                return DialogSpec(title=f"Stop {st.name}", confirm_label="Stop", options=[Option(
                    "stop", "stop", [], f"{last}; no live run of {st.name!r}", refusal_label="NOTHING TO STOP")])
            refusal = None
            lines = [f"stop run {st.run_id} of {st.name} (pid {st.pid}, {st.status}): SIGTERM its process group, "
                     f"SIGKILL after {grace:g} s"]
            return DialogSpec(title=f"Stop {st.name}", confirm_label="Stop",
                              options=[Option("stop", "stop", lines, refusal)])

        def execute(dialog: ActionDialog, option: Option) -> tuple[bool, list[str]]:
            r = runs.stop(self.ws, st.name, grace_s=grace)
            return r.status in ("killed", "failed", "succeeded"), [f"run {r.id} of {st.name}: {r.status}"]
        self._plan_then_ask("stop", st.name, plan, execute)

    def action_kill(self) -> None:
        st = self._stage()
        if st is None:
            return

        def plan() -> DialogSpec:
            p = actions.plan_kill(self.ws, st.name, nvml=self.nvml)
            self._kill_plan = p
            gpus = (f"GPU memory cannot be checked here: {p.gpus_unavailable}" if p.gpus_unavailable else
                    "NVML shows no GPU memory held by its processes")
            if p.refusal and not p.procs:
                # Good news after an OOM: say so, and what was checked.
                option = Option("kill", "kill", [f"no process of {st.name} (its runs, their process groups and "
                                                 f"sessions) is alive", gpus], p.refusal,
                                refusal_label="NOTHING TO KILL")
                notes = (["Next after an OOM: c cleans the partial output, r restarts with a halved batch."]
                         if is_oom(st) else [])
            else:
                option = Option("kill", "kill", p.lines(), p.refusal)
                notes = ["After the signals, the dialog waits until NVML shows the GPU memory released, or says "
                         "which pid still holds what." if not p.gpus_unavailable else
                         f"After the signals, the dialog waits for the processes to exit ({gpus})."]
            return DialogSpec(title=f"Kill the workers of {st.name}", confirm_label="Kill", options=[option],
                              notes=notes)

        def execute(dialog: ActionDialog, option: Option) -> tuple[bool, list[str]]:
            res = actions.execute_kill(self.ws, self._kill_plan, progress=self._progress(dialog), nvml=self.nvml,
                                       release_timeout_s=self.kill_release_timeout_s)
            return res.ok, res.lines()
        self._plan_then_ask("kill", st.name, plan, execute)

    def action_clean(self) -> None:
        st = self._stage()
        if st is None:
            return

        def plan() -> DialogSpec:
            p = actions.plan_clean(self.ws, st.name)
            self._clean_plan = p
            return DialogSpec(title=f"Clean the partial outputs of {st.name}", confirm_label="Clean",
                              options=[Option("clean", "clean", p.lines(), p.refusal)],
                              type_to_confirm=st.name)

        def execute(dialog: ActionDialog, option: Option) -> tuple[bool, list[str]]:
            res = actions.execute_clean(self.ws, self._clean_plan)
            return not res.failed, res.lines()
        self._plan_then_ask("clean", st.name, plan, execute)

    def action_restart(self) -> None:
        st = self._stage()
        if st is None:
            return
        # Always plan the kill: a live run, or workers that outlived a failed one, are listed in
        # the plan (pid, GPU, memory) and killed before the restart; nothing alive -> no kill.
        kill = True

        def plan() -> DialogSpec:
            base = actions.plan_restart(self.ws, st.name, kill=kill, nvml=self.nvml)
            plans = {"same": base}
            options = [Option("same", "same parameters", base.lines(), base.refusal)]
            if base.suggestion:
                halved = actions.plan_restart(self.ws, st.name, kill=kill, halve_batch=True, nvml=self.nvml)
                name, old, new = base.suggestion
                plans["halved"] = halved
                options.insert(0, Option("halved", f"{name} {old} -> {new} (halved after the OOM)",
                                         halved.lines(), halved.refusal))
            self._restart_plans = plans
            alive = base.kill is not None and bool(base.kill.procs)
            return DialogSpec(title=f"Restart {st.name}" + (" (its live processes are killed first)" if alive else ""),
                              confirm_label="Restart", options=options, selected=options[0].key)

        def execute(dialog: ActionDialog, option: Option) -> tuple[bool, list[str]]:
            r = actions.execute_restart(self.ws, self._restart_plans[option.key], progress=self._progress(dialog),
                                        nvml=self.nvml)
            return r.status in LIVE or r.status == "succeeded", [f"run {r.id} of {st.name}: {r.status}, pid {r.pid}"]
        self._plan_then_ask("restart", st.name, plan, execute)

    # ------------------------------------------------------------------ shutdown
    def on_unmount(self) -> None:
        self._stop.set()
        self._wake.set()

    def shutdown(self) -> None:
        """After run(): stop sampling and release NVML (a sampler stuck in a
        slow call is a daemon thread and does not hold the exit)."""
        self._stop.set()
        self._wake.set()
        if self._sampler is not None:
            self._sampler.join(timeout=2.0)
        if self._sampler is None or not self._sampler.is_alive():
            try:
                self.collector.close()
            except Exception:
                pass


def _terminal_alive() -> bool:
    """False once the controlling terminal is gone (a hung-up tty fails ioctls)."""
    try:
        os.get_terminal_size(sys.__stdout__.fileno())
        return True
    except (OSError, ValueError, AttributeError):
        # Not a terminal at all (headless tests): nothing went away.
        return not _was_tty
    

_was_tty = bool(getattr(sys.__stdout__, "isatty", lambda: False)())


def run_app(ws: Workspace, readonly: bool = False, **kw: Any) -> int:
    """Open the console on `ws`; returns the process exit code. Running stages
    keep running after it exits: they are supervised, never its children."""
    kw.setdefault("frozen", Frozen.from_env())
    app = ConsoleApp(ws, readonly=readonly, **kw)
    try:
        code = app.run()
    finally:
        app.shutdown()
    if app.exit_note:
        print(f"eagle3-console: {app.exit_note}", file=sys.stderr)
    else:
        live = app.live_runs()
        if live:
            print("eagle3-console: still running (supervised): " + ", ".join(live), file=sys.stderr)
    return code or 0
