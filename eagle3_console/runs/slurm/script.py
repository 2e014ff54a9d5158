"""A slurm run's batch script and its sbatch command line.

The script (`.eagle3/logs/<run>-<stage>.sbatch`) is the job's argv, each word
shlex-quoted (the pipeline file never writes shell), then the exit record:
`<run>-<stage>.job-exit`, `{"exit_code": N, "job_id": ..., "time": ...}`,
written to a temp name and renamed, so a file that exists is whole. It
tells how the job ended once the controller has forgotten it. Everything
else goes to sbatch as argv words: the stage's slurm params, then its extra
flags. The job's output file is the run's log (appended: the supervisor's
own lines are in it too); its environment is the supervisor's (sbatch's
default --export=ALL), with the run's EAGLE3_* variables. `--no-requeue`:
after a node failure the run ends (NODE_FAIL) and `watch`'s policy decides.
"""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path
from typing import Any

EXIT_SUFFIX = ".job-exit"
SCRIPT_SUFFIX = ".sbatch"


def exit_path(log_path: str | os.PathLike) -> Path:
    return Path(log_path).with_suffix(EXIT_SUFFIX)


def script_path(log_path: str | os.PathLike) -> Path:
    return Path(log_path).with_suffix(SCRIPT_SUFFIX)


def script_text(run: Any, argv: list[str]) -> str:
    done = exit_path(run.log_path)
    tmp = done.with_name(done.name + ".tmp")
    record = '{"exit_code": %d, "job_id": "%s", "time": %s}\\n'
    return "\n".join([
        "#!/bin/bash",
        f"# eagle3-console: run {run.id} of stage {run.stage} (each word below is shlex-quoted; no line of it",
        "# comes from the pipeline file as shell)",
        f"cd {shlex.quote(run.cwd)} || exit 111",
        shlex.join(argv),
        "code=$?",
        f"printf {shlex.quote(record)} \"$code\" \"${{SLURM_JOB_ID:-}}\" \"$(date +%s)\" > {shlex.quote(str(tmp))} "
        f"&& mv -f {shlex.quote(str(tmp))} {shlex.quote(str(done))}",
        'exit "$code"',
        "",
    ])


def write_script(run: Any, argv: list[str]) -> Path:
    path = script_path(run.log_path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(script_text(run, argv))
    os.chmod(tmp, 0o755)
    os.replace(tmp, path)
    return path


def sbatch_argv(slurm: Any, run: Any, script: Path) -> list[str]:
    argv = ["sbatch", "--parsable", f"--job-name=eagle3-{run.stage}-r{run.id}", f"--output={run.log_path}",
            "--open-mode=append", f"--chdir={run.cwd}", f"--nodes={slurm.nodes}",
            # One run is one execution: a requeued job would run the stage again under the
            # same run; the console's restart policy decides about another run.
            "--no-requeue"]
    if slurm.partition:
        argv.append(f"--partition={slurm.partition}")
    if slurm.account:
        argv.append(f"--account={slurm.account}")
    if slurm.time_limit:
        argv.append(f"--time={slurm.time_limit}")
    if slurm.gpus_per_node:
        argv.append(f"--gpus-per-node={slurm.gpus_per_node}")
    return argv + list(slurm.extra_args) + [str(script)]


def read_exit(log_path: str | os.PathLike) -> dict | None:
    try:
        value = json.loads(exit_path(log_path).read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None
