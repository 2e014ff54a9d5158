"""The command a slurm stage's job runs: its argv under `srun`, spread over the nodes as the op says.

- one process (prepare, vocab, a custom stage on one node ...): `srun --nodes 1 --ntasks-per-node 1 ARGV`;
  a custom stage on several nodes gets one task a node and reads Slurm's own
  variables (SLURM_NODEID, SLURM_JOB_NODELIST) itself;
- "torchrun" (the op's spec: extract with the HF engine, train): one
  `python -m torch.distributed.run` a node with Slurm's rendezvous: c10d on the
  first node of the allocation, the job id as the rendezvous id, gpus_per_node
  processes a node (`--standalone` on one node);
- "sglang" (serve, extract with engine sglang) on several nodes: SGLang's own
  `--nnodes N --node-rank R --dist-init-addr HEAD:PORT`, added to the op's
  extra_args, R each node's SLURM_NODEID.

The first node and the node rank are known only inside the job: the argv
carries placeholders that node_exec.py (started by srun on each node)
replaces before it execs the command. Nothing here passes through a shell.
"""

from __future__ import annotations

import sys
from typing import Any, Callable

from eagle3_console.kernel.slurmparams import check, how_it_spreads

HEAD = "%EAGLE3_HEAD%"             # the allocation's first node
NODE_RANK = "%EAGLE3_NODE_RANK%"   # this node's SLURM_NODEID
JOB_ID = "%EAGLE3_JOB_ID%"         # SLURM_JOB_ID
PLACEHOLDERS = (HEAD, NODE_RANK, JOB_ID)



def job_argv(stage: Any, params: dict[str, Any], command: Callable[[dict[str, Any]], list[str]]) -> list[str]:
    """The argv the batch script runs for a run with these params; `command`
    is the stage's own argv for a params dict (Stage.command)."""
    sp = stage.slurm
    why = check(stage, params)
    if why:
        raise ValueError(f"stages.{stage.name}.slurm: {why}")
    how = how_it_spreads(stage, params)
    srun = ["srun", "--nodes", str(sp.nodes), "--ntasks-per-node", "1", "--kill-on-bad-exit=1"]
    if how == "sglang" and sp.nodes > 1:
        extra = list(params.get("extra_args") or [])
        extra += ["--nnodes", str(sp.nodes), "--node-rank", NODE_RANK, "--dist-init-addr", f"{HEAD}:{sp.rdzv_port}"]
        return srun + _node_exec(command(dict(params, extra_args=extra)))
    argv = command(params)
    if how == "torchrun" and (sp.nodes > 1 or sp.gpus_per_node > 1):
        per_node = str(max(sp.gpus_per_node, 1))
        if sp.nodes > 1:
            run = ["--nnodes", str(sp.nodes), "--nproc-per-node", per_node, "--rdzv-backend", "c10d",
                   "--rdzv-endpoint", f"{HEAD}:{sp.rdzv_port}", "--rdzv-id", JOB_ID]
        else:
            run = ["--standalone", "--nproc-per-node", per_node]
        # torchrun takes the op's `-m ops.<op> ...` as python does.
        argv = [argv[0], "-m", "torch.distributed.run", *run, *argv[1:]]
        return srun + (_node_exec(argv) if sp.nodes > 1 else argv)
    return srun + argv


def _node_exec(argv: list[str]) -> list[str]:
    return [sys.executable, "-m", "eagle3_console.runs.slurm.node_exec", "--", *argv]
