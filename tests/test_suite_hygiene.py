"""The suite's own rules (tests/conftest.py): a process a test leaves behind is ended at
its teardown, however it was started (a session of its own, a grandchild), and the
files go to the xdist workers longest first."""

from __future__ import annotations

import os
import subprocess
import sys

import psutil

from tests.conftest import FILE_SECONDS, TEST_TOKEN

LEFT: list[psutil.Process] = []


def test_a_test_that_leaves_a_daemon_and_its_child_behind():
    # A daemon in a session of its own (as a supervisor is) with a child of its own: both
    # carry this test's token, as every process a test starts with os.environ does.
    proc = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time\n"
                             "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
                             "print(c.pid, flush=True); time.sleep(600)"],
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    child = int(proc.stdout.readline())
    LEFT.extend([psutil.Process(proc.pid), psutil.Process(child)])
    assert os.environ[TEST_TOKEN]


def test_is_followed_by_none_of_its_processes():
    assert len(LEFT) == 2

    def gone(p: psutil.Process) -> bool:
        try:
            return p.status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True
    assert all(gone(p) for p in LEFT)       # the teardown waited until none was left: no wait here


def test_the_longest_files_go_first(request):
    names = [it.nodeid.split("::")[0].rsplit("/", 1)[-1] for it in request.session.items]
    measured = [n for n in dict.fromkeys(names) if n in FILE_SECONDS]
    assert measured == sorted(measured, key=lambda n: -FILE_SECONDS[n])
