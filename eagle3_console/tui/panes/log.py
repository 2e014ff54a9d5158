"""Log pane: the tail of the selected stage's log, following; lines with an
error signature (out of memory, NCCL, traceback, error, killed) highlighted;
`/` filters.

Renders LogState.tail of one StageStatus. The tail is re-rendered only when it
changed; the view follows the end unless the operator scrolled up."""

from __future__ import annotations

import re
from functools import lru_cache

from rich.highlighter import Highlighter
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message
from textual.strip import Strip
from textual.widgets import Input, Log

from eagle3_console.kernel.model import LogState
from eagle3_console.tui.panes.body import retitle

# What an operator must not miss in a scrolling log (the scenario's OOM, NCCL
# hangs, Python tracebacks); case-insensitive, whole line highlighted.
# Exception names are matched case-sensitively (RuntimeError, not "logit error 0.00"),
# and a program's own `error:` line by its colon.
ERROR_RE = re.compile(
    r"out of memory|\bOOM\b|CUDA error|NCCL|Traceback \(most recent call last\)|"
    r"(?-i:\b\w*(?:Error|Exception)\b)|\berror:|\bKilled\b|\bFATAL\b|\bSIG(KILL|TERM|SEGV|ABRT)\b",
    re.IGNORECASE)
WARN_RE = re.compile(r"\bwarn(ing)?\b", re.IGNORECASE)


def appended(old: list[str], new: list[str]) -> list[str] | None:
    """The lines `new` adds to `old` when `new` is `old` with lines dropped
    from the front (the tail window moved) and lines added at the end; None
    when it is not (a rewritten line, another file): then redraw everything."""
    n = len(old)
    if n == 0:
        return list(new)
    for k in range(n):
        if new[:n - k] == old[k:]:
            return new[n - k:]
    return None


@lru_cache(maxsize=4096)
def is_error_line(line: str) -> bool:
    # Cached: the pane counts the error lines of its whole tail on every pass.
    return ERROR_RE.search(line) is not None


class ErrorHighlighter(Highlighter):
    def highlight(self, text: Text) -> None:
        plain = text.plain
        if ERROR_RE.search(plain):
            text.stylize("bold red")
        elif WARN_RE.search(plain):
            text.stylize("yellow")


class LogView(Log):
    DEFAULT_CSS = """
    LogView { height: 1fr; border: none; }
    """
    STRIP_CACHE = 2048

    def __init__(self, **kw) -> None:
        # A following log scrolls (or loses its first lines) on every append,
        # so every visible line is asked for again each second. Textual's Log
        # (8.2) renders each one anew (its line cache is kept only while text
        # is selected, and is keyed by position, which pruning moves): here
        # lines are cached by content, and the style by widget until the
        # styles change.
        self._strips: dict[str, Strip] = {}
        self._style = None
        self.strips_rendered = 0
        super().__init__(highlight=True, auto_scroll=True, **kw)
        self.highlighter = ErrorHighlighter()
        # Following the end until the operator scrolls up; End (or scrolling
        # back down) follows again.
        self.following = True

    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        index = scroll_y + y
        if self.text_selection is not None or index >= len(self.lines):
            return super().render_line(y)
        if self._style is None:
            self._style = self.rich_style
        text = self.lines[index]
        strip = self._strips.get(text)
        if strip is None:
            if len(self._strips) >= self.STRIP_CACHE:
                self._strips.clear()
            strip = self._strips[text] = self._render_line_strip(index, self._style)
            self.strips_rendered += 1
        width = self.size.width
        # What Log._render_line does with its strip: crop to the view, and the
        # offsets that map a screen cell back to the text (mouse selection).
        return strip.crop_extend(scroll_x, scroll_x + width, self._style).apply_offsets(scroll_x, index)

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._strips.clear()
        self._style = None

    class Following(Message):
        """Following the end started or stopped (the pane's subtitle says which)."""

    def watch_scroll_y(self, old: float, new: float) -> None:
        super().watch_scroll_y(old, new)
        following = new >= self.max_scroll_y
        if following != self.following:
            self.following = following
            # Said now, not at the next new line: a finished run's log gets none.
            self.post_message(self.Following())

    def on_resize(self) -> None:
        if self.following:
            self.call_after_refresh(self.follow)

    def follow(self) -> None:
        self.following = True
        self.scroll_end(animate=False, immediate=True, x_axis=False)


