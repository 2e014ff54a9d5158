"""Streamed online training (issue 35, item 2): an extract run (the producer,
a real subprocess) fills a bounded spool in the consumer's batch order, a
train run (the consumer) reads and deletes it. On the tiny target the
streamed drafter is the offline one, the spool never passes its cap, and the
pair survives a consumer killed mid-step, a producer killed at the watermark,
and both; a spool owned by another run, a folder that is no spool, a producer
of other layers and a cap below a batch are refused in one line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.conftest import ROOT, wait_for

torch = pytest.importorskip("torch")
torch.set_num_threads(1)

PY = sys.executable
# The toy's samples: 12-40 tokens, hidden 64, float32: a sample file of 16-46 KB; a consumer
# batch (256 tokens) up to 282 KB; the 8 held-out samples kept on the spool 257 KB.
CAP = 1_000_000


def _env() -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    env.pop("EAGLE3_RUN_ID", None)
    return env


def train_argv(assets, out, *extra) -> list[str]:
    return ["--vocab", str(assets["vocab"]), "--target", str(assets["target"]), "--output", str(out),
            "--workers", "0", "--lr", "3e-3", "--token-budget", "256", "--ttt-steps", "3", "--log-every", "1",
            "--warmup-ratio", "0", "--epochs", "2", "--holdout", "8", "--device", "cpu", "--save-every", "4",
            *extra]


def streamed(assets, spool) -> list[str]:
    return ["--mode", "streamed", "--samples", str(assets["samples"]), "--spool", str(spool), "--layer-ids", "0,1,2"]


class Procs:
    """The subprocesses a test starts, each ended when the test ends (also when it fails)."""

    def __init__(self, tmp: Path) -> None:
        self.tmp, self.procs = tmp, []

    def start(self, name: str, argv: list[str]) -> subprocess.Popen:
        log = open(self.tmp / f"{name}.log", "a")
        proc = subprocess.Popen([PY, *argv], cwd=ROOT, env=_env(), stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        log.close()
        self.procs.append(proc)
        return proc

    def producer(self, assets, spool, *extra) -> subprocess.Popen:
        return self.start("producer", ["-m", "ops.extract", *producer_argv(assets, spool, *extra)])

    def log(self, name: str) -> str:
        path = self.tmp / f"{name}.log"
        return path.read_text() if path.exists() else ""

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            proc.wait(30)


def producer_argv(assets, spool, *extra: str) -> list[str]:
    """The streamed producer's arguments: an extract into `spool`, three layers, the spool's cap."""
    return ["--input", str(assets["samples"]), "--output", str(spool), "--target", str(assets["target"]),
            "--spool-bytes", str(CAP), "--layer-ids", "0,1,2", "--device", "cpu", "--token-budget", "256", *extra]


@pytest.fixture
def procs(tmp_path):
    p = Procs(tmp_path)
    try:
        yield p
    finally:
        p.close()


def losses(out: Path) -> dict[int, float]:
    recs = {}
    for line in (out / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        recs[rec["step"]] = rec["loss"]
    return recs


@pytest.fixture(scope="module")
def offline_losses(assets, tmp_path_factory) -> dict[int, float]:
    from ops.train.__main__ import main

    out = tmp_path_factory.mktemp("offline") / "run"
    assert main(train_argv(assets, out, "--data", str(assets["data"]))) == 0
    return losses(out)


def same(got: dict[int, float], want: dict[int, float], after: int = 0) -> None:
    steps = [s for s in sorted(want) if s > after]
    assert sorted(s for s in got if s > after) == steps
    for s in steps:
        assert abs(got[s] - want[s]) <= 1e-4 * max(1.0, abs(want[s])), (s, got[s], want[s])


class SpoolWatch:
    """The spool's bytes, sampled in a thread while the pair runs: the largest seen."""

    def __init__(self, root: Path) -> None:
        from ops.spool import spool_bytes

        self.root, self.most, self.stop = root, 0, threading.Event()
        self.measure = spool_bytes
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.wait(0.01):
            self.most = max(self.most, self.measure(self.root))

    def close(self) -> int:
        self.stop.set()
        self.thread.join(5)
        return self.most


