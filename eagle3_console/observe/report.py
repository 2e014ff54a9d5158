"""`status` as readable Rich tables (the headless twin of the TUI panes).

Data flow: Snapshot -> Rich renderables. No Textual import: this runs from cron.
"""

from __future__ import annotations

import time
from datetime import datetime

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from eagle3_console.kernel.model import ServeStatus, Snapshot, StageStatus
from ops.estimate import KIND_LABEL, si_bytes
from eagle3_console.kernel.registry import RunStatus
from eagle3_console.kernel.units import human_bytes, human_duration

LEVEL_STYLE = {"ok": "green", "warning": "yellow", "critical": "bold red", "unknown": "magenta"}
STATUS_STYLE = {RunStatus.RUNNING: "cyan", RunStatus.SUCCEEDED: "green", RunStatus.FAILED: "bold red",
                RunStatus.KILLED: "yellow", RunStatus.LOST: "magenta", RunStatus.PENDING: "cyan",
                "never": "dim", "stale": "yellow"}


def _exit(st: StageStatus) -> str:
    if st.signal:
        return f"sig {st.signal}"
    return "-" if st.exit_code is None else str(st.exit_code)


def _rate(st: StageStatus) -> str:
    # A finished run's last window says nothing about now (the TUI does the same).
    if st.rate is None or st.status not in (RunStatus.RUNNING, RunStatus.LOST):
        return "-"
    tok = f", {st.tokens_per_s:,.0f} tok/s" if st.tokens_per_s else ""
    return f"{st.rate:.2f} {st.rate_unit or '/s'}{tok}"


def print_status(console: Console, snap: Snapshot) -> None:
    health = snap.health
    console.print(f"[bold]{snap.workspace}[/] on {snap.host}  {datetime.fromtimestamp(snap.time):%Y-%m-%d %H:%M:%S}  "
                  f"health: [{LEVEL_STYLE[health]}]{health.upper()}[/]", highlight=False)
    t = Table("stage", "status", "run", "pid", "elapsed", "progress", "rate", "ETA", "exit", title="stages",
              title_justify="left")
    for st in snap.stages:
        elapsed = ((st.ended or time.time()) - st.started) if st.started else None
        prog = "-" if st.progress is None else f"{st.progress * 100:.1f}%"
        sp = st.shards
        if sp and sp.samples_expected:
            # The percentage is of the tokens once known (samples come longest first): said so.
            by_tokens = sp.tokens_expected and sp.tokens_done is not None and sp.samples_done < sp.samples_expected
            prog += (f" of tokens ({sp.samples_done}/{sp.samples_expected} samples)" if by_tokens
                     else f" ({sp.samples_done}/{sp.samples_expected})")
        style = STATUS_STYLE.get(st.status, "")
        flag = " OOM" if st.log and "oom" in st.log.findings else ""
        t.add_row(st.name, f"[{style}]{st.status}{flag}[/]", str(st.run_id or "-"), str(st.pid or "-"),
                  human_duration(elapsed), prog, _rate(st), human_duration(st.eta_s), _exit(st))
    console.print(t)
    for st in snap.stages:
        line = st.result_said()
        if line:
            console.print(f"{st.name}: {line}", highlight=False)
        if st.serve is not None:
            console.print(f"{st.name}: {serve_line(st)}", highlight=False)
        if st.job is not None:
            console.print(f"{st.name}: {st.job.line()}", highlight=False, markup=False)
    g = snap.gpus
    if not g.available:
        console.print(f"GPUs: unavailable ({g.reason})", highlight=False)
    else:
        gt = Table("gpu", "name", "memory", "util", "temp", "power", "processes", title="GPUs", title_justify="left")
        for gpu in g.gpus:
            if gpu.error and gpu.mem_total is None:
                gt.add_row(str(gpu.index), gpu.name, f"[red]{gpu.error}[/]", "", "", "", "")
                continue
            mem = f"{human_bytes(gpu.mem_used)} / {human_bytes(gpu.mem_total)}"
            procs = ", ".join(f"{p.pid}{'(' + p.stage + ')' if p.stage else ''} {human_bytes(p.used_bytes)}"
                              for p in gpu.processes)
            gt.add_row(str(gpu.index), gpu.name, mem, _opt(gpu.util_pct, "%"), _opt(gpu.temp_c, "C"),
                       _opt(gpu.power_w, "W"), procs or "-")
        console.print(gt)
    for h in snap.hosts:
        console.print("\n".join(h.lines()), highlight=False, markup=False)
    if snap.disk:
        dt = Table("stage", "path", "written", "estimate", "projected", "free", "fits", title="disk", title_justify="left")
        for d in snap.disk:
            fits = "-" if d.fits is None else ("yes" if d.fits else "[bold red]NO[/]")
            kind = f" {KIND_LABEL.get(d.estimate_kind, d.estimate_kind)}" if d.estimate_kind else ""
            projected = human_bytes(d.projected_bytes) + (" measured" if d.projected_bytes is not None else "")
            dt.add_row(d.stage, d.path, human_bytes(d.written_bytes), human_bytes(d.estimate_bytes) + kind,
                       projected, human_bytes(d.free_bytes), fits)
        console.print(dt)
        for d in snap.disk:
            if d.estimate_basis and d.estimate_bytes is not None:
                label = KIND_LABEL.get(d.estimate_kind, d.estimate_kind)
                console.print(f"{d.stage}: {label} {human_bytes(d.estimate_bytes)} "
                              f"({si_bytes(d.estimate_bytes)}) = {d.estimate_basis}", highlight=False, markup=False)
    for a in snap.alerts:
        # The message and line quote outside text (a log, another host's answer): never markup.
        console.print(f"[{LEVEL_STYLE.get(a.level, '')}]{a.level.upper()}[/] {escape(a.message)}"
                      + (f"\n    {escape(a.line.strip()[:160])}" if a.line else ""), highlight=False)


def serve_line(st: StageStatus) -> str:
    """A serve stage's server in a line: state, why, time to ready, live figures."""
    sv = st.serve
    out = f"server {sv.state.replace('_', ' ')} {sv.url}"
    if sv.time_to_ready_s is not None:
        out += f", ready after {human_duration(sv.time_to_ready_s)}"
    if sv.state != ServeStatus.READY:
        return out + (f" ({sv.reason})" if sv.reason else "")
    figures = sv.figures()
    return out + ("; " + ", ".join(figures) if figures else "")


def _opt(v: float | int | None, unit: str) -> str:
    if v is None:
        return "-"
    return f"{v:.0f}{unit}" if isinstance(v, float) else f"{v}{unit}"
