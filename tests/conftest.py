"""Shared fixtures: real workspaces on disk, the CLI as a real subprocess (or
in this process, where no process is what a test is about), the toy target
and its extraction built once per run for every xdist worker, and the tiers:
a test that asks for a fixture made with slow_fixture (directly or through
another) is marked `slow`, which `bin/test --fast` leaves out."""

from __future__ import annotations

import fcntl
import hashlib
import itertools
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

import pytest

from tests.procs import holding_env
from tests.slurm_cluster import slurm  # noqa: F401  (the session fixture of a real one-node Slurm)

ROOT = Path(__file__).resolve().parent.parent
STAGES = Path(__file__).resolve().parent / "stages"
PY = sys.executable

# One compute thread for torch in this process and every process a test starts (they inherit it):
# the suite runs a torch-heavy lane a core (group_into_lanes), and a second thread on matrices this
# small only contends with the other lane; its OpenMP workers spin while they wait. The demo test
# took 135 CPU-seconds with two threads, 106 with one, the same figures (idle 2 cores). A test
# that sets its own count (env=, torch.set_num_threads) keeps it.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# Inductor's code generation in the process that compiles, not in a pool of compile workers: each
# worker is a process importing torch, and the suite's graphs are small (test_op_extract's compiled
# layers: 36 CPU-s with one thread, 42 with the default pool, the same wall, idle 2 cores).
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")


def slow_fixture(*args, **kwargs):
    """pytest.fixture, and every test using it (however indirectly) is in the full tier only."""
    def wrap(fn):
        fn.full_tier = True
        return pytest.fixture(*args, **kwargs)(fn)
    return wrap


@pytest.hookimpl(tryfirst=True)     # before xdist's own, which reads the xdist_group marks set here
def pytest_collection_modifyitems(config, items):
    heavy_files = set()
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        # The definition each name resolves to for this test (a module's own
        # fixture of the same name overrides the shared one).
        defs = [d[-1] for d in (info.name2fixturedefs.values() if info else ()) if d]
        if any(getattr(d.func, "full_tier", False) for d in defs):
            item.add_marker(pytest.mark.slow)
        if item.get_closest_marker("slow") or any(d.scope in ("module", "session") and d.baseid for d in defs):
            heavy_files.add(item.nodeid.split("::")[0])
    # Longest first (LPT): xdist's loadfile hands files to the workers in this order (bin/test
    # passes --no-loadscope-reorder: xdist's own order, by number of tests, put the two longest
    # files, one test each, last, and the run ended on them alone). The measured files by their
    # seconds (FILE_SECONDS); then the files that build something for their tests (the full
    # tier's fixtures, a module's or the session's own: a trained drafter, a real model's
    # extraction, a Slurm); then the rest. Stable: the order within a file stays.
    def cost(item):
        path = item.nodeid.split("::")[0]
        return (-FILE_SECONDS.get(path.rsplit("/", 1)[-1], 0), path not in heavy_files)
    items.sort(key=cost)
    if config.getoption("loadgroup", False):
        group_into_lanes(items, int(os.environ.get("EAGLE3_TEST_LANES") or len(os.sched_getaffinity(0))))


def group_into_lanes(items, lanes: int) -> None:
    """Under `--dist loadgroup` (bin/test): the torch-heavy files (TORCH_FILES: they train,
    extract or build models, a core each while they run) go into `lanes` groups (one a core,
    balanced by FILE_SECONDS, longest first), each group run by one worker in turn; every other
    file is a group of its own, as loadfile has it (its module fixtures built once). With more
    workers than lanes, the files that mostly wait (on a supervisor, a Slurm job, a server,
    a CLI subprocess) fill the cores while the lanes compute, and never more torch-heavy
    files run at once than there are lanes."""
    load = [0] * max(1, lanes)
    lane: dict[str, int] = {}
    for path in dict.fromkeys(it.nodeid.split("::")[0] for it in items):
        name = path.rsplit("/", 1)[-1]
        if name in TORCH_FILES:
            k = load.index(min(load))
            lane[path] = k
            load[k] += FILE_SECONDS.get(name, 10)
    for it in items:
        path = it.nodeid.split("::")[0]
        name = path.rsplit("/", 1)[-1]
        group = f"torch-lane-{lane[path]}" if path in lane else "slurm" if name in SLURM_FILES else path
        it.add_marker(pytest.mark.xdist_group(group))


# The files that use the session's Slurm (tests/slurm_cluster.py): one group, so one worker
# starts one cluster for them all.
SLURM_FILES = {"test_slurm_jobs.py", "test_faults4_slurm.py"}


