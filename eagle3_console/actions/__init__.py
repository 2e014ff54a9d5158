"""Guarded actions: each builds a plan (a dry run listing exactly what it will
touch), then executes it only when asked. The CLI, `watch` and the TUI call the
same code: kill.py (kill-workers), clean.py (partial outputs), restart.py.

Data flow: registry + monitor.procs / monitor.gpus -> plan -> (confirm) ->
execute -> events table. Nothing outside a run's recorded processes is ever
signalled; nothing outside a stage's output root is ever moved or deleted.
"""

from eagle3_console.actions.clean import CleanPlan, CleanResult, execute_clean, plan_clean
from eagle3_console.actions.kill import GpuHold, KillPlan, KillResult, execute_kill, plan_kill
from eagle3_console.actions.restart import RestartPlan, execute_restart, halve, oom_line, plan_restart

__all__ = ["CleanPlan", "CleanResult", "GpuHold", "KillPlan", "KillResult", "RestartPlan", "execute_clean",
           "execute_kill", "execute_restart", "halve", "oom_line", "plan_clean", "plan_kill", "plan_restart"]
