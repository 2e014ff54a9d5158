"""A slurm stage's params checked at load (exit 3, one line naming the file
and the key), the refusal where no Slurm is installed, the job's argv for each
way an op spreads (srun, torchrun with Slurm's rendezvous, SGLang's own
multi-node flags, node_exec's placeholders), the registry's added columns.
No cluster needed."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys

import pytest

from eagle3_console.kernel import config
from eagle3_console.runs.slurm import command
from tests.conftest import PY, TINY_TARGET

needs_slurm_clients = pytest.mark.skipif(shutil.which("sbatch") is None, reason="the Slurm client commands are absent")


def custom(slurm: str, extra: str = "") -> str:
    return f"""
[stages.job]
argv = ["python", "-c", "print(1)"]
launcher = "slurm"
slurm = {{ {slurm} }}
{extra}
"""


@pytest.mark.parametrize("table, key, said", [
    ('nodes = 0', "stages.job.slurm.nodes", "expected"),
    ('nodes = "two"', "stages.job.slurm.nodes", "expected"),
    ('time_limit = "4 hours"', "stages.job.slurm.time_limit", "expected an sbatch --time"),
    ('partition = "gpu; rm -rf /"', "stages.job.slurm.partition", "expected a Slurm name"),
    ('extra_args = "--exclusive"', "stages.job.slurm.extra_args", "expected a list"),
    ('extra_args = ["--output=/tmp/x"]', "stages.job.slurm.extra_args[0]", "the run's log"),
    ('extra_args = ["-N", "4"]', "stages.job.slurm.extra_args[0]", "set slurm.nodes instead"),
    ('extra_args = ["--qos=high\\n#SBATCH --x"]', "stages.job.slurm.extra_args[0]", "one line"),
    ('extra_args = ["high"]', "stages.job.slurm.extra_args[0]", "expected a flag"),
    ('gpus = 8', "stages.job.slurm.gpus", "unknown key"),
])
def test_bad_slurm_params_are_refused_at_load_naming_the_key(ws, table, key, said):
    ws.write(custom(table))
    proc = ws.call("status", "--no-gpus")
    assert proc.returncode == 3, proc
    line = proc.stderr.strip().splitlines()[-1]
    assert str(ws.root / "eagle3.toml") in line and key in line and said in line, line
    assert "Traceback" not in proc.stderr


def test_launcher_must_be_known_and_slurm_table_needs_it(ws):
    ws.write(custom("nodes = 1").replace('launcher = "slurm"', 'launcher = "pbs"'))
    proc = ws.call("status", "--no-gpus", check=3)
    assert "stages.job.launcher" in proc.stderr and "expected one of local, slurm" in proc.stderr
    ws.write(custom("nodes = 1").replace('launcher = "slurm"\n', ""))
    assert "expected launcher = \"slurm\"" in ws.call("status", "--no-gpus", check=3).stderr


@needs_slurm_clients
def test_a_stage_gpus_list_and_a_single_process_op_on_two_nodes_are_refused(ws):
    ws.write(custom("nodes = 1", "gpus = [0]"))
    assert "stages.job.gpus" in ws.call("status", "--no-gpus", check=3).stderr
    ws.write(TINY_TARGET + """
[stages.vocab]
op = "vocab"
launcher = "slurm"
slurm = { nodes = 2 }
params = { input = "data/prepared", output = "data/vocab" }
""")
    err = ws.call("status", "--no-gpus", check=3).stderr
    assert "stages.vocab.slurm.nodes" in err and "runs as one process on one node" in err


def test_without_slurm_a_slurm_stage_is_refused_at_load_in_one_line(ws, tmp_path):
    ws.write(custom('partition = "gpu"'))
    bare = tmp_path / "bin"         # a PATH with the interpreter and nothing of Slurm's
    bare.mkdir()
    os.symlink(sys.executable, bare / "python")
    for path in ("status", "run"):
        args = [path, "--no-gpus"] if path == "status" else [path, "job"]
        proc = ws.cli(*args, env={"PATH": str(bare)})
        assert proc.returncode == 3, proc
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and "stages.job.launcher" in lines[0] and "sbatch" in lines[0], lines
        assert "not found on PATH" in lines[0]
    assert not (ws.root / ".eagle3" / "logs").exists() or not list((ws.root / ".eagle3" / "logs").iterdir())


def _stage(ws, toml: str, name: str):
    ws.write(toml)
    return config.load(ws.root / "eagle3.toml").stage(name)


@needs_slurm_clients
def test_torch_ops_run_under_srun_and_torchrun_with_slurms_rendezvous(ws):
    st = _stage(ws, TINY_TARGET + """
