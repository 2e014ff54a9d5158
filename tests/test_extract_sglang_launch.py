"""engine sglang as the console launches it: `extra_args` (checked by SGLang's own
parser, the engine's flags refused) and one process per TP rank under torchrun for
tp > 1, with the rank's own error in the failure alert.

TP > 1 cannot run SGLang here (no GPU, no kernels); what runs is the console's
argv through a real torchrun with gloo-less ranks that fail before the load, as
a rank with a wrong target path fails on the GPU host."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from ops.extract import sglang_args, sglang_capture
from ops.extract.__main__ import build_parser
from ops.extract.spec import SPEC

REPO = Path(__file__).resolve().parents[1]


def _sglang_parser():
    from sglang.srt.server_args import ServerArgs

    p = argparse.ArgumentParser()
    ServerArgs.add_cli_args(p)
    return p


def test_every_alias_of_a_flag_the_engine_sets_is_managed():
    """argparse keeps the last value of a field: an alias of an engine flag in
    extra_args would override it silently, so every alias the pinned parser
    gives those fields is in MANAGED."""
    parser = _sglang_parser()
    by_flag = {o: a for a in parser._actions for o in a.option_strings}
    engine = sglang_capture.server_argv(target="/m", tp=2, ep=1, dtype="bfloat16", context_length=64,
                                        config_layer_ids=[1], mem_fraction_static=0.5)
    dests = {by_flag[w].dest for w in engine if w.startswith("--")}
    aliases = {o for a in parser._actions if a.dest in dests for o in a.option_strings}
    assert aliases - set(sglang_args.MANAGED) == set()
    assert set(sglang_args.MANAGED) - set(by_flag) == set()       # no stale names
    assert sglang_args.INCOMPATIBLE - set(by_flag) == set()


def _params(**kw):
    return {"input": "in", "output": "out", "engine": "sglang", **kw}


def test_extra_args_reach_sglangs_parser_after_the_engines_flags():
    argv = SPEC.argv(_params(extra_args=["--attention-backend", "triton", "--json-model-override-args",
                                         '{"a": 1, "b": 2}']), target_path="/m", python="py")
    ns = build_parser().parse_args(argv[3:])
    words = json.loads(ns.extra_args)
    assert words == ["--attention-backend", "triton", "--json-model-override-args", '{"a": 1, "b": 2}']
    full = sglang_capture.server_argv(target="/m", tp=1, ep=1, dtype="bfloat16", context_length=64,
                                      config_layer_ids=[1], extra_args=words)
    args = sglang_capture.server_args(full)
    assert args.attention_backend == "triton" and args.disable_radix_cache is True


@pytest.mark.parametrize("words, message", [
    (["--tp-size", "4"], "extra_args sets --tp-size, which param tp sets for engine sglang: set that instead"),
    (["--tensor-parallel-size=4"], "extra_args sets --tensor-parallel-size, which param tp sets"),
    (["--chunked-prefill-size", "8192"], "extra_args sets --chunked-prefill-size, which the engine (one extend"),
    (["--dp-size", "2"], "extra_args --dp-size: engine sglang runs one TP group"),
])
def test_managed_and_incompatible_flags_are_lint_errors(words, message):
    lints = sglang_args.lint(SPEC.effective(_params(extra_args=words)), None)
    assert any(x.level == "error" and x.message.startswith(message) for x in lints), lints


def test_extra_args_on_the_hf_engine_is_an_error():
    lints = sglang_args.lint(SPEC.effective({"engine": "hf", "extra_args": ["--attention-backend", "triton"]}),
                            None)
    assert [x.message for x in lints] == ['extra_args: SGLang server flags, for engine = "sglang" only']


def test_tp_and_the_gpus_list_must_agree():
    assert [x.message for x in sglang_args.lint(SPEC.effective(_params(tp=8)), [0, 1, 2, 3])] == [
        "engine sglang: tp 8, but the stage's gpus list has 4 (0,1,2,3): one GPU a TP rank"]


def test_tp_above_one_is_launched_under_torchrun_by_the_console():
    argv = SPEC.argv(_params(tp=8, ep=8), target_path="/models/k", python="/venv/bin/python")
    assert argv[:9] == ["/venv/bin/python", "-m", "torch.distributed.run", "--standalone",
                        "--nproc-per-node", "8", "-m", "ops.extract", "--target"]
    ns = build_parser().parse_args(argv[8:])
    assert (ns.engine, ns.tp, ns.ep, ns.target) == ("sglang", 8, 8, "/models/k")
    # tp 1 and the HF engine: the op as it is.
    assert SPEC.argv(_params(tp=1), python="py")[:3] == ["py", "-m", "ops.extract"]
    assert SPEC.argv({"input": "i", "output": "o", "tp": 4}, python="py")[:3] == ["py", "-m", "ops.extract"]


def test_a_flag_sglang_does_not_know_is_refused_by_the_op_in_one_line(tmp_path):
    from tests.test_op_extract import make_prepared, make_target

    target, prepared = make_target(tmp_path / "t"), make_prepared(tmp_path / "p", n=2, seed=1)
    p = subprocess.run([sys.executable, "-m", "ops.extract", "--engine", "sglang", "--target", str(target),
                        "--input", str(prepared), "--output", str(tmp_path / "o"),
                        "--extra-args", json.dumps(["--attention-backnd", "triton"])],
                       cwd=REPO, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stderr
    assert "Traceback" not in p.stderr and p.stderr.count("\n") == 1, p.stderr
    assert p.stderr.startswith("extract: error: engine sglang: extra_args ['--attention-backnd', 'triton']: "
                               "SGLang's parser: "), p.stderr
    assert "unrecognized arguments: --attention-backnd triton" in p.stderr
    assert not (tmp_path / "o").exists()


PIPELINE = """
[target]
path = "models/missing"
num_layers = 4
hidden_size = 8
dtype = "bfloat16"
vocab_size = 32

