"""The real console in a real terminal: `eagle3-console -w WS` inside tmux,
the screen read back with `tmux capture-pane -p`. Quitting says that running
stages keep running; killing the terminal makes the console exit (it does
not spin) while the stage it watched keeps running."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from eagle3_console.kernel import config as cfg
from eagle3_console import runs
from eagle3_console.monitor.procs import process_alive
from eagle3_console.kernel.workspace import Workspace
from tests.conftest import wait_for
from tests.test_tui_helpers import pipeline

# CI installs tmux (.ci/run) and sets EAGLE3_REQUIRE_TMUX: there a missing tmux
# fails these tests instead of skipping them unseen.
if shutil.which("tmux") is None and os.environ.get("EAGLE3_REQUIRE_TMUX"):
    raise RuntimeError("tmux is required here (EAGLE3_REQUIRE_TMUX is set) but not installed")
pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux not installed")


def console_cmd(ws_root: Path) -> str:
    script = Path(sys.executable).parent / "eagle3-console"
    exe = str(script) if script.exists() else f"{sys.executable} -m eagle3_console.cli"
    return f"{exe} -w {ws_root}"


class Tmux:
    def __init__(self, root: Path, name: str):
        self.sock, self.name = str(root / "tmux.sock"), name

    def __call__(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(["tmux", "-S", self.sock, *args], capture_output=True, text=True, check=check)

    def start(self, command: str, size: tuple[int, int]) -> None:
        # COLUMNS/LINES left in this process by a Textual test on the same xdist worker would size
        # the console (shutil.get_terminal_size reads them before the tty): the pane's size decides.
        env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "TEXTUAL", "COLUMNS", "LINES")}
        env["TERM"] = "xterm-256color"
        subprocess.run(["tmux", "-S", self.sock, "new-session", "-d", "-s", self.name, "-x", str(size[0]),
                        "-y", str(size[1]), command], check=True, env=env)

    def screen(self) -> str:
        return self("capture-pane", "-p", "-t", self.name, check=False).stdout

    def wait_screen(self, *needles: str, timeout: float = 30) -> str:
        wait_for(lambda: all(n in self.screen() for n in needles), timeout=timeout, poll=0.2)
        return self.screen()

    def keys(self, *keys: str) -> None:
        self("send-keys", "-t", self.name, *keys)

    def pane_pid(self) -> int:
        return int(self("list-panes", "-t", self.name, "-F", "#{pane_pid}").stdout.split()[0])

    def kill(self) -> None:
        self("kill-server", check=False)


def console_process(pane_pid: int) -> psutil.Process:
    pane = psutil.Process(pane_pid)
    for p in [pane, *pane.children(recursive=True)]:
        if any("eagle3" in part for part in p.cmdline()):
            return p
    raise AssertionError(f"no console under pane pid {pane_pid}")


@pytest.fixture
def live_ws(ws):
    ws.write(pipeline(ws.root))
    w = Workspace.at(ws.root)
    r = runs.launch(w, cfg.load(w.config_path), "slow", {"seconds": 120})
    yield ws, r
    try:
        runs.stop(w, "slow", grace_s=2)
    except runs.Refused:
        pass


def test_console_in_tmux_shows_the_run_and_quit_says_it_keeps_running(live_ws):
    ws, r = live_ws
    tmux = Tmux(ws.root, f"e3tui{os.getpid()}")
    try:
        tmux.start(console_cmd(ws.root) + "; echo CONSOLE-EXITED $?; sleep 60", (100, 30))
        tmux.wait_screen("Stages", "slow", "running", "NVML unavailable", "s start", "q quit")
        tmux.keys("q")
        screen = tmux.wait_screen("keep running")
        assert f"slow (run {r.id}, pid {r.pid}, running)" in screen
        tmux.keys("q")
        screen = tmux.wait_screen("CONSOLE-EXITED 0")
        assert "still running (supervised): slow" in screen
    finally:
        tmux.kill()
    assert process_alive(r.pid, r.create_time)


def test_console_exits_when_its_terminal_goes_away(live_ws):
    ws, r = live_ws
    tmux = Tmux(ws.root, f"e3gone{os.getpid()}")
    try:
        tmux.start(console_cmd(ws.root), (80, 24))
        tmux.wait_screen("Stages", "running")
        console = console_process(tmux.pane_pid())
    finally:
        tmux.kill()
    try:
        # Gone, not spinning on a dead terminal.
        wait_for(lambda: not console.is_running() or console.status() == psutil.STATUS_ZOMBIE, timeout=15)
    finally:
        if console.is_running() and console.status() != psutil.STATUS_ZOMBIE:
            console.kill()
    assert process_alive(r.pid, r.create_time)
