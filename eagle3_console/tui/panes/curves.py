"""Curves of the selected stage, under its progress: train's loss over steps
(a small bar chart with its range; a sparkline where the pane is short), one
sparkline per TTT step's accuracy (on a fixed 0..1 scale, so that the steps
compare), the simulated acceptance length below (on its 1..K+1 scale); an
extraction's tokens/s over time.

Plain glyphs (block elements) carry the shape, so the curves read the same
with NO_COLOR. The renderable fits whatever width the pane gives it."""

from __future__ import annotations

import math
from typing import Sequence

from rich.console import Console, ConsoleOptions, RenderResult
from rich.text import Text

from eagle3_console.kernel.model import Curves, StageStatus
from eagle3_console.tui.panes import fmt
from eagle3_console.tui.panes.body import Body

BLOCKS = "▁▂▃▄▅▆▇█"
EIGHTHS = " ▁▂▃▄▅▆▇█"
# Below this many screen rows the loss chart collapses to a sparkline, only
# the first and last TTT steps' accuracies are drawn (the result line under
# the curves says every step's), and the step range is left out.
TALL_SCREEN = 40
CHART_ROWS = 4


def resample(values: Sequence[float], width: int) -> list[float]:
    """`width` columns: each the mean of its bucket, or, with fewer points than
    columns, each point repeated (a short run spans the pane, as a long one does)."""
    vals = list(values)
    n = len(vals)
    if n == 0:
        return []
    if n <= width:
        return [vals[i * n // width] for i in range(width)]
    out = []
    for i in range(width):
        bucket = [v for v in vals[i * n // width:(i + 1) * n // width] if not math.isnan(v)]
        out.append(sum(bucket) / len(bucket) if bucket else float("nan"))
    return out


def _range(values: Sequence[float], lo: float | None, hi: float | None) -> tuple[float, float]:
    finite = [v for v in values if not math.isnan(v)]
    lo = min(finite) if lo is None and finite else (lo if lo is not None else 0.0)
    hi = max(finite) if hi is None and finite else (hi if hi is not None else 1.0)
    return lo, hi


def sparkline(values: Sequence[float], width: int, lo: float | None = None, hi: float | None = None) -> str:
    cols = resample(values, max(1, width))
    lo, hi = _range(cols, lo, hi)
    span = hi - lo
    out = []
    for v in cols:
        if math.isnan(v):
            out.append(" ")
            continue
        f = 0.5 if span <= 0 else min(1.0, max(0.0, (v - lo) / span))
        out.append(BLOCKS[round(f * (len(BLOCKS) - 1))])
    return "".join(out)


def chart(values: Sequence[float], width: int, rows: int) -> tuple[list[str], float, float]:
    """A bar chart `rows` high in eighth blocks: (lines top first, low, high)."""
    cols = resample(values, max(1, width))
    lo, hi = _range(cols, None, None)
    span = hi - lo
    # The lowest point still shows a sliver: a flat run reads as a line, not as nothing.
    levels = [0 if math.isnan(v) else 1 + round((0.5 if span <= 0 else (v - lo) / span) * (rows * 8 - 1))
              for v in cols]
    lines = []
    for r in range(rows - 1, -1, -1):
        lines.append("".join(EIGHTHS[min(8, max(0, lv - r * 8))] for lv in levels))
    return lines, lo, hi


def _num(v: float) -> str:
    if math.isnan(v):
        return fmt.DASH
    return f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}"


class CurvesView:
    """The curves as a Rich renderable, laid out for the width it is given."""

    def __init__(self, curves: Curves, tall: bool, rows: int | None = None) -> None:
        # rows: the lines the pane leaves the curves (None: not known, the layout by `tall` alone).
        self.c, self.tall, self.rows = curves, tall, rows

    def _line(self, label: str, spark: str, value: str, style: str = "") -> Text:
        t = Text()
        t.append(label, "dim")
        t.append(spark, style)
        t.append(" " + value, "bold")
        return t

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = options.max_width
        c = self.c
        if c.steps:
            yield from self._train(width)
        elif c.tok_s:
            label = "tok/s "
            value = fmt.rate(c.tok_s[-1], " tok/s")
            span = fmt.duration(c.tok_s_times[-1] - c.tok_s_times[0]) if len(c.tok_s_times) > 1 else "0s"
            if self.tall and (self.rows is None or self.rows >= 4):
                lines, lo, hi = chart(c.tok_s, max(4, width - 8), 3)
                yield Text(f"tokens/s over the last {span}: {value}", "dim")
                for i, line in enumerate(lines):
                    edge = fmt.rate(hi, "") if i == 0 else fmt.rate(lo, "") if i == len(lines) - 1 else ""
                    yield Text.assemble((f"{edge:>7} ", "dim"), (line, "cyan"))
            else:
                room = max(4, width - len(label) - len(value) - 1)
                yield self._line(label, sparkline(c.tok_s, room, lo=0.0), value, "cyan")

    def _train(self, width: int) -> RenderResult:
        c = self.c
        k = len(c.acc)
        steps = f"steps {c.steps[0]}..{c.steps[-1]}"
        label_w = 7
        loss_v = _num(c.loss[-1])
        rows = self.rows
        # With the pane's rows known, every step's accuracy is said: a sparkline each where they
        # fit (the chart shrinks first), else one line of values.
        tall = self.tall and (rows is None or rows >= k + 4)
        if tall:
            chart_rows = CHART_ROWS if rows is None else min(CHART_ROWS, rows - k - 2)
            lines, lo, hi = chart(c.loss, max(4, width - label_w - 1), chart_rows)
            yield Text.assemble(("loss ", "dim"), (loss_v, "bold"), (f"  {steps}", "dim"))
            for i, line in enumerate(lines):
                edge = _num(hi) if i == 0 else _num(lo) if i == len(lines) - 1 else ""
                yield Text.assemble((f"{edge:>{label_w - 1}} ", "dim"), (line, "yellow"))
        else:
            room = max(4, width - label_w - len(loss_v) - 1)
            yield self._line(f"{'loss':<{label_w}}", sparkline(c.loss, room), loss_v, "yellow")
        if rows is None:
            shown = list(range(k)) if self.tall or k <= 2 else [0, k - 1]
        else:
            shown = list(range(k)) if tall or rows >= k + 2 else []
        if not shown and k:
            last = [f"{a[-1]:.2f}" if a and not math.isnan(a[-1]) else fmt.DASH for a in c.acc]
            yield Text.assemble((f"acc@1-{k} ", "dim"), (" ".join(last), "bold green"))
        for i in shown:
            v = c.acc[i][-1] if c.acc[i] else float("nan")
            value = fmt.DASH if math.isnan(v) else f"{v:.2f}"
            room = max(4, width - label_w - len(value) - 1)
            yield self._line(f"{'acc@' + str(i + 1):<{label_w}}", sparkline(c.acc[i], room, 0.0, 1.0), value, "green")
        sim = c.sim_al[-1] if c.sim_al else float("nan")
        value = fmt.DASH if math.isnan(sim) else f"{sim:.2f}"
        room = max(4, width - label_w - len(value) - 1)
        yield self._line(f"{'sim AL':<{label_w}}", sparkline(c.sim_al, room, 1.0, float(k + 1)), value,
                         "bold green")


def curves_key(c: Curves | None, tall: bool) -> tuple | None:
    """What the curves show (a repaint only when it changed)."""
    if c is None or not (c.steps or c.tok_s):
        return None
    return (tall, len(c.steps), c.steps[-1] if c.steps else None, c.loss[-1] if c.loss else None,
            len(c.tok_s), c.tok_s[-1] if c.tok_s else None, len(c.acc))


class CurvesBody(Body):
    """The curves of a StageStatus, painted only when they changed."""

    def show(self, st: StageStatus | None, rows: int | None = None) -> None:
        curves = st.curves if st is not None else None
        tall = self.app.size.height >= TALL_SCREEN
        key = curves_key(curves, tall)
        self.display = key is not None
        if key is None:
            self.paint(None, "")
            return
        self.paint(key + (rows,), lambda: CurvesView(curves, tall, rows))
