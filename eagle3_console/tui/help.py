"""Help screen: the keys, what each guarded action does, and where its plan
comes from. Static text; the app passes whether it is read-only."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Footer, Static

KEYS = [
    ("up/down, enter", "select a stage (the Progress, Disk and Log panes follow it)", False),
    ("tab", "move focus between the stage table and the log", False),
    ("l", "focus the log (up/down/pgup/pgdn scroll; end follows again)", False),
    ("/", "filter the log (case-insensitive); esc clears the filter", False),
    ("esc", "in the log: clear the filter, or (none) go back to the stage table", False),
    ("s", "start the selected stage (refused when its dependencies have not succeeded)", True),
    ("r", "restart the selected stage; after an OOM it offers the halved batch size and shows the argv", True),
    ("x", "stop the selected stage: SIGTERM its process group, SIGKILL after 10 s", True),
    ("k", "kill the stage's workers (orphans included) and wait until their GPU memory is back", True),
    ("c", "clean the stage's partial outputs (type the stage name; complete outputs are never cleaned)", True),
    ("?", "this help", False),
    ("q", "quit (running stages keep running: they are supervised, not children of the console)", False),
]


class HelpScreen(ModalScreen[None]):
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll { width: 90%; max-width: 110; height: auto; max-height: 90%;
                                  border: thick $primary; background: $surface; padding: 0 1; }
    """
    BINDINGS = [Binding("escape,q,question_mark", "close", "close")]

    def __init__(self, readonly: bool = False) -> None:
        super().__init__()
        self.readonly = readonly

    def compose(self) -> ComposeResult:
        table = Table(box=None, show_header=False, padding=(0, 2, 0, 0), expand=True)
        table.add_column("key", style="bold cyan", no_wrap=True)
        table.add_column("what", ratio=1)
        for key, what, destructive in KEYS:
            if destructive and self.readonly:
                continue
            table.add_row(key, what)
        with VerticalScroll():
            yield Static(Text("eagle3-console keys" + (" (read-only: actions hidden)" if self.readonly else ""),
                              "bold"))
            yield Static(table)
            yield Static(Text("Every destructive action first shows its exact plan (processes with pid, GPU and "
                              "memory; files with counts and bytes) with the focus on Cancel.", "italic"))
            yield Static(Text("The selection follows the active stage (running, else failed, else the last run) "
                              "until you move the cursor. The stages table's result column is bench's acceptance "
                              "length (AL: completion tokens / verify steps, the bonus token included, as SGLang counts it); "
                              "select bench for the whole "
                              "result. Narrow terminals drop the started and run columns.", "italic"))
        yield Footer()

    def action_close(self) -> None:
        self.dismiss(None)