[stages.train]
op = "train"
launcher = "slurm"
slurm = { nodes = 2, gpus_per_node = 8, rdzv_port = 29600 }
params = { data = "data/hs", vocab = "data/vocab", output = "runs/train" }
""", "train")
    params = st.spec.effective(st.params)
    argv = command.job_argv(st, params, lambda p: st.command(p, {"path": "models/target"}))
    assert argv[:6] == ["srun", "--nodes", "2", "--ntasks-per-node", "1", "--kill-on-bad-exit=1"]
    assert argv[6:10] == [sys.executable, "-m", "eagle3_console.runs.slurm.node_exec", "--"]
    assert argv[10:13] == [sys.executable, "-m", "torch.distributed.run"]
    i = argv.index("torch.distributed.run")
    run = argv[i + 1:argv.index("ops.train")]
    assert run == ["--nnodes", "2", "--nproc-per-node", "8", "--rdzv-backend", "c10d",
                   "--rdzv-endpoint", f"{command.HEAD}:29600", "--rdzv-id", command.JOB_ID, "-m"]
    # One node: torchrun --standalone, no placeholders to fill, no node_exec.
    st.slurm.nodes = 1
    one = command.job_argv(st, params, lambda p: st.command(p, {"path": "models/target"}))
    assert "--standalone" in one and "eagle3_console.runs.slurm.node_exec" not in one
    # One process: the op's argv as it is, under srun.
    st.slurm.gpus_per_node = 1
    plain = command.job_argv(st, params, lambda p: st.command(p, {"path": "models/target"}))
    assert plain[6:9] == [sys.executable, "-m", "ops.train"]


@needs_slurm_clients
def test_sglang_serve_and_extraction_get_sglangs_multi_node_flags(ws):
    st = _stage(ws, TINY_TARGET + """
[stages.serve]
op = "serve"
launcher = "slurm"
slurm = { nodes = 2, gpus_per_node = 8 }
params = { tp = 16, extra_args = ["--disable-custom-all-reduce"] }
""", "serve")
    params = st.spec.effective(st.params)
    argv = command.job_argv(st, params, lambda p: st.command(p, {"path": "models/target"}))
    extra = json.loads(argv[argv.index("--extra-args") + 1])
    assert extra == ["--disable-custom-all-reduce", "--nnodes", "2", "--node-rank", command.NODE_RANK,
                     "--dist-init-addr", f"{command.HEAD}:29500"]
    assert st.params["extra_args"] == ["--disable-custom-all-reduce"]       # the recorded params keep theirs
    # SGLang's own parser takes the flags (0.5.23's ServerArgs, as the serve op checks its argv).
    sglang = pytest.importorskip("sglang.srt.server_args")
    import argparse
    parser = argparse.ArgumentParser()
    sglang.ServerArgs.add_cli_args(parser)
    ns = parser.parse_args(["--model-path", "m", *[w.replace(command.NODE_RANK, "1").replace(command.HEAD, "n1")
                                                   for w in extra]])
    assert (ns.nnodes, ns.node_rank, ns.dist_init_addr) == (2, 1, "n1:29500")
    ext = _stage(ws, TINY_TARGET + """
[stages.extract]
op = "extract"
launcher = "slurm"
slurm = { nodes = 2, gpus_per_node = 8 }
params = { input = "data/prepared", output = "data/hs", engine = "sglang", tp = 16 }
""", "extract")
    argv = command.job_argv(ext, ext.spec.effective(ext.params), lambda p: ext.command(p, {"path": "models/target"}))
    assert "--nnodes" in json.loads(argv[argv.index("--extra-args") + 1])


def test_node_exec_fills_the_placeholders_from_the_job_step(tmp_path):
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    # scontrol show hostnames expands a nodelist, one host a line (man scontrol).
    (fake_bin / "scontrol").write_text("#!/bin/sh\necho gpu-node-07\necho gpu-node-08\n")
    (fake_bin / "scontrol").chmod(0o755)
    env = dict(os.environ, PATH=f"{fake_bin}:{os.environ['PATH']}", SLURM_JOB_NODELIST="gpu-node-[07-08]",
               SLURM_NODEID="1", SLURM_JOB_ID="4242")
    out = subprocess.run([PY, "-m", "eagle3_console.runs.slurm.node_exec", "--", PY, "-c", "import sys; print(sys.argv[1:])",
                          f"{command.HEAD}:29500", f'["--node-rank", "{command.NODE_RANK}"]', command.JOB_ID],
                         capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == str(["gpu-node-07:29500", '["--node-rank", "1"]', "4242"])
    bare = subprocess.run([PY, "-m", "eagle3_console.runs.slurm.node_exec", "--", "true"], capture_output=True, text=True,
                          env={k: v for k, v in env.items() if k != "SLURM_NODEID"})
    assert bare.returncode == 2 and "SLURM_NODEID is not set" in bare.stderr


def test_a_registry_made_before_the_job_columns_gets_them_at_open(tmp_path):
    db = tmp_path / "state.db"
    conn = sqlite3.connect(db)
    from eagle3_console.kernel.registry import ADDED_COLUMNS, SCHEMA, Registry
    old = SCHEMA
    for name, decl in ADDED_COLUMNS.items():
        old = old.replace(f",\n    {name} {decl}", "")
    assert "job_id" not in old
    conn.executescript(old)
    conn.execute("INSERT INTO runs (stage, argv, params, cwd, status, created, log_path) "
                 "VALUES ('a', '[]', '{}', '/', 'succeeded', 1.0, '/x.log')")
    conn.commit()
    conn.close()
    with Registry(db) as reg:
        run = reg.get(1)
        assert (run.launcher, run.job_id) == ("local", None)
        reg.update(1, job_id="17", job_state="COMPLETED")
    with Registry(db) as reg:
        assert reg.get(1).job_id == "17"
