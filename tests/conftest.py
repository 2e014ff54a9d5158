"""Shared fixtures: real workspaces on disk and the CLI as a real subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Callable

import pytest

from tests.slurm_cluster import slurm  # noqa: F401  (the session fixture of a real one-node Slurm)

ROOT = Path(__file__).resolve().parent.parent
STAGES = Path(__file__).resolve().parent / "stages"
PY = sys.executable


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
        e.update(env or {})
        proc = subprocess.run([PY, "-m", "eagle3_console.cli", "-w", str(self.root), *args],
                              capture_output=True, text=True, timeout=timeout, env=e, cwd=str(self.root), **kw)
        if check is not None:
            assert proc.returncode == check, (proc.returncode, proc.stdout, proc.stderr)
        return proc

    def registry(self):
        from eagle3_console.registry import Registry
        return Registry(self.root / ".eagle3" / "state.db")

    def latest(self, stage: str):
        with self.registry() as reg:
            return reg.latest(stage)

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