def test_streamed_trains_the_offline_drafter_within_the_cap(assets, tmp_path, procs, offline_losses, capsys):
    from ops.train.__main__ import main

    spool, out = tmp_path / "spool", tmp_path / "run"
    producer = procs.producer(assets, spool)
    watch = SpoolWatch(spool)
    try:
        assert main(train_argv(assets, out, *streamed(assets, spool))) == 0
    finally:
        most = watch.close()
    assert producer.wait(60) == 0
    same(losses(out), offline_losses)
    # Two epochs of 1.7 MB through a 1 MB spool: the producer blocked at the watermark, the cap held.
    assert "blocked at the high watermark" in procs.log("producer")
    assert 0 < most <= CAP, most
    # What is left: the kept (held-out) samples only.
    from ops.spool import spool_files

    held = json.loads((out / "train_config.json").read_text())["holdout"]
    assert sorted(spool_files(spool)) == sorted(held)
    last = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])["online"]
    assert last["spool_cap"] == CAP and "producer_state" in last and last["bound"] in ("target", "drafter")
    from ops.train.spec import SPEC

    line = SPEC.result_line(json.loads((out / "metrics.jsonl").read_text().splitlines()[-1]))
    assert "producer" in line and "spool" in line and "bound by the" in line, line


def _past(out: Path, step: int):
    def check():
        path = out / "metrics.jsonl"
        return path.exists() and any(json.loads(x)["step"] >= step for x in path.read_text().splitlines() if x)
    return check


def test_consumer_killed_mid_step_resumes_to_the_same_losses(assets, tmp_path, procs, offline_losses, capsys):
    from ops.train.__main__ import main

    spool, out = tmp_path / "spool", tmp_path / "run"
    procs.producer(assets, spool)
    argv = ["-m", "ops.train", *train_argv(assets, out, *streamed(assets, spool))]
    consumer = procs.start("consumer", argv)
    wait_for(lambda: _past(out, 5)() or consumer.poll() is not None, timeout=180)
    if consumer.poll() is not None:
        pytest.skip("the consumer finished before it could be killed")
    os.killpg(consumer.pid, signal.SIGKILL)
    consumer.wait(30)
    from ops.drafter import checkpoint as ck

    resumed_from = int(ck.newest(out).name.split("_")[-1])
    # The resumed consumer in this process (what is tested is the resume, not its process;
    # a subprocess cost 4-5 s of CPU in imports).
    capsys.readouterr()
    assert main(argv[2:] + ["--resume"]) == 0, procs.log("producer")
    same(losses(out), offline_losses, after=resumed_from)
    assert "streamed: " in capsys.readouterr().out


def test_producer_killed_at_the_watermark_the_consumer_waits_then_goes_on(assets, tmp_path, procs, offline_losses):
    from ops import spool as sp

    spool, out = tmp_path / "spool", tmp_path / "run"
    producer = procs.producer(assets, spool)
    consumer = procs.start("consumer", ["-m", "ops.train", *train_argv(assets, out, *streamed(assets, spool))])

    def blocked():
        try:
            return (sp.read_record(spool, sp.PRODUCER_FILE) or {}).get("state") == "blocked"
        except sp.SpoolError:
            return False
    wait_for(lambda: blocked() or consumer.poll() is not None, timeout=180)
    if consumer.poll() is not None:
        pytest.skip("the pair finished before the producer blocked")
    os.killpg(producer.pid, signal.SIGKILL)
    producer.wait(30)
    # The consumer reads what is on the spool, then waits, saying so (never a silent hang).
    wait_for(lambda: "streamed: waiting for the producer" in procs.log("consumer") or consumer.poll() is not None,
             timeout=180)
    assert consumer.poll() is None
    procs.producer(assets, spool)        # the console's restart policy would start it again
    assert consumer.wait(300) == 0, procs.log("consumer")
    same(losses(out), offline_losses)


