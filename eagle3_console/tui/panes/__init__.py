"""The console's panes: one Textual widget a pane (header, GPUs, stages, progress
with its curves, disk, log).

Where they sit: the end of the data flow (ops -> runs -> monitors -> snapshot
-> panes). The screen (tui/screen.py) hands each pane its part of a Snapshot
(eagle3_console.kernel.model dataclasses, with what each op said of its record already
on them); a pane only renders what it is given and never touches the system
(no files, processes or NVML) nor asks an op: it imports of the console only
its model and units (an import-linter contract, pyproject.toml).
"""
