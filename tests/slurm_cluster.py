"""A real one-node Slurm for the tests: munged, slurmctld and slurmd from the
distribution's packages (Debian 12: slurm-wlm 22.05, munge), configured in a
temp dir, on free ports, no accounting, `proctrack/linuxproc` and `task/none`
(no cgroups in a container). One per test session; skipped, with the reason,
where Slurm is not installed or the tests do not run as root (slurmd must).
The node is kept small (2 CPUs, 1000 MB): other tests share the machine.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from tests.procs import alive, holding_env

NODE = "e3node"
PARTITION = "e3part"
DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "squeue", "scontrol", "scancel", "sinfo", "srun")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _daemon(name: str) -> str | None:
    return shutil.which(name) or next((p for p in (f"/usr/sbin/{name}", f"/sbin/{name}") if os.path.exists(p)), None)


class Cluster:
    def __init__(self, root: Path):
        self.root = root
        self.conf = root / "slurm.conf"
        self.env = dict(os.environ, SLURM_CONF=str(self.conf))

    def run(self, *argv: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
        out = subprocess.run(list(argv), capture_output=True, text=True, env=self.env, timeout=timeout)
        if check:
            assert out.returncode == 0, (argv, out.stdout, out.stderr)
        return out

    def node_state(self) -> str:
        return self.run("sinfo", "-h", "-n", NODE, "-o", "%t", check=False).stdout.strip()

    def wait_idle(self, timeout: float = 60) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.node_state() == "idle":
                return
            time.sleep(0.5)
        raise AssertionError(f"node {NODE} not idle within {timeout} s: {self.node_state()!r}\n"
                             + (self.root / "slurmctld.log").read_text()[-3000:])

    def job(self, job_id: str) -> str:
        return self.run("scontrol", "show", "job", "-o", str(job_id), check=False).stdout

    # MessageTimeout 4 (Slurm's default is 10): a client retries a controller that is down for
    # MessageTimeout - 1 s before it says so (scontrol twice: 18 s by default, 6 s here), which the
    # tests that stop the controller waited out at every call; 4 s is still past the 3 s the
    # console's own reconcile gives scontrol (runs/slurm/control.py RECONCILE_TIMEOUT_S).
    def write_config(self) -> None:
        host = socket.gethostname().split(".")[0]
        r = self.root
        (r / "state").mkdir()
        (r / "spool").mkdir()
        self.conf.write_text(f"""\
ClusterName=e3test
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={r}/munge.socket
SlurmUser=root
SlurmdUser=root
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool
SlurmctldPidFile={r}/slurmctld.pid
SlurmdPidFile={r}/slurmd.pid
SlurmctldLogFile={r}/slurmctld.log
SlurmdLogFile={r}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
MessageTimeout=4
MinJobAge=300
NodeName={NODE} NodeHostname={host} NodeAddr=127.0.0.1 CPUs=2 RealMemory=1000 State=UNKNOWN
PartitionName={PARTITION} Nodes={NODE} Default=YES MaxTime=INFINITE State=UP
""")

    def start(self) -> None:
        r = self.root
        self.write_config()
        key = r / "munge.key"
        key.write_bytes(os.urandom(128))
        key.chmod(0o600)
        self.run(_daemon("munged"), f"--socket={r}/munge.socket", f"--key-file={key}", f"--pid-file={r}/munged.pid",
                 f"--log-file={r}/munged.log", f"--seed-file={r}/munged.seed", "--force")
        self.run(_daemon("slurmctld"), "-f", str(self.conf))
        self.run(_daemon("slurmd"), "-f", str(self.conf), "-N", NODE)
        self.wait_idle()

    def stop(self) -> None:
        self.run("scancel", "--full", "--partition", PARTITION, check=False)
        # The jobs leave first (a step daemon whose slurmd is gone stays behind), then the three
        # daemons at once, waited for together: one after the other took 5-12 s of every teardown.
        _within(10, lambda: not self.run("squeue", "-h", check=False, timeout=10).stdout.strip(), poll=0.2)
        pids = []
        for name in ("slurmd", "slurmctld", "munged"):
            try:
                pid = int((self.root / f"{name}.pid").read_text().split()[0])
                os.kill(pid, signal.SIGTERM)
            except (OSError, ValueError, IndexError):
                continue
            pids.append(pid)
        # A slurmd whose node was set down took 10 s and more to leave: after 5 s this throwaway
        # cluster's daemons are killed, and so is whatever still runs with its configuration
        # (a step daemon, a job's process). The waits bound a teardown, they decide nothing:
        # what outlasts them is killed.
        if not _within(5, lambda: not any(alive(pid) for pid in pids)):
            for pid in [pid for pid in pids if alive(pid)]:     # not a pid that left and was reused
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            _within(5, lambda: not any(alive(pid) for pid in pids))
        for pid in holding_env(f"SLURM_CONF={self.conf}"):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass



def _within(seconds: float, done, poll: float = 0.1) -> bool:
    """Whether done() came true within `seconds` (a teardown's bound, never a test's verdict)."""
    deadline = time.time() + seconds
    while not done():
        if time.time() >= deadline:
            return False
        time.sleep(poll)
    return True


def why_not() -> str | None:
    missing = [d for d in DAEMONS if _daemon(d) is None] + [c for c in CLIENTS if shutil.which(c) is None]
    if missing:
        return f"Slurm is not installed here (missing {', '.join(missing)}; apt-get install slurm-wlm munge)"
    if os.geteuid() != 0:
        return "the test Slurm runs slurmd as root, and these tests do not run as root"
    return None


@pytest.fixture(scope="session")
def slurm(tmp_path_factory):
    why = why_not()
    if why:
        pytest.skip(why)
    cluster = Cluster(tmp_path_factory.mktemp("slurm"))
    old = os.environ.get("SLURM_CONF")
    try:
        cluster.start()
        os.environ["SLURM_CONF"] = str(cluster.conf)     # the console's subprocesses find the cluster
        yield cluster
    finally:
        cluster.stop()
        if old is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = old