class LogPane(Vertical):
    DEFAULT_CSS = """
    LogPane { border: round $primary-darken-1; height: 1fr; min-height: 4; }
    LogPane:focus-within { border: round $accent; }
    /* :focus too: Input's own focused border (tall) would leave a 1-row box no room for its text. */
    LogPane > Input { display: none; }
    LogPane > Input, LogPane > Input:focus { height: 1; border: none; padding: 0 1; background: $boost; }
    LogPane.-filtering > Input { display: block; }
    """
    BINDINGS = [Binding("escape", "close_filter", "clear filter / back to stages", show=False)]

    class Leave(Message):
        """Esc with no filter open: the operator is done reading; the app moves focus back."""

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.border_title = "Log"
        self.view = LogView(id="log-view")
        self.filter_input = Input(placeholder="filter (case-insensitive); enter: keep, esc: clear",
                                  id="log-filter")
        self.filter_text = ""
        self._tail: list[str] = []
        self._key: tuple | None = None
        self._shown: list[str] | None = None
        self._shown_filter = ""
        self._n_err = 0

    def compose(self) -> ComposeResult:
        yield self.filter_input
        yield self.view

    def show(self, stage: str | None, run_id: int | None, log: LogState | None) -> None:
        key = (stage, run_id, log.path if log else None)
        if key != self._key:
            self._key = key
            self.view.following = True
            self._shown = None          # another log: redraw, never append
        self._tail = list(log.tail) if log is not None else []
        title = "Log"
        if stage:
            title += f": {stage}" + (f" (run {run_id})" if run_id else "")
        if log is None:
            self._tail = ["(no log yet: the stage has not run)"] if stage else []
        retitle(self, title)
        self._refresh_lines()

    def _refresh_lines(self) -> None:
        lines = self._tail
        if self.filter_text:
            needle = self.filter_text.lower()
            lines = [ln for ln in lines if needle in ln.lower()]
        if lines == self._shown and self._shown_filter == self.filter_text:
            return
        follow = self.view.following
        scroll_y = self.view.scroll_y
        # Appending is only right for the same filter (a new filter may keep a
        # suffix of the old lines, and the lines above it must go).
        same = self._shown is not None and self._shown_filter == self.filter_text
        new = appended(self._shown, lines) if same else None
        self._shown, self._shown_filter = list(lines), self.filter_text
        # The view holds as many lines as the tail: appending prunes the front,
        # so that the number of lines, the scroll offset and the scrollbar stay
        # put (a growing view would relayout the screen on every append).
        self.view.max_lines = max(len(lines), 1)
        if new is not None:
            # The common case of a growing log: only the new lines are written.
            self.view.write_lines(new, scroll_end=False)
        else:
            self.view.clear()
            self.view.write_lines(lines, scroll_end=False)
        if follow:
            self.view.follow()
        else:
            self.view.scroll_to(y=scroll_y, animate=False, immediate=True)
            self.view.following = False
        self._n_err = sum(1 for ln in lines if is_error_line(ln))
        self._subtitle()

    def _subtitle(self) -> None:
        sub = "following" if self.view.following else "scrolled (end: follow)"
        if self.filter_text:
            sub = f"filter {self.filter_text!r}: {lines_of(len(self._shown or []))} · " + sub
        if self._n_err:
            sub = f"{lines_of(self._n_err, 'error ')} · " + sub
        retitle(self, subtitle=sub)

    def on_log_view_following(self, event: LogView.Following) -> None:
        event.stop()
        self._subtitle()

    def open_filter(self) -> None:
        self.add_class("-filtering")
        self.filter_input.focus()

    def action_close_filter(self) -> None:
        if not self.filter_text and not self.has_class("-filtering"):
            self.post_message(self.Leave())
            return
        self.filter_input.value = ""
        self.filter_text = ""
        self.remove_class("-filtering")
        self.view.focus()
        self._refresh_lines()

    def on_input_changed(self, event: Input.Changed) -> None:
        event.stop()
        self.filter_text = event.value.strip()
        self._refresh_lines()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        if not self.filter_text:
            self.remove_class("-filtering")
        self.view.focus()


def lines_of(n: int, kind: str = "") -> str:
    """`1 error line`, `2 error lines`: the count with its noun in number."""
    return f"{n} {kind}line{'' if n == 1 else 's'}"
