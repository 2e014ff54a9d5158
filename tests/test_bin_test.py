"""bin/test's own arguments: `bin/test -q` keeps pytest's counts (before, it ran
`pytest -q -q`, which hides them). bin/test runs for real with VENV pointing at
a folder whose python is this interpreter, except that its `-m pip install`
is skipped: the packages are installed already, and installing would re-point
the shared environment at this checkout."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT

PASSING = "def test_one():\n    assert True\n\ndef test_two():\n    assert True\n"


@pytest.fixture
def venv(tmp_path):
    bin_ = tmp_path / "venv" / "bin"
    bin_.mkdir(parents=True)
    shim = bin_ / "python"
    shim.write_text(f'#!/bin/sh\n[ "$1 $2" = "-m pip" ] && exit 0\nexec "{sys.executable}" "$@"\n')
    shim.chmod(0o755)
    (tmp_path / "test_tiny.py").write_text(PASSING)
    return tmp_path


@pytest.mark.parametrize("extra", [[], ["-q"]], ids=["default", "-q"])
def test_bin_test_reports_the_counts(venv, extra):
    env = dict(os.environ, VENV=str(venv / "venv"))
    proc = subprocess.run([str(ROOT / "bin" / "test"), *extra, "-p", "no:cacheprovider",
                           str(venv / "test_tiny.py")], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 passed" in proc.stdout, proc.stdout
