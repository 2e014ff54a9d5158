"""bin/test: the install runs on a fresh checkout and again only when what decides
it changed (pyproject.toml, bin/test itself, the interpreter); `--fast` runs the
fast tier; the suite runs on xdist workers; `bin/test -q` keeps pytest's counts.

The venv's interpreter is a stand-in (a shell script that records its argv):
the script under test is bin/test's shell logic, and a real install would pull
torch and SGLang for each case. It answers `-c ...` (bin/test asks the version)
with $FAKE_PY_VERSION, as `python -c 'import sys; print(sys.version)'` does, and
fails `pip install` when $FAKE_PIP_FAILS is set.
`bin/test -q` keeps pytest's counts (it must not become `-q -q`): that case runs bin/test for real
with VENV at a folder whose python is this interpreter, its `-m pip install` skipped."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

FAKE_PYTHON = """#!/usr/bin/env bash
case "$1" in
  -c) echo "$FAKE_PY_VERSION" ;;
  -m) echo "$2 ${*:3}" >> "$FAKE_LOG"
      if [ "$2" = pip ] && [ -n "${FAKE_PIP_FAILS:-}" ]; then exit 1; fi ;;
esac
"""


def checkout(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    (repo / "bin").mkdir(parents=True)
    shutil.copy(ROOT / "bin" / "test", repo / "bin" / "test")
    shutil.copy(ROOT / "pyproject.toml", repo / "pyproject.toml")
    python = repo / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    return repo


def bin_test(repo: Path, *args: str, version: str = "3.11.7", **env: str) -> list[str]:
    """Run bin/test; the interpreter's calls it made: ["pip install ...", "pytest ..."]."""
    log = repo / "calls.log"
    log.write_text("")
    proc = subprocess.run(["bash", str(repo / "bin" / "test"), *args], capture_output=True, text=True,
                          timeout=60, env=dict(os.environ, FAKE_LOG=str(log), FAKE_PY_VERSION=version, **env))
    calls = log.read_text().splitlines()
    assert proc.returncode == (1 if env.get("FAKE_PIP_FAILS") else 0), (proc.stdout, proc.stderr, calls)
    return calls


def installs(calls: list[str]) -> int:
    return sum(c.startswith("pip install") for c in calls)


def test_install_once_then_only_when_its_inputs_change(tmp_path):
    repo = checkout(tmp_path)
    first = bin_test(repo)
    assert installs(first) == 2 and first[-1].startswith("pytest"), first      # a fresh checkout installs
    again = bin_test(repo)
    assert installs(again) == 0 and again[-1].startswith("pytest"), again      # nothing changed
    with open(repo / "pyproject.toml", "a") as fh:
        fh.write("\n# a pin moved\n")
    assert installs(bin_test(repo)) == 2
    assert installs(bin_test(repo)) == 0
    assert installs(bin_test(repo, version="3.12.1")) == 2                      # another interpreter
    with open(repo / "bin" / "test", "a") as fh:
        fh.write("\n")
    assert installs(bin_test(repo, version="3.12.1")) == 2


def test_a_failed_install_is_tried_again_next_time(tmp_path):
    repo = checkout(tmp_path)
    calls = bin_test(repo, FAKE_PIP_FAILS="1")
    assert installs(calls) == 1 and not any(c.startswith("pytest") for c in calls), calls
    assert installs(bin_test(repo)) == 2


def test_fast_runs_the_fast_tier_and_both_run_on_xdist_workers(tmp_path):
    repo = checkout(tmp_path)
    full = bin_test(repo, "-k", "x")[-1]
    fast = bin_test(repo, "--fast", "-k", "x")[-1]
    workers = len(os.sched_getaffinity(0)) + 1     # one a core and one more (nproc: the CPUs this process may use)
    assert full == f"pytest -q -n {workers} --dist loadgroup --no-loadscope-reorder -k x", full
    assert fast == f"pytest -q -n {workers} --dist loadgroup --no-loadscope-reorder -m not slow -k x", fast
    assert (bin_test(repo, "-k", "x", EAGLE3_TEST_WORKERS="3")[-1]
            == "pytest -q -n 3 --dist loadgroup --no-loadscope-reorder -k x")


def collected(*args: str) -> list[str]:
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
                          capture_output=True, text=True, timeout=120, cwd=ROOT,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    return [line for line in proc.stdout.splitlines() if "::" in line]


TIER_FILES = ("tests/test_op_export.py", "tests/test_extract_engine.py")


@pytest.fixture(scope="module")
def tiers() -> dict[str, list[str]]:
    """Both tiers of the files the tier tests read, each collected once for the module (a
    collection of a torch file costs seconds; the tests filter by file)."""
    return {"every": collected(*TIER_FILES), "fast": collected("-m", "not slow", *TIER_FILES)}


def of(tests: list[str], path: str) -> list[str]:
    return [t for t in tests if t.split("::")[0] == path]


def test_a_test_using_a_slow_fixture_is_in_the_full_tier_only(tiers):
    """`assets` and `trained` (tests/conftest.py slow_fixture, the second through the
    first) are asked for by five of test_op_export's tests; its two others stay fast."""
    every = of(tiers["every"], "tests/test_op_export.py")
    fast = of(tiers["fast"], "tests/test_op_export.py")
    assert "tests/test_op_export.py::test_sglang_and_speculators_layouts" in every
    assert not any("sglang_and_speculators_layouts" in t for t in fast), fast
    assert sorted(t.split("::")[1] for t in fast) == ["test_missing_checkpoint_is_a_clear_error",
                                                      "test_sglang_ids_for_a_deepseek_family_target"]
    assert len(every) == 7


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
    # One xdist worker: the counts are the case (two tests), and each worker's start is a second of
    # CPU (pytest and its plugins) beside the suite that runs this.
    env = dict(os.environ, VENV=str(venv / "venv"), EAGLE3_TEST_WORKERS="1")
    proc = subprocess.run([str(ROOT / "bin" / "test"), *extra, "-p", "no:cacheprovider",
                           str(venv / "test_tiny.py")], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 passed" in proc.stdout, proc.stdout


def test_a_module_fixture_named_like_a_slow_one_is_its_own(tiers):
    """test_extract_engine's `assets` is its own (a tiny target), not the toy's: fast."""
    every = of(tiers["every"], "tests/test_extract_engine.py")
    assert every and of(tiers["fast"], "tests/test_extract_engine.py") == every
