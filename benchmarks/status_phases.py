"""Where one `eagle3-console status --json` process spends its time, by phase.

Run by benchmarks/status_cost.py as a child process (one whole process a
measurement, like cron's): it runs the real entry point (eagle3_console.cli.run,
the path without typer) with timers wrapped around the functions of each phase,
and prints one line `PHASES={...}` (milliseconds, exclusive: a phase called
inside another counts only in the inner one) on stderr. Lazy imports count in
the phase that triggers them (psutil in "processes"); pynvml's import is its own phase.

Usage: python benchmarks/status_phases.py WORKSPACE [--no-gpus]
"""

from __future__ import annotations

import inspect
import json
import sys
import time

T0 = time.perf_counter()
STACK: list[list] = []
TOTALS: dict[str, float] = {}


def wrap(phase: str, fn):
    def timed(*args, **kwargs):
        t = time.perf_counter()
        STACK.append([phase, 0.0])
        try:
            return fn(*args, **kwargs)
        finally:
            ph, inner = STACK.pop()
            dt = time.perf_counter() - t
            TOTALS[ph] = TOTALS.get(ph, 0.0) + dt - inner
            if STACK:
                STACK[-1][1] += dt
    timed.__wrapped__ = fn
    return timed


def patch(obj, name: str, phase: str) -> None:
    setattr(obj, name, wrap(phase, getattr(obj, name)))


def main() -> int:
    root, no_gpus = sys.argv[1], "--no-gpus" in sys.argv[2:]
    import eagle3_console.cli as cli
    import eagle3_console.observe.snapshot as snapshot     # imported by the first collect
    TOTALS["imports"] = time.perf_counter() - T0
    from eagle3_console.observe import alerts
    from eagle3_console import runs
    from eagle3_console.kernel import config, registry
    from eagle3_console.kernel.model import Snapshot
    from eagle3_console.monitor import procs

    patch(config, "load", "config")
    for name, fn in list(vars(registry.Registry).items()):
        if inspect.isfunction(fn):
            setattr(registry.Registry, name, wrap("registry", fn))
    patch(runs, "reconcile", "registry")
    patch(snapshot, "latest_success", "registry")
    # _load_full: the whole output's per-file state (before per-folder state); _load_folder: one folder's.
    for name in ("_load_cache", "_save_cache", "_load_full", "_load_folder"):
        if hasattr(snapshot.Collector, name):
            patch(snapshot.Collector, name, "cache load/save")
    patch(snapshot.Collector, "_stage_status", "stage monitors (shards, disk, logs)")
    patch(snapshot, "attach_owners", "processes (psutil: GPU owners)")
    patch(procs.ProcessTable, "snapshot", "processes (psutil: GPU owners)")
    patch(procs.ProcessTable, "partial", "processes (psutil: GPU owners)")
    patch(alerts, "derive", "alerts")
    patch(Snapshot, "to_dict", "JSON out")
    patch(cli, "status_json", "JSON out")
    if not no_gpus:
        # Imported by the first sample (Collector._nvml_instance): timed here to patch them.
        t = time.perf_counter()
        from eagle3_console.monitor import gpus
        try:
            import pynvml
        except ImportError:
            pynvml = None
        TOTALS["NVML imports (pynvml, monitor.gpus)"] = time.perf_counter() - t
        if pynvml is not None:
            for name in ("nvmlInit", "nvmlDeviceGetCount", "nvmlSystemGetDriverVersion"):
                patch(pynvml, name, "NVML init")
            patch(pynvml, "nvmlShutdown", "NVML shutdown")
        patch(gpus.Nvml, "sample", "NVML per-GPU queries")
    argv = ["-w", root, "status", "--json"] + (["--no-gpus"] if no_gpus else [])
    code = None
    try:
        cli.run(argv)
    except SystemExit as exc:
        code = exc.code
    total = time.perf_counter() - T0
    phases = {k: round(v * 1000, 2) for k, v in TOTALS.items()}
    phases["other (entry point, stat calls, ...)"] = round((total - sum(TOTALS.values())) * 1000, 2)
    phases["total after interpreter start"] = round(total * 1000, 2)
    sys.stderr.write("PHASES=" + json.dumps({"exit": code, "ms": phases}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
