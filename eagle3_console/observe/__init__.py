"""What the console sees: the snapshot of a workspace (stages, GPUs, disk, logs, hosts),
its alerts, the status report and the Prometheus/JSON exporter. Above the run layer
(runs/) and the monitors (monitor/); below the CLI and the TUI."""
