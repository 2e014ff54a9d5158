"""Shared fixtures: real workspaces on disk, the CLI as a real subprocess (or
in this process, where no process is what a test is about), the toy target
and its extraction built once per run for every xdist worker, and the tiers:
a test that asks for a fixture made with slow_fixture (directly or through
another) is marked `slow`, which `bin/test --fast` leaves out."""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import textwrap
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

import pytest

from tests.slurm_cluster import slurm  # noqa: F401  (the session fixture of a real one-node Slurm)

ROOT = Path(__file__).resolve().parent.parent
STAGES = Path(__file__).resolve().parent / "stages"
PY = sys.executable


def slow_fixture(*args, **kwargs):
    """pytest.fixture, and every test using it (however indirectly) is in the full tier only."""
    def wrap(fn):
        fn.full_tier = True
        return pytest.fixture(*args, **kwargs)(fn)
    return wrap


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
    # The files that build something for their tests (the full tier's fixtures, a module's or
    # the session's own: a trained drafter, a real model's extraction, a Slurm) run longest:
    # xdist's loadfile hands files to the workers in this order, so they go first and the run
    # does not end on one of them alone. Stable: the order within each group stays.
    items.sort(key=lambda it: it.nodeid.split("::")[0] not in heavy_files)


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


def wait_for(pred: Callable[[], object], timeout: float = 20.0, poll: float = 0.05) -> object:
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(poll)
    raise AssertionError(f"condition not met within {timeout} s")


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

        argv = ["-w", str(self.root), *args]
        cwd = os.getcwd()
        with CliRunner().isolation(env={"EAGLE3_WORKSPACE": None, **(env or {})}) as (out, err, _mixed):
            os.chdir(self.root)
            try:
                cli.run(argv)
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            finally:
                os.chdir(cwd)
                sys.stdout.flush()      # print() writes through a buffer into the streams read below
                sys.stderr.flush()
            proc = subprocess.CompletedProcess(argv, code, out.getvalue().decode(), err.getvalue().decode())
        if check is not None:
            assert proc.returncode == check, (proc.returncode, proc.stdout, proc.stderr)
        return proc

    def registry(self):
        from eagle3_console.registry import Registry
        return Registry(self.root / ".eagle3" / "state.db")

    def latest(self, stage: str):
        with self.registry() as reg:
            return reg.latest(stage)

    def seen(self, stage: str):
        """The stage as a snapshot sees it (what the commands hand to actions.plan_restart)."""
        from eagle3_console.observe.snapshot import Collector
        from eagle3_console.workspace import Workspace
        col = Collector(Workspace.at(self.root), gpus=False)
        try:
            return col.collect().stage(stage)
        finally:
            col.close()

    def record_finished_run(self, stage: str, params: dict, status: str = "failed", ended_ago_s: float = 0.0):
        """A run in the registry as if a supervisor had recorded it (no process ran)."""
        from eagle3_console.workspace import Workspace
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
