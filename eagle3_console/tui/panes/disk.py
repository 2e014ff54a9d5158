"""Disk pane of the selected stage's outputs: written vs estimate vs free
space, the projected final size, and the alert when it will not fit.

Renders the Snapshot.disk entries (DiskUsage) of one stage."""

from __future__ import annotations

from rich.console import Group
from rich.padding import Padding
from rich.progress_bar import ProgressBar
from rich.text import Text
from textual.containers import VerticalScroll

from eagle3_console.kernel.model import DiskUsage
from eagle3_console.kernel.units import si_bytes
from eagle3_console.tui.panes import fmt
from eagle3_console.tui.panes.body import Body, retitle


def usage_lines(d: DiskUsage, width: int | None = None) -> list:
    """The verdict first when the output will not fit (a short pane must not
    scroll it away), then where, how much, and a bar of written vs final."""
    out: list = []
    final = d.projected_bytes or d.estimate_bytes
    upper = d.final_kind == "upper_bound"
    if d.fits is False:
        need = (final or 0) - d.written_bytes
        said = f"MAY NOT FIT: needs at most {fmt.nbytes(need)}" if upper else \
            f"WILL NOT FIT: needs {fmt.nbytes(need)} more"
        out.append(Text(f"{said}, {fmt.nbytes(d.free_bytes)} free", "bold white on red"))
    out.append(Text(fmt.path_tail(d.path, width), "cyan", no_wrap=True))
    t = Text()
    t.append("written ", "dim")
    t.append(fmt.nbytes(d.written_bytes), "bold")
    t.append(f" ({fmt.count(d.files)} file{'' if d.files == 1 else 's'})", "dim")
    if d.estimate_kind in ("upper_bound", "exact", "metadata") and d.estimate_bytes is not None:
        # The hidden states' figure, in both units (2.1T binary is the 2.35 TB a disk's label says).
        t.append(f" of {d.estimate_label} ", "dim")
        t.append(f"{fmt.nbytes(d.estimate_bytes)} ({si_bytes(d.estimate_bytes)})")
    else:
        t.append(" of est. ", "dim")
        t.append(fmt.nbytes(d.estimate_bytes))
    t.append("\nprojected ", "dim")
    t.append(fmt.nbytes(d.projected_bytes))
    if d.projected_bytes is not None:
        t.append(" measured", "dim")
    t.append("  free ", "dim")
    t.append(fmt.nbytes(d.free_bytes), "bold")
    t.append(f" of {fmt.nbytes(d.total_bytes)}", "dim")
    out.append(t)
    if final:
        # Padding ends the bar's line (a bare ProgressBar does not).
        out.append(Padding(ProgressBar(total=1.0, completed=min(1.0, d.written_bytes / final), width=None,
                                       complete_style="blue", finished_style="blue"), 0))
    if d.estimate_basis:
        # Last: a short pane (80x24) cuts how the figure was made, not the figure.
        out.append(Text("= " + d.estimate_basis, "dim"))
    return out


def verdict(usages: list[DiskUsage]) -> str:
    """For the pane's title, which stays visible when the pane is short."""
    if any(d.fits is False and d.final_kind != "upper_bound" for d in usages):
        return " - WILL NOT FIT"
    if any(d.fits is False for d in usages):
        return " - MAY NOT FIT (upper bound)"
    if usages and all(d.fits for d in usages):
        return " - fits"
    return ""


class DiskPane(VerticalScroll, can_focus=False):
    DEFAULT_CSS = """
    DiskPane { border: round $primary-darken-1; padding: 0 1; scrollbar-size-vertical: 0; }
    """

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.border_title = "Disk"
        self._body = Body("")
        self._last: tuple | None = None

    def compose(self):
        yield self._body

    def show(self, stage: str | None, usages: list[DiskUsage], outputs: list[str] | None = None) -> None:
        self._last = (stage, usages, outputs)
        mine = [d for d in usages if d.stage == stage]
        title = f"Disk: {stage}{verdict(mine)}" if stage else "Disk"
        retitle(self, title)
        if not mine:
            if outputs:
                # Declared but not written yet (the stage has not run): say where it will write.
                self._body.paint(("none", tuple(outputs)), Text(
                    "nothing written yet to " + ", ".join(outputs), "dim"))
            else:
                self._body.paint("none", Text("no output declared for this stage", "dim"))
            return
        width = self._body.size.width or None

        def build() -> Group:
            parts: list = []
            for d in mine:
                parts.extend(usage_lines(d, width))
            return Group(*parts)
        self._body.paint((mine, width), build)

    def on_resize(self) -> None:
        # The path is cut to the width.
        if self._last is not None:
            self.show(*self._last)
