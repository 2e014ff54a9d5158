"""Monitors: samplers that read the system and return the plain dataclasses of
eagle3_console.model, never touching the UI. They sit between the runs (what
was launched) and snapshot.collect() (the one truth for the TUI and JSON):
gpus (NVML), procs (psutil), and the file-side ones here: tree (an incremental
directory index), disk (bytes written against estimate and free space), shards
(sample files of an extraction output: progress, rate, ETA) and logs (a
`tail -F` follower with progress and error-signature parsers). Each file-side
monitor is incremental and can save its state to a dict, so that a one-shot
`status` process continues where the previous one stopped instead of
re-walking a terabyte or re-reading a gigabyte of log.
"""
