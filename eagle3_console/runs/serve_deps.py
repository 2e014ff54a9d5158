"""A dependency on a serve stage: met when its server is ready.

A server never "succeeds" (it serves until stopped), so a bench that
`depends_on` a serve stage waits for what the console already tracks: the
ServeMonitor's state (loading -> warming_up -> ready). runs.check_can_start
asks not_ready() before a launch (`run`, `watch --advance`, the TUI);
StageStatus.done counts a ready server as done for its dependents.
"""

from __future__ import annotations

from eagle3_console.config import Stage
from eagle3_console.registry import Run


def not_ready(serve: Stage, run: Run | None, alive: bool) -> str | None:
    """Why the serve stage's server cannot be depended on now (a clause), or None when it is ready."""
    if run is None:
        return f"which never ran (start it: `run {serve.name}`)"
    if not alive:
        return f"whose run {run.id} is {run.status}, not serving (start it again: `run {serve.name}`)"
    from eagle3_console.monitor.logs import LogFollower
    from eagle3_console.monitor.serve import ServeMonitor
    server = serve.spec.serves(serve.spec.effective(run.params))
    mon = ServeMonitor(server.host, server.port, speculative=server.mode == "speculative", started=run.started)
    try:
        log = LogFollower(run.log_path).refresh()
    except OSError:
        log = None
    state = mon.sample(log, True)
    if state.state == "ready":
        return None
    return f"whose server (run {run.id}, {state.url}) is {state.state.replace('_', ' ')}: {state.reason}"
