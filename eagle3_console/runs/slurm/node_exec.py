"""`python -m eagle3_console.runs.slurm.node_exec -- ARGV...`: run on each node by srun inside a job.

Replaces command.py's placeholders in every word (also inside a JSON word,
SGLang's extra_args) with what only the node knows: the allocation's first
node (`scontrol show hostnames $SLURM_JOB_NODELIST`, its first line), this
node's SLURM_NODEID and the SLURM_JOB_ID; then execs the command in its place
(same pid: srun's signals reach it).
"""

from __future__ import annotations

import os
import subprocess
import sys

from eagle3_console.runs.slurm.command import HEAD, JOB_ID, NODE_RANK


def first_node(nodelist: str) -> str:
    out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, check=True)
    return out.stdout.split()[0]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["--"]:
        args = args[1:]
    if not args:
        print("usage: python -m eagle3_console.runs.slurm.node_exec -- ARGV...", file=sys.stderr)
        return 2
    try:
        values = {HEAD: first_node(os.environ["SLURM_JOB_NODELIST"]), NODE_RANK: os.environ["SLURM_NODEID"],
                  JOB_ID: os.environ["SLURM_JOB_ID"]}
    except KeyError as exc:
        print(f"node_exec: {exc.args[0]} is not set; expected to run inside a Slurm job step (srun)", file=sys.stderr)
        return 2
    except (OSError, subprocess.CalledProcessError, IndexError) as exc:
        print(f"node_exec: cannot read the job's first node: {exc}", file=sys.stderr)
        return 2
    words = []
    for word in args:
        for key, value in values.items():
            word = word.replace(key, value)
        words.append(word)
    os.execvp(words[0], words)
    return 127


if __name__ == "__main__":
    sys.exit(main())
