"""Confirm dialogs of the guarded actions, and the quit notice.

An ActionDialog shows the exact plan an action built (eagle3_console.actions
plans' lines(), or the app's stop plan), its refusal when it cannot be done,
and - once confirmed - the progress and result of the execution. Focus starts
on Cancel (for a clean, on the name to type); a refused plan has no confirm
button at all. Options (restart after
an OOM: as before / halved batch) each carry their own plan lines, so the
operator sees the argv that will run for the option selected. A clean asks
to type the stage name first.

The dialog does not act: confirming calls the app's `on_confirm(dialog,
option)`, which runs the action off the UI thread and reports back through
progress() and finished()."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Footer, Input, Label, RadioButton, RadioSet, Static


@dataclass
class Option:
    key: str
    label: str
    lines: list[str]
    refusal: str | None = None
    # How a refusal is headed: "NOTHING TO KILL" reads as the good news it is.
    refusal_label: str = "REFUSED"
    # The plan these lines describe, executed as is on confirm: each dialog
    # carries its own, so a second dialog opened meanwhile cannot swap it.
    plan: Any = None


@dataclass
class DialogSpec:
    title: str
    confirm_label: str
    options: list[Option]
    type_to_confirm: str | None = None     # the text the operator must type (clean: the stage name)
    selected: str | None = None            # option key selected at first
    notes: list[str] = field(default_factory=list)


def plan_text(lines: list[str], refusal: str | None, label: str = "REFUSED") -> Text:
    t = Text(no_wrap=False)
    if refusal:
        bad = label == "REFUSED"
        t.append(f"{label}: ", "bold white on red" if bad else "bold black on yellow")
        t.append(refusal + "\n", "bold red" if bad else "bold")
        if lines and lines != [f"refused: {refusal}"]:
            t.append("\n")
    for ln in lines:
        if ln == f"refused: {refusal}":
            continue
        style = "bold" if ln.startswith("argv:") else ""
        t.append(ln + "\n", style)
    t.rstrip()
    return t


class ActionDialog(ModalScreen[None]):
    DEFAULT_CSS = """
    ActionDialog { align: center middle; }
    ActionDialog > #dialog { width: 92%; max-width: 140; height: auto; max-height: 95%;
                             border: thick $error; background: $surface; padding: 0 1; }
    ActionDialog #title { text-style: bold; width: 1fr; padding: 0 0 1 0; }
    ActionDialog #plan { height: auto; max-height: 16; }
    ActionDialog #options { height: auto; margin: 1 0 0 0; }
    ActionDialog #typed { margin: 1 0 0 0; }
    ActionDialog #progress { height: auto; max-height: 10; display: none; border-top: solid $primary; }
    ActionDialog.-running #progress { display: block; }
    ActionDialog #buttons { height: 3; margin: 1 0 0 0; align-horizontal: right; }
    ActionDialog Button { margin: 0 0 0 2; }
    """
    BINDINGS = [Binding("escape", "cancel", "cancel / close")]

    def __init__(self, spec: DialogSpec, on_confirm: Callable[["ActionDialog", Option], None]) -> None:
        super().__init__()
        self.spec = spec
        self.on_confirm = on_confirm
        self.option = next((o for o in spec.options if o.key == spec.selected), spec.options[0])
        self.state = "asking"        # asking | running | done
        self.outcome_ok: bool | None = None
        self._progress: list[str] = []

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog"):
            yield Label(Text(self.spec.title), id="title")
            with VerticalScroll(id="plan"):
                yield Static(self._plan(), id="plan-text")
            if len(self.spec.options) > 1:
                with RadioSet(id="options"):
                    for o in self.spec.options:
                        yield RadioButton(o.label, value=o is self.option, id=f"opt-{o.key}")
            for n in self.spec.notes:
                yield Static(Text(n, "italic"))
            if self.spec.type_to_confirm is not None:
                yield Input(placeholder=f"type {self.spec.type_to_confirm!r} to confirm", id="typed")
            with VerticalScroll(id="progress"):
                yield Static("", id="progress-text")
            with Horizontal(id="buttons"):
                yield Button("Cancel", id="cancel", variant="primary")
                yield Button(self.spec.confirm_label, id="confirm", variant="error")
        # The dialog's own keys, over the main screen's footer (whose keys do not apply now).
        yield Footer()

    def _plan(self) -> Text:
        text = plan_text(self.option.lines, self.option.refusal, self.option.refusal_label)
        if len(self.spec.options) > 1:
            # Which option this plan is for, in words: the radio buttons differ
            # by colour only (and NO_COLOR has none).
            text = Text.assemble((f"▶ {self.option.label}", "bold reverse"), "\n", text)
        return text

    def on_mount(self) -> None:
        self._sync()
        if self.spec.type_to_confirm is not None and self.option.refusal is None:
            # Typing the name is the deliberate act (the confirm button stays
            # disabled until it matches): keys typed at once must land there.
            self.query_one("#typed", Input).focus()
        else:
            self.query_one("#cancel", Button).focus()

    def on_resize(self) -> None:
        self._fit()

    def _fit(self) -> None:
        """Give the plan what the rest of the dialog leaves: on a 24-line
        terminal a long plan must not push the name to type and the buttons
        off the screen (the plan scrolls instead)."""
        if not self.size.height:
            return
        width = max(10, min(140, int(self.size.width * 0.92)) - 4)
        reserved = 2 + 2 + 4                       # border, title, buttons
        if len(self.spec.options) > 1:
            reserved += len(self.spec.options) + 3
        reserved += sum(len(n) // width + 1 for n in self.spec.notes)
        if self.spec.type_to_confirm is not None and self.state == "asking" and self.option.refusal is None:
            reserved += 4
        progress = 0
        if self.state != "asking":
            progress = min(10, max(2, len(self._progress) + 1))
            reserved += progress
        room = int(self.size.height * 0.95) - reserved
        self.query_one("#plan").styles.max_height = max(3, min(16, room))
        if progress:
            self.query_one("#progress").styles.max_height = max(3, min(10, progress, room + progress - 3))

    def _sync(self) -> None:
        self._fit()
        confirm = self.query_one("#confirm", Button)
        refused = self.option.refusal is not None
        confirm.display = self.state == "asking" and not refused
        typed_ok = True
        if self.spec.type_to_confirm is not None:
            typed = self.query_one("#typed", Input)
            typed.display = self.state == "asking" and not refused
            typed_ok = typed.value.strip() == self.spec.type_to_confirm
        confirm.disabled = not typed_ok
        self.query_one("#cancel", Button).label = "Cancel" if self.state == "asking" and not refused else "Close"

    def on_radio_set_changed(self, event: RadioSet.Changed) -> None:
        key = (event.pressed.id or "").removeprefix("opt-")
        self.option = next(o for o in self.spec.options if o.key == key)
        self.query_one("#plan-text", Static).update(self._plan())
        self._sync()

    def on_input_changed(self, event: Input.Changed) -> None:
        self._sync()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if not self.query_one("#confirm", Button).disabled:
            self._confirm()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "confirm":
            self._confirm()
        else:
            self.action_cancel()

    def _confirm(self) -> None:
        if self.state != "asking" or self.option.refusal is not None:
            return
        self.state = "running"
        self.add_class("-running")
        if len(self.spec.options) > 1:
            self.query_one("#options", RadioSet).disabled = True
        self._sync()
        self.query_one("#cancel", Button).focus()
        self.progress("working...")
        self.on_confirm(self, self.option)

    def progress(self, line: str) -> None:
        self._progress.append(line)
        self._fit()
        self.query_one("#progress-text", Static).update(Text("\n".join(self._progress)))
        self.query_one("#progress", VerticalScroll).scroll_end(animate=False)

    def finished(self, ok: bool, lines: list[str]) -> None:
        self.state = "done"
        self.outcome_ok = ok
        for ln in lines:
            # The result repeats what the progress already said (kill reports
            # its outcome as it goes): say each thing once.
            if not any(ln in shown for shown in self._progress):
                self.progress(ln)
        self.progress("done." if ok else "NOT done: see above.")
        self.query_one("#dialog").styles.border = ("thick", "green" if ok else "red")
        self._sync()

    def action_cancel(self) -> None:
        # Closing while the action runs is allowed: it continues, and the app
        # reports its outcome as a notification.
        self.dismiss(None)


class QuitDialog(ModalScreen[bool]):
    """Quitting leaves supervised runs running: say which, then quit or not."""

    DEFAULT_CSS = """
    QuitDialog { align: center middle; }
    QuitDialog > #dialog { width: 80%; max-width: 100; height: auto; border: thick $primary;
                           background: $surface; padding: 0 1; }
    QuitDialog #buttons { height: 3; margin: 1 0 0 0; align-horizontal: right; }
    QuitDialog Button { margin: 0 0 0 2; }
    """
    BINDINGS = [Binding("escape", "stay", "stay"), Binding("q", "quit_now", "quit")]

    def __init__(self, live: list[str]) -> None:
        super().__init__()
        self.live = live

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog"):
            yield Static(Text("Quit the console?", "bold"))
            yield Static(Text("These runs keep running after you quit (they are supervised, not children "
                              "of the console; reopen eagle3-console to reattach):\n  " + "\n  ".join(self.live)))
            with Horizontal(id="buttons"):
                yield Button("Stay", id="stay")
                yield Button("Quit", id="quit", variant="primary")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#quit", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "quit")

    def action_stay(self) -> None:
        self.dismiss(False)

    def action_quit_now(self) -> None:
        self.dismiss(True)