# The files that compute with torch most of their time (train, extract, export, bench, build
# a model or the demo): at most one of them a lane at a time under bin/test.
TORCH_FILES = {
    "test_faults_train_export.py", "test_e2e_demo.py", "test_formats_training.py",
    "test_benchmarks_throughput.py", "test_train_streamed.py", "test_extract_sglang.py",
    "test_export_moved.py", "test_realmodel.py", "test_op_extract.py", "test_sim_acceptance.py",
    "test_faults_reexport.py", "test_verify_realmodel.py", "test_op_bench.py", "test_op_train.py",
    "test_faults_ops.py", "test_train_report.py", "test_length_buckets.py", "test_bench_table.py",
    "test_demo_assets.py", "test_op_regenerate.py", "test_extract_sglang_launch.py",
    "test_failure_cause.py",
}


# Seconds each file took in a full run (--durations=0, summed per file: .ci/run on a fresh clone of
# beb883b, 2 idle cores, bin/test's 3 workers and lanes, one torch thread a process; 7:52 in all).
# Only the order matters (and the lanes' balance: 339 and 335 s with these, where the figures before
# left 390 and 284): the files over 8 s, longest first.
FILE_SECONDS = {
    "test_e2e_demo.py": 110, "test_slurm_jobs.py": 96, "test_faults_train_export.py": 63,
    "test_extract_sglang.py": 62, "test_op_extract.py": 58, "test_train_streamed.py": 53, "test_faults_data.py": 48,
    "test_faults4_runs.py": 47, "test_benchmarks_throughput.py": 43, "test_formats_training.py": 41,
    "test_length_buckets.py": 39, "test_op_bench_sglang.py": 38, "test_realmodel.py": 35, "test_faults_clean.py": 33,
    "test_serve_e2e.py": 32, "test_faults.py": 32, "test_verify_realmodel.py": 25, "test_faults4_slurm.py": 23,
    "test_runs.py": 19, "test_faults_reexport.py": 19, "test_faults_supervise.py": 18, "test_faults_watch.py": 17,
    "test_faults_registry.py": 17, "test_op_train.py": 17, "test_bin_test.py": 16, "test_op_regenerate.py": 15,
    "test_faults_ops.py": 15, "test_watch.py": 14, "test_sim_acceptance.py": 14, "test_tui.py": 14,
    "test_export_moved.py": 13, "test_monitor_serve.py": 13, "test_bench_table.py": 13, "test_actions.py": 12,
    "test_faults_exporter.py": 12, "test_bench_kinds.py": 12, "test_interrupted_actions.py": 11,
    "test_extract_sglang_launch.py": 10, "test_train_report.py": 9, "test_hosts.py": 8, "test_demo_assets.py": 8,
    "test_regenerate_data.py": 8,
}


TEST_TOKEN = "EAGLE3_TEST_TOKEN"
_tokens = itertools.count()


def _token_holders(token: str) -> list[int]:
    """The processes started with this test's token in their environment (inherited by
    every process a test starts that is given os.environ or a copy of it)."""
    return holding_env(f"{TEST_TOKEN}={token}")


@pytest.fixture(autouse=True)
def ends_its_processes(monkeypatch):
    """Every process a test starts ends with the test, also when the test failed or a
    supervisor, a daemon or a fake server it started outlived it: each carries the
    test's token in its environment, and whatever still carries it at teardown is
    SIGKILLed with its process group. (A fixture of a wider scope is set up before
    this one, so what a module or the session starts is not the test's.)"""
    token = f"{os.getpid()}-{next(_tokens)}"
    monkeypatch.setenv(TEST_TOKEN, token)
    yield
    if not os.path.isdir("/proc"):
        return
    for _ in range(5):
        pids = _token_holders(token)
        if not pids:
            return
        for pid in pids:
            try:
                if os.getpgid(pid) == pid:
                    os.killpg(pid, signal.SIGKILL)
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.05)


@contextmanager
def exclusive(lock: Path) -> Iterator[None]:
    """Held by one process at a time (xdist workers, other runs on this machine)."""
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def shared_dir(config: pytest.Config, tmp_path_factory: pytest.TempPathFactory, name: str) -> Path:
    """A folder every xdist worker of this run sees: pytest's cache (kept between
    runs), else the run's temporary root (a worker's basetemp is one below it)."""
    cache = getattr(config, "cache", None)
    if cache is not None:
        return cache.mkdir(name)
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent
    (base / name).mkdir(exist_ok=True)
    return base / name


@slow_fixture(scope="session")
def assets(request, tmp_path_factory) -> dict[str, Path]:
    """The toy target, its extraction and draft vocabulary (ops/drafter/toy.py), built
    once per version of toy.py and shared read-only by the modules that train on it."""
    pytest.importorskip("torch")
    from ops.drafter import toy

    digest = hashlib.sha1(Path(toy.__file__).read_bytes()).hexdigest()[:12]
    root = shared_dir(request.config, tmp_path_factory, f"eagle3-toy-{digest}")
    with exclusive(root.with_name(root.name + ".lock")):
        return toy.toy_assets(root)


