"""Stages as jobs of a Slurm cluster (`launcher = "slurm"` on a stage).

The console drives the cluster's own scheduler and never builds one: the
run's supervisor (on the login node, as for a local run) writes the batch
script, submits it with `sbatch --parsable`, follows the job through
`scontrol show job` and records its end; the job's output file is the run's
log. The stage's `slurm` table is read with the pipeline file (eagle3_console/kernel/slurmparams.py). Modules: command (the job's argv:
srun, torchrun, SGLang's multi-node flags), script (the batch script and the
sbatch argv), jobs (scontrol/scancel and the job states as run statuses),
supervise (the supervisor's loop for a job), control (stop, kill-workers and
the reconcile of a job whose supervisor is gone), node_exec (the per-node
launcher inside the job).
"""

