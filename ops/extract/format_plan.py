"""extract's storage format before a launch: the lints `run` prints (an
output already holding another format; a hidden size the format cannot
hold). The spec's lint hook; the formats are ops/hidden_formats.py's. No torch.
"""

from __future__ import annotations

from ops import hidden_formats
from ops.common import count
from ops.extract.sizes import state_format
from ops.formats import DATA_CONFIG, read_data_config
from ops.spec import EstimateContext, Lint


def format_lints(ctx: EstimateContext) -> list[Lint]:
    fmt = state_format(ctx.params)
    out: list[Lint] = []
    hidden = count(ctx.target.get("hidden_size"))
    problem = hidden_formats.width_problem(fmt, hidden) if hidden else None
    if problem:
        out.append(Lint("error", f"stages.{ctx.stage}.params.format: {problem}", forceable=False))
    output = ctx.path("output")
    existing = read_data_config(output) if output is not None else None
    if existing is not None:
        there = existing.get("format", hidden_formats.DEFAULT)
        if there != fmt:
            out.append(Lint("error", (
                f"{output / DATA_CONFIG}: the output holds format {there!r}, this run would write "
                f"{fmt!r}; a run keeps one format: set format = {there!r} to resume it, or use another output"),
                forceable=False))
    return out
