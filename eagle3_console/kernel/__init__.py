"""The kernel: what every wing of the console stands on, importing none of them.

The pipeline file (config, its value checks configchecks and entry, the
Slurm options slurmparams), the workspace's paths (workspace), the run
registry (registry, its busy-database waits registrybusy, the audit log's
folding eventlog, a run's exit record exitrecord and end clock endclock),
the file-tree identities guarded actions move by (fstree), a console
action's refusal and its end by a signal (refused, interrupts), outside text
made printable (text), and the snapshot's plain model and units (model,
units), which the panes read and which import nothing else of the console.
"""