@slow_fixture(scope="session")
def trained(assets, tmp_path_factory) -> Path:
    """One train run on the toy assets, shared read-only by the modules that export
    or load a drafter: checkpoints 2 and 4 (holdout 4, for export's --check)."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent
    out = base / "eagle3-trained" / "train"
    with exclusive(base / "eagle3-trained.lock"):
        if not (out.parent / "done").exists():
            shutil.rmtree(out.parent, ignore_errors=True)
            env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(
                p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
            env.pop("EAGLE3_RUN_ID", None)
            proc = subprocess.run(
                [PY, "-m", "ops.train", "--data", str(assets["data"]), "--vocab", str(assets["vocab"]),
                 "--target", str(assets["target"]), "--output", str(out), "--workers", "0", "--lr", "3e-3",
                 "--token-budget", "256", "--ttt-steps", "3", "--log-every", "1", "--warmup-ratio", "0",
                 "--device", "cpu", "--max-steps", "4", "--save-every", "2", "--keep", "0", "--holdout", "4"],
                capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
            assert proc.returncode == 0, proc.stderr
            (out.parent / "done").write_text("")
    return out


@pytest.fixture(scope="session")
def extraction(tmp_path_factory) -> tuple[Path, Path, Path]:
    """(target, prepared, output): a tiny Llama target (tests/test_op_extract.py make_target),
    24 prepared samples (seed 4) and their uninterrupted extraction (--token-budget 150), made
    once per run for every xdist worker and shared read-only: a test that damages the output
    copies it first (shutil.copytree), one that reads it takes it as it is."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from ops.common import run_main
    from ops.extract.__main__ import main as extract_main
    from tests.test_op_extract import extract_argv, make_prepared, make_target

    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent
    root = base / "eagle3-extraction"
    target, prepared, out = root / "target", root / "prep", root / "ref"
    with exclusive(base / "eagle3-extraction.lock"):
        if not (root / "done").exists():
            shutil.rmtree(root, ignore_errors=True)
            make_target(target)
            make_prepared(prepared, n=EXTRACTION_SAMPLES, seed=4)
            assert run_main(extract_main, extract_argv(target, prepared, out, "--token-budget", "150")) == 0
            (root / "done").write_text("")
    return target, prepared, out


EXTRACTION_SAMPLES = 24


# Stands for what aborted a rank after a complete run in CI (SIGABRT, "terminate called without an
# active exception"): torch's C++ distributed runtime torn down during the interpreter's exit
# (gloo's threads and the work they hold; pytorch/pytorch#179291 describes it). A sitecustomize
# on PYTHONPATH loads it into every torchrun worker (LOCAL_RANK set), not into the launcher.
ABORT_AT_EXIT = """
import atexit, os
if "LOCAL_RANK" in os.environ:
    atexit.register(os.abort)
"""


