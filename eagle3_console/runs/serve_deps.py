"""A dependency on a serve stage: met when its server is ready.

A server never "succeeds" (it serves until stopped), so a bench that
`depends_on` a serve stage waits for what the console already tracks: the
ServeMonitor's state (loading -> warming_up -> ready). runs.check_can_start
asks not_ready() before a launch (`run`, `watch --advance`, the TUI);
StageStatus.done counts a ready server as done for its dependents.
"""

from __future__ import annotations

from typing import Any

from eagle3_console.kernel.config import Stage
from eagle3_console.kernel.model import ServeState, ServeStatus
from eagle3_console.kernel.registry import Run


def serve_monitor(spec: Any, params: dict[str, Any], run: Run) -> Any:
    """The ServeMonitor of a serve run, where its spec says it listens: the one
    way one is made (the snapshot keeps one per serve run; a launch without a
    snapshot probes once through one)."""
    from eagle3_console.monitor.serve import ServeMonitor     # serve stages only
    server = spec.serves(spec.effective(params))
    return ServeMonitor(server.host, server.port, speculative=server.mode == "speculative", started=run.started,
                        **({"ready_timeout_s": server.ready_timeout_s} if server.ready_timeout_s else {}))


def not_ready(serve: Stage, run: Run | None, alive: bool, seen: dict[int, ServeState]) -> str | None:
    """Why the serve stage's server cannot be depended on now (a clause), or None when it is ready.
    `seen`: serve states by run id, from the caller's snapshot (watch --advance); a run's
    missing there is probed once and kept in it for the launch's second check."""
    if run is None:
        return f"which never ran (start it: `run {serve.name}`)"
    if not alive:
        return f"whose run {run.id} is {run.status}, not serving (start it again: `run {serve.name}`)"
    state = seen.get(run.id)
    if state is None:
        from eagle3_console.monitor.logs import LogFollower
        try:
            log = LogFollower(run.log_path).refresh()
        except OSError:
            log = None
        state = seen[run.id] = serve_monitor(serve.spec, run.params, run).sample(log, True)
    if state.state == ServeStatus.READY:
        return None
    return f"whose server (run {run.id}, {state.url}) is {state.state.replace('_', ' ')}: {state.reason}"
