"""A slurm stage's params (`[stages.X.slurm]`), declared once and checked at load.

    [stages.extract]
    op = "extract"
    launcher = "slurm"
    slurm = { partition = "gpu", nodes = 2, gpus_per_node = 8, time_limit = "4:00:00",
              account = "llm", extra_args = ["--exclusive", "--qos=high"] }

Every value reaches sbatch as its own argv word (never a shell line); flags
the console sets itself are refused in extra_args with the param to use.
Without the Slurm client commands on PATH a slurm stage is refused here
(exit 3): nothing could submit it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from eagle3_console.kernel.entry import EntryError, expect, str_list
from ops.params import Param

# A slurm run's job_state when sbatch never took the job (its job_reason says why), and
# the start of its job_reason while the controller does not answer (runs/slurm/supervise.py).
JOB_NOT_SUBMITTED = "NOT_SUBMITTED"
SLURM_UNANSWERED = "Slurm did not answer"

SLURM = "slurm"
LAUNCHERS = ("local", SLURM)
# The client commands the console runs on the login node.
TOOLS = ("sbatch", "scontrol", "scancel", "squeue")

PARAMS = (
    Param("partition", "", "the partition (sbatch --partition); empty: the cluster's default"),
    Param("nodes", 1, "nodes (sbatch --nodes)", low=1, high=4096),
    Param("gpus_per_node", 0, "GPUs on each node (sbatch --gpus-per-node); 0: none asked", low=0, high=64),
    Param("time_limit", "", "the wall-clock limit (sbatch --time: MM, HH:MM:SS, D-HH:MM ...); empty: the partition's"),
    Param("account", "", "the account charged (sbatch --account); empty: the user's default"),
    Param("extra_args", [], "more sbatch flags, each its own word: [\"--exclusive\", \"--qos=high\"]"),
    Param("rdzv_port", 29500, "the port on the first node for torchrun's rendezvous and SGLang's dist-init",
          low=1, high=65535),
)
DECLARED = {p.name: p for p in PARAMS}
NAME_RE = re.compile(r"[A-Za-z0-9_.,:+-]{1,128}")
# sbatch's --time formats (man sbatch): M, M:S, H:M:S, D-H, D-H:M, D-H:M:S, or no limit.
TIME_RE = re.compile(r"\d+(:\d{1,2}){0,2}|\d+-\d{1,2}(:\d{1,2}){0,2}|UNLIMITED|INFINITE|unlimited|infinite")
# Flags the console writes itself: another value for one of them would be ignored or break the run's bookkeeping.
MANAGED = {
    "--partition": "partition", "-p": "partition", "--nodes": "nodes", "-N": "nodes",
    "--gpus-per-node": "gpus_per_node", "--time": "time_limit", "-t": "time_limit",
    "--account": "account", "-A": "account",
    "--output": "the run's log", "-o": "the run's log", "--error": "the run's log", "-e": "the run's log",
    "--open-mode": "the run's log", "--parsable": "the console", "--wrap": "the console's batch script",
    "--chdir": "the workspace", "-D": "the workspace", "--job-name": "the console", "-J": "the console",
    "--export": "the console (the run's environment)", "--array": "the console (one job a run)",
}


@dataclass
class SlurmParams:
    partition: str = ""
    nodes: int = 1
    gpus_per_node: int = 0
    time_limit: str = ""
    account: str = ""
    extra_args: list[str] = field(default_factory=list)
    rdzv_port: int = 29500


def missing_tools() -> list[str]:
    import shutil       # a slurm stage's only: status --json of a local pipeline never pays for it
    return [t for t in TOOLS if shutil.which(t) is None]


def parse(where: str, body: dict[str, Any], stage: Any) -> tuple[str, SlurmParams | None]:
    """(launcher, its params) of a stage's table; EntryError on anything wrong."""
    launcher = expect(f"{where}.launcher", body.get("launcher", "local"), str)
    if launcher not in LAUNCHERS:
        raise EntryError(f"{where}.launcher", f"{launcher!r}: expected one of {', '.join(LAUNCHERS)}")
    if launcher != SLURM:
        if "slurm" in body:
            raise EntryError(f"{where}.slurm", "set for a stage whose launcher is not \"slurm\"; "
                              "expected launcher = \"slurm\" beside it")
        return launcher, None
    table = expect(f"{where}.slurm", body.get("slurm", {}), dict)
    values: dict[str, Any] = {}
    for key, value in table.items():
        decl = DECLARED.get(key)
        if decl is None:
            raise EntryError(f"{where}.slurm.{key}", f"unknown key; expected one of {sorted(DECLARED)}")
        if key == "extra_args":
            value = _flags(f"{where}.slurm.{key}", value)
        else:
            wrong = decl.check(value)
            if wrong:
                raise EntryError(f"{where}.slurm.{key}", wrong)
            if key in ("partition", "account") and value and not NAME_RE.fullmatch(value):
                raise EntryError(f"{where}.slurm.{key}", f"{value!r}: expected a Slurm name "
                                  "(letters, digits, _ . , : + -)")
            if key == "time_limit" and value and not TIME_RE.fullmatch(value):
                raise EntryError(f"{where}.slurm.{key}", f"{value!r}: expected an sbatch --time such as "
                                  "\"30\" (minutes), \"4:00:00\" or \"1-12:00:00\"")
        values[key] = value
    if "gpus" in body:
        raise EntryError(f"{where}.gpus", "a slurm stage's GPUs are Slurm's to give; expected "
                          "slurm.gpus_per_node instead")
    missing = missing_tools()
    if missing:
        raise EntryError(f"{where}.launcher", f"\"slurm\" needs the Slurm client commands, and "
                          f"{', '.join(missing)} not found on PATH; expected a login node of a Slurm cluster")
    stage.slurm = SlurmParams(**values)
    why = check(stage, stage.spec.effective(stage.params))
    if why:
        raise EntryError(f"{where}.slurm.nodes", why)
    return launcher, stage.slurm


def _flags(key: str, value: Any) -> list[str]:
    words = str_list(key, value)
    for i, word in enumerate(words):
        if any(c in word for c in "\n\r\0"):
            raise EntryError(f"{key}[{i}]", f"{word!r}: expected one sbatch flag on one line")
        flag = word.split("=", 1)[0]
        value_of = i > 0 and words[i - 1].startswith("-") and "=" not in words[i - 1]
        if not word.startswith("-") and not value_of:
            raise EntryError(f"{key}[{i}]", f"{word!r}: expected a flag (\"--qos=high\", or "
                                  "\"--qos\", \"high\")")
        if flag in MANAGED:
            raise EntryError(f"{key}[{i}]", f"{flag} is set by {MANAGED[flag]}"
                              + (f": set slurm.{MANAGED[flag]} instead" if MANAGED[flag] in DECLARED else ""))
    return words


def how_it_spreads(stage: Any, params: dict[str, Any]) -> str | None:
    return stage.spec.spreads(params)


def check(stage: Any, params: dict[str, Any]) -> str | None:
    """Why these slurm params cannot run this stage, or None."""
    sp = stage.slurm
    if sp.nodes > 1 and stage.spec.one_node(params):
        return (f"op {stage.op!r} runs as one process on one node; expected slurm.nodes = 1 "
                f"(got {sp.nodes})")
    return None
