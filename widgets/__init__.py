"""Textual widgets of the console: one per pane, plus the confirm dialogs and help.

Where they sit: the end of the data flow (ops -> runs -> monitors -> snapshot
-> widgets). eagle3_console/app.py hands each pane its part of a Snapshot
(eagle3_console.model dataclasses); a widget only renders what it is given and
never touches the system (no files, processes or NVML here). Actions are
planned and executed by the app, which shows their plans in widgets.dialogs.
"""