def test_both_killed_then_restarted(assets, tmp_path, procs, offline_losses):
    from ops.train.__main__ import main

    spool, out = tmp_path / "spool", tmp_path / "run"
    producer = procs.producer(assets, spool)
    argv = ["-m", "ops.train", *train_argv(assets, out, *streamed(assets, spool))]
    consumer = procs.start("consumer", argv)
    wait_for(lambda: _past(out, 5)() or consumer.poll() is not None, timeout=180)
    if consumer.poll() is not None:
        pytest.skip("the consumer finished before it could be killed")
    for proc in (consumer, producer):
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
    from ops.drafter import checkpoint as ck

    resumed_from = int(ck.newest(out).name.split("_")[-1])
    producer = procs.producer(assets, spool)
    assert main(argv[2:] + ["--resume"]) == 0, procs.log("producer")      # the consumer again, in this process
    assert producer.wait(60) == 0
    same(losses(out), offline_losses, after=resumed_from)


def test_a_spool_owned_by_another_run_is_refused(assets, tmp_path, capsys):
    from ops import spool as sp
    from ops.train.__main__ import main

    spool = tmp_path / "spool"
    spool.mkdir()
    sp.write_record(spool, sp.SPOOL_FILE, {"consumer": "someone-else", "layer_ids": [0, 1, 2]})
    assert main(train_argv(assets, tmp_path / "run", *streamed(assets, spool))) == 2
    err = capsys.readouterr().err
    assert "owned by train run someone-else" in err and "Traceback" not in err, err


def test_a_folder_that_is_no_spool_is_refused_and_nothing_deleted(assets, tmp_path, capsys):
    import shutil

    from ops.train.__main__ import main

    data = tmp_path / "hs"
    shutil.copytree(assets["data"], data)
    before = sorted(p.name for p in data.rglob("*"))
    assert main(train_argv(assets, tmp_path / "run", *streamed(assets, data))) == 2
    err = capsys.readouterr().err
    assert "holds another extraction" in err and "Traceback" not in err, err
    assert sorted(p.name for p in data.rglob("*")) == before


@pytest.mark.parametrize("case", ["layers", "cap"])
def test_a_producer_that_does_not_fit_the_consumer_is_refused_naming_both(assets, tmp_path, capsys, case):
    from ops import spool as sp
    from ops.common import run_main
    from ops.extract.__main__ import main as extract_main

    spool = tmp_path / "spool"
    spool.mkdir()
    # The consumer's claim as a train run writes it (ops/train/streamed.py claim()).
    sp.write_record(spool, sp.SPOOL_FILE, sp.Claim(
        consumer="c1", samples=str(Path(assets["samples"]).resolve()), total_tokens=_tokens(assets),
        target=str(Path(assets["target"]).resolve()), layer_ids=[0, 1, 2], hidden_size=64, keep=[]).to_dict())
    sp.write_record(spool, sp.NEED_FILE, sp.plan_record(1, 0, 0, [[0, 1, 2, 3]], []))
    extra = ["--layer-ids", "0,1,3"] if case == "layers" else ["--spool-bytes", "20000"]
    # In this process, as `python -m ops.extract` runs main() (the refusal is what is tested).
    assert run_main(extract_main, producer_argv(assets, spool, *extra), prog="extract") == 2
    captured = capsys.readouterr()
    log = captured.out + captured.err
    want = ("layer_ids: the consumer trains on [0, 1, 2], this producer captures [0, 1, 3]" if case == "layers"
            else "spool_bytes 20000")
    assert want in log and "Traceback" not in log, log
    assert not sp.spool_files(spool)


def _tokens(assets) -> int:
    return json.loads((Path(assets["samples"]) / "summary.json").read_text())["total_tokens"]