def ranks_abort_at_exit(tmp_path: Path, env: dict) -> dict:
    """`env` for a torchrun whose workers abort if they reach the interpreter's exit
    (ops/common.exit_program keeps a rank from it), with Python's tracebacks on a fatal signal."""
    site = tmp_path / "abort_at_exit"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(ABORT_AT_EXIT)
    return dict(env, PYTHONFAULTHANDLER="1",
                PYTHONPATH=os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH")])))


def wait_for(pred: Callable[[], object], timeout: float = 20.0, poll: float = 0.05) -> object:
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(poll)
    raise AssertionError(f"condition not met within {timeout} s")


PIPE_WIDTH = 160       # cli/out.py's width for output that is not a terminal


class WS:
    def __init__(self, root: Path):
        self.root = root

    def write(self, toml: str) -> "WS":
        (self.root / "eagle3.toml").write_text(textwrap.dedent(toml))
        return self

    def cli(self, *args: str, check: int | None = None, timeout: float = 60, env: dict | None = None,
            **kw) -> subprocess.CompletedProcess:
        e = dict(os.environ)
        e.pop("EAGLE3_WORKSPACE", None)
        # A pipe's width, as cron and scripts see it: a COLUMNS left in this process by a
        # terminal test (Textual's headless runs set it) would squeeze the tables.
        e.pop("COLUMNS", None)
        e.pop("LINES", None)
        e.update(env or {})
        proc = subprocess.run([PY, "-m", "eagle3_console.cli", "-w", str(self.root), *args],
                              capture_output=True, text=True, timeout=timeout, env=e, cwd=str(self.root), **kw)
        if check is not None:
            assert proc.returncode == check, (proc.returncode, proc.stdout, proc.stderr)
        return proc

    def call(self, *args: str, check: int | None = None, env: dict | None = None,
             **_ignored) -> subprocess.CompletedProcess:
        """The CLI in this process (typer's CliRunner streams, cli.run as the console
        script runs it): for a check or a refusal, where no process is what is tested.
        An exception the CLI does not turn into an exit propagates (a traceback)."""
        from typer.testing import CliRunner

        from eagle3_console import cli
        from eagle3_console.cli import out as cli_out

        argv = ["-w", str(self.root), *args]
        cwd = os.getcwd()
        # As ws.cli's process on a pipe has it: no COLUMNS, and the consoles made afresh at the
        # pipe's width (cli/out.py fixes its width at import, when a terminal test may have left
        # COLUMNS in this process, and makes its consoles once).
        consoles = (cli_out.out, cli_out.err)
        saved = [(c._kwargs.get("width"), c._console) for c in consoles]
        for c in consoles:
            c._kwargs["width"], c._console = PIPE_WIDTH, None
        with CliRunner().isolation(env={"EAGLE3_WORKSPACE": None, "COLUMNS": None, "LINES": None,
                                        **(env or {})}) as (out, err, _mixed):
            os.chdir(self.root)
            try:
                cli.run(argv)
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            finally:
                os.chdir(cwd)
                for c, (width, console) in zip(consoles, saved):
                    c._kwargs["width"], c._console = width, console
                sys.stdout.flush()      # print() writes through a buffer into the streams read below
                sys.stderr.flush()
            proc = subprocess.CompletedProcess(argv, code, out.getvalue().decode(), err.getvalue().decode())
        if check is not None:
            assert proc.returncode == check, (proc.returncode, proc.stdout, proc.stderr)
        return proc

    def registry(self):
        from eagle3_console.kernel.registry import Registry
        return Registry(self.root / ".eagle3" / "state.db")

    def latest(self, stage: str):
        with self.registry() as reg:
            return reg.latest(stage)

    def seen(self, stage: str):
        """The stage as a snapshot sees it (what the commands hand to actions.plan_restart)."""
        from eagle3_console.observe.snapshot import Collector
        from eagle3_console.kernel.workspace import Workspace
        col = Collector(Workspace.at(self.root), gpus=False)
        try:
            return col.collect().stage(stage)
        finally:
            col.close()

    def record_finished_run(self, stage: str, params: dict, status: str = "failed", ended_ago_s: float = 0.0):
        """A run in the registry as if a supervisor had recorded it (no process ran)."""
        from eagle3_console.kernel.workspace import Workspace
        w = Workspace(self.root)
        w.ensure_state()
        with self.registry() as reg:
            run = reg.create_run(stage, [stage], params, {}, str(self.root), lambda rid: w.log_path(rid, stage))
            reg.finish(run.id, status, ended=time.time() - ended_ago_s, exit_code=1)
            return reg.get(run.id)

    def wait_status(self, stage: str, statuses: tuple[str, ...], timeout: float = 30):
        def done():
            r = self.latest(stage)
            return r if r and r.status in statuses else None
        return wait_for(done, timeout)


@pytest.fixture
def ws(tmp_path: Path) -> WS:
    return WS(tmp_path)


def extract_pipeline(params: str, extra: str = "") -> str:
    """A pipeline of one extract stage on a small (absent) target: its runs are recorded by hand."""
    return f"""
[target]
path = "models/target"
num_layers = 8
hidden_size = 16

[stages.extract]
op = "extract"
{extra}params = {{ input = "data/prepared", output = "data/hs"{params} }}
"""


# A target that is never loaded: what an op's plan and lints read of it.
TINY_TARGET = """
[target]
path = "models/target"
num_layers = 2
hidden_size = 8
dtype = "bfloat16"
vocab_size = 10
"""

# An op stage that needs no input to be planned: its runs are recorded by hand.
EXPORT_PIPELINE = TINY_TARGET + """
[stages.export]
op = "export"
params = { checkpoint = "out/ckpt", output = "out/export" }
"""


def stage_cmd(script: str, *args: str) -> str:
    """A TOML argv list running one of tests/stages/*.py."""
    parts = ["python", str(STAGES / script), *args]
    return "[" + ", ".join(f'"{p}"' for p in parts) + "]"


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """SmolLM2-135M-Instruct as a Hugging Face folder (ops/demo/realmodel.py), converted
    once into the user's cache; skipped where the `smollm2` extra is not installed."""
    from ops.demo.realmodel import MissingExtra, ensure_smollm2
    try:
        return ensure_smollm2()
    except MissingExtra as exc:
        pytest.skip(str(exc))
