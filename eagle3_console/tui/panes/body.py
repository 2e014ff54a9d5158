"""The content of a pane, repainted only when what it shows changed.

An idle console refreshes once a second; most of its CPU would go to Textual
re-rendering and re-laying-out panes whose content did not change. A pane
passes a key (the values it displays): an equal key, no repaint; new content
of the same height, a repaint of this widget only, without a relayout of the
screen."""

from __future__ import annotations

from typing import Any, Callable

from rich.console import RenderableType
from textual.widget import Widget
from textual.widgets import Static

_UNSET = object()


class Body(Static):
    DEFAULT_CSS = "Body { width: 1fr; }"

    def __init__(self, content: RenderableType = "", **kw: Any) -> None:
        super().__init__(content, **kw)
        self._key: Any = _UNSET
        self.paints = 0
        self.relayouts = 0
        self.pending_fit = False

    def paint(self, key: Any, content: RenderableType | Callable[[], RenderableType]) -> bool:
        """Show `content` (or what the callable builds, only when needed) unless
        `key` equals the last one. Returns whether it repainted."""
        if key == self._key:
            return False
        if callable(content):
            content = content()
        self._key = key
        self.paints += 1
        if not self.size.width:
            self.update(content, layout=True)        # never laid out yet
            return True
        self.update(content, layout=False)
        # Sizes settle after the refresh (a resize may be under way): check then.
        self.pending_fit = True
        self.call_after_refresh(self._fit)
        return True

    def _fit(self) -> None:
        """Relayout only when the new content does not fit the height it has."""
        self.pending_fit = False
        width = self.content_region.width
        self.clear_cached_dimensions()
        if not width or self.visual.get_height(self.styles, width) != self.content_region.height:
            self.relayouts += 1
            self.refresh(layout=True)


def retitle(widget: Widget, title: str | None = None, subtitle: str | None = None) -> None:
    """Set a pane's border title/subtitle only when it changed: Textual repaints
    the whole widget on every assignment, even of the same text."""
    last = widget.__dict__.setdefault("_eagle3_titles", {})
    for name, value in (("border_title", title), ("border_subtitle", subtitle)):
        if value is not None and last.get(name) != value:
            last[name] = value
            setattr(widget, name, value)
