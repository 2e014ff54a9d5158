"""Runs: launch a stage through the supervisor, and stop it.

The package's face: the names callers know runs by, each living in the
module of its own job. A run's params are params.py's, whether a stage may
start startcheck.py's, the launch (plan, checks, the supervisor started
detached) launching.py's, the disk plan plan.py's, output roots outputs.py's,
liveness and reconcile() liveness.py's, the stop stopper.py's.

Data flow: config.Pipeline + registry -> launching -> supervise.py (detached)
-> stage process group; stopper -> its signals -> registry.
"""

from __future__ import annotations

from typing import Any

from eagle3_console.kernel.refused import NothingToDo, Refused
from eagle3_console.runs.launching import dry_run, handoff, launch, launch_argv, lints, prelaunch
from eagle3_console.runs.liveness import reconcile, stage_alive
from eagle3_console.runs.outputs import check_outputs_apart, output_paths
from eagle3_console.runs.params import stage_params
from eagle3_console.runs.plan import preflight
from eagle3_console.runs.startcheck import check_can_start, outputs_complete, serves

__all__ = ["NothingToDo", "Refused", "check_can_start", "check_outputs_apart", "dry_run", "handoff", "launch",
           "launch_argv", "lints", "output_paths", "outputs_complete", "preflight", "prelaunch", "reconcile", "serves",
           "stage_alive", "stage_params", "stop"]


def __getattr__(name: str) -> Any:
    # `runs.stop`, imported when asked for: stopper imports psutil, and `status --json`
    # (cron, every minute) imports runs and never stops a run.
    if name == "stop":
        from eagle3_console.runs.stopper import stop
        return stop
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
