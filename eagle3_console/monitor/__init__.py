"""Monitors: samplers that read the system and return the plain dataclasses of
eagle3_console.kernel.model, never touching the UI. They sit between the runs (what
was launched) and snapshot.collect() (the one truth for the TUI and JSON):
gpus (NVML), procs (which processes are a run's; their rows: procrows), hosts
(other nodes' GPUs, read from their exporters), and the file-side ones here:
tree (an incremental directory index; its directories: treedir), disk (bytes written against estimate and free space),
shards (an extraction output's progress, rate and ETA, from samplefiles,
layouts, outputjson, rate and the settled summary) and logs (a `tail -F`
follower with progress and error-signature parsers). Each file-side monitor is
incremental and its state is saved between processes (savedmonitors.py), so
that a one-shot `status` process continues where the previous one stopped
instead of re-walking a terabyte or re-reading a gigabyte of log.
"""