[stages.extract]
op = "extract"
params = {{ input = "data/prepared", output = "data/hs", engine = "sglang", tp = 2, layer_ids = [0, 1, 2], extra_args = {extra} }}
"""


def test_the_console_runs_tp_2_under_torchrun_and_the_alert_is_the_ranks_error(ws):
    ws.write(PIPELINE.format(extra='["--attention-backend", "triton"]'))
    (ws.root / "data" / "prepared").mkdir(parents=True)
    (ws.root / "data" / "prepared" / "summary.json").write_text(json.dumps({"samples": 2, "total_tokens": 10}))
    # A target folder without its files (run refuses one that is not there): the ranks fail on it.
    (ws.root / "models" / "missing").mkdir(parents=True)
    p = ws.cli("run", "extract", "--force")
    assert p.returncode == 0, (p.stdout, p.stderr)
    run = ws.wait_status("extract", ("failed", "succeeded"), timeout=120)
    assert run.status == "failed"
    assert run.argv[1:7] == ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m"]
    log = Path(run.log_path).read_text()
    assert "ChildFailedError" in log, log[-2000:]
    snap = json.loads(ws.cli("status", "--json", "--no-gpus").stdout)
    alert = next(a for a in snap["alerts"] if a["code"] == "stage_failed")
    assert "ChildFailedError" not in (alert["line"] or "")
    assert alert["line"].startswith("extract: error: target models/missing"), alert
    assert "config.json" in alert["line"]


def test_a_managed_flag_refuses_the_run_before_launch(ws):
    ws.write(PIPELINE.format(extra='["--tp-size", "4"]'))
    p = ws.cli("run", "extract")
    assert p.returncode == 3, (p.stdout, p.stderr)
    assert "extra_args sets --tp-size, which param tp sets for engine sglang" in p.stdout + p.stderr
    assert ws.latest("extract") is None
