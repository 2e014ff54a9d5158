"""The serve op: its argv, validated by the pinned SGLang's own parser, and its lints.

sglang 0.5.23 is installed with --no-deps by bin/test (its GPU kernel
packages are not, and are not needed to import sglang.srt.server_args on CPU).
What these tests check against real SGLang: ServerArgs.add_cli_args builds
the parser, parse_args accepts every argv the op can build, and
ServerArgs.from_cli_args constructs the (unresolved) record; resolve_once,
which reads the checkpoint and the GPUs, is not run.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from ops import get_spec
from tests.conftest import ROOT
from ops.serve import command
from ops.serve.__main__ import main as serve_main
from ops.serve.spec import SPEC as SERVE


def lint(p, *args):
    """command.lint as the spec and the program call it: on the stage's effective params."""
    return command.lint(SERVE.effective(p), *args)


@pytest.fixture(scope="module")
def sglang():
    """The pinned SGLang, imported when a test asks for it (its import costs seconds,
    which collection would pay in every worker). No importorskip: bin/test installs
    it, so CI runs these tests."""
    import sglang
    from sglang.srt.arg_groups import argparse_actions
    from sglang.srt.server_args import ServerArgs

    return SimpleNamespace(version=sglang.__version__, ServerArgs=ServerArgs,
                           deprecated=(argparse_actions.DeprecatedStoreTrueAction,
                                       argparse_actions.DeprecatedStoreConstAction))


@pytest.fixture(scope="module")
def parser(sglang):
    p = argparse.ArgumentParser(prog="sglang.launch_server", exit_on_error=False)
    sglang.ServerArgs.add_cli_args(p)
    return p


def options(parser) -> dict[str, argparse.Action]:
    return {o: a for a in parser._actions for o in a.option_strings}


def test_the_pinned_version_is_installed(sglang):
    assert sglang.version == command.PINNED_SGLANG


SPEC = get_spec("serve")
CASES = [dict(zip(("mode", "tp", "dp", "ep", "mfs", "ctx", "metrics", "extra"), v)) for v in itertools.product(
    ("target", "speculative"), (1, 8), (1, 2), (1, 8), (None, 0.85), (None, 4096), (True, False),
    ([], ["--disable-radix-cache", "--disable-custom-all-reduce", "--num-continuous-decode-steps", "4",
          "--cuda-graph-bs-decode", "1", "2", "4", "--json-model-override-args", '{"a": 1, "b": 2}']))
    if not (v[3] > 1 and v[3] != v[1])]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items() if k != "extra")
                         + ("-extra" if c["extra"] else ""))
def test_every_argv_the_op_builds_passes_sglangs_parser(sglang, parser, case, tmp_path):
    params = {"mode": case["mode"], "tp": case["tp"], "dp": case["dp"], "ep": case["ep"],
              "enable_metrics": case["metrics"], "port": 31000, "num_steps": 5, "topk": 1,
              "num_draft_tokens": 6}
    if case["mfs"] is not None:
        params["mem_fraction_static"] = case["mfs"]
    if case["ctx"] is not None:
        params["context_length"] = case["ctx"]
    if case["extra"]:
        params["extra_args"] = case["extra"]
    if case["mode"] == "speculative":
        params["drafter"] = str(tmp_path / "drafter")
    # The spec's argv is what the supervisor runs; ops.serve turns it into SGLang's.
    ours = SPEC.argv(params, target_path="/models/Kimi-K2.5", python="python")
    assert ours[:3] == ["python", "-m", "ops.serve"]
    server = command.server_argv({k.replace("-", "_"): v for k, v in vars(_serve_args(ours[3:])).items()},
                                 "/models/Kimi-K2.5")
    ns = parser.parse_args(server)
    args = sglang.ServerArgs.from_cli_args(ns)
    assert args.model_path == "/models/Kimi-K2.5"
    assert (args.tp_size, args.dp_size, args.ep_size, args.port, args.host) == \
        (case["tp"], case["dp"], case["ep"], 31000, "127.0.0.1")
    assert args.enable_metrics is case["metrics"]
    assert args.mem_fraction_static == case["mfs"] and args.context_length == case["ctx"]
    if case["mode"] == "speculative":
        assert args.speculative_algorithm == "EAGLE3"
        assert args.speculative_draft_model_path == str(tmp_path / "drafter")
        assert (args.speculative_num_steps, args.speculative_eagle_topk, args.speculative_num_draft_tokens) == (5, 1, 6)
    else:
        assert args.speculative_algorithm is None
    if case["extra"]:
        assert args.disable_radix_cache and args.disable_custom_all_reduce
        assert args.num_continuous_decode_steps == 4
        assert args.cuda_graph_bs_decode == [1, 2, 4]
        assert json.loads(args.json_model_override_args) == {"a": 1, "b": 2}   # its comma survived


def _serve_args(words):
    from ops.serve.__main__ import parse_args
    return parse_args(words)


def test_the_deprecated_table_matches_the_pinned_parser(sglang, parser):
    opts = options(parser)
    for flag, new in command.DEPRECATED_FLAGS.items():
        assert flag in opts, flag
        assert isinstance(opts[flag], sglang.deprecated) \
            or "Deprecated" in (opts[flag].help or ""), flag
        for word in new.split():
            if word.startswith("--"):
                assert word in opts, (flag, word)
    deprecated_here = {o for o, a in opts.items()
                       if isinstance(a, sglang.deprecated)}
    assert deprecated_here <= set(command.DEPRECATED_FLAGS), "a new deprecation the lint does not know"


def test_removed_flags_are_refused_by_the_pinned_parser_and_their_replacements_exist(parser):
    opts = options(parser)
    for flag, new in command.REMOVED_FLAGS.items():
        assert flag not in opts
        with pytest.raises((argparse.ArgumentError, SystemExit)):
            parser.parse_args(["--model-path", "/m", flag])
        assert new.split()[0] in opts


def test_managed_flags_are_real_flags(parser):
    opts = options(parser)
    assert set(command.MANAGED) <= set(opts)


# ---------------------------------------------------------------- lints

def _drafter(tmp_path, ids, trained_capture, arch="LlamaForCausalLMEagle3"):
    root = tmp_path / "export"
    (root / "sglang").mkdir(parents=True)
    (root / "sglang" / "config.json").write_text(json.dumps(
        {"architectures": [arch], "eagle_config": {"eagle_aux_hidden_state_layer_ids": ids}}))
    (root / "export_info.json").write_text(json.dumps({"sglang_layers_to_capture": trained_capture}))
    return root


def _target(tmp_path, arch):
    t = tmp_path / "target"
    t.mkdir(parents=True)
    (t / "config.json").write_text(json.dumps({"architectures": [arch], "num_hidden_layers": 61}))
    return str(t)


def test_tp_times_dp_must_match_the_gpus_list():
    msgs = [str(x) for x in lint({"tp": 4, "dp": 2}, "/m", [0, 1, 2, 3])]
    assert any(m.startswith("error: tp 4 x dp 2 = 8 GPUs, but the stage's gpus list has 4") for m in msgs)
    assert not command.errors(lint({"tp": 4, "dp": 2}, "/m", list(range(8))))
    assert any("no `gpus` list" in str(x) for x in lint({"tp": 8}, "/m", None))


def test_ep_must_equal_tp():
    assert any("ep 4 with tp 8" in str(x) for x in command.errors(lint({"tp": 8, "ep": 4}, "/m", None)))


def test_flags_in_extra_args():
    lints = lint({"extra_args": ["--disable-cuda-graph", "--enable-ep-moe", "--tp-size", "2"]}, "/m", [0])
    text = "\n".join(map(str, lints))
    assert "warning: extra_args --disable-cuda-graph: deprecated in sglang 0.5.23; use --cuda-graph-backend-decode" in text
    assert "error: extra_args --enable-ep-moe: not a flag of sglang 0.5.23 (removed); use --ep-size" in text
    assert "error: extra_args sets --tp-size, which the serve op sets from param 'tp'" in text


def test_drafter_aux_ids_must_round_trip_under_the_targets_rule(tmp_path):
    # Real run: canonical [2, 30, 58] -> capture [3, 31, 59]. On deepseek_v2.py's rule
    # (Kimi K2.5 is DeepseekV3ForCausalLM) ids [3, 31, 59] are taken as they are.
    kimi = _target(tmp_path, "DeepseekV3ForCausalLM")
    good = _drafter(tmp_path / "a", [3, 31, 59], [3, 31, 59])
    p = {"mode": "speculative", "drafter": str(good), "tp": 8, "num_steps": 3, "num_draft_tokens": 4}
    assert not command.errors(lint(p, kimi, list(range(8)), {}))
    # The llama rule's ids ([2, 30, 58], +1) on that target capture [2, 30, 58]: off by one.
    bad = _drafter(tmp_path / "b", [2, 30, 58], [3, 31, 59])
    errs = command.errors(lint(dict(p, drafter=str(bad)), kimi, list(range(8)), {}))
    assert len(errs) == 1 and "make SGLang capture [2, 30, 58] on DeepseekV3ForCausalLM" in errs[0].message
    llama = _target(tmp_path / "l", "LlamaForCausalLM")
    assert not command.errors(lint(dict(p, drafter=str(bad)), llama, list(range(8)), {}))


def test_speculative_without_a_drafter_or_with_a_wrong_one(tmp_path):
    errs = command.errors(lint({"mode": "speculative"}, "/m", [0]))
    assert any("needs params.drafter" in x.message for x in errs)
    d = _drafter(tmp_path, [1, 2, 3], [2, 3, 4], arch="LlamaForCausalLM")
    errs = command.errors(lint({"mode": "speculative", "drafter": str(d)}, "/m", [0]))
    assert any("expected ['LlamaForCausalLMEagle3'] for EAGLE3" in x.message for x in errs)


def test_the_program_refuses_before_exec_with_the_reasons(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    assert serve_main(["--target", "/m", "--tp", "8", "--launcher", "no.such.module"]) == 2
    out = capsys.readouterr()
    assert "serve: lint error: tp 8 x dp 1 = 8 GPUs, but the stage's gpus list has 2 (0,1)" in out.out
    assert "1 lint error(s)" in out.err


def test_the_program_checks_with_sglangs_parser_before_exec(capsys, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    # A flag no SGLang has: refused by SGLang's parser, before any exec.
    assert serve_main(["--target", "/m", "--extra-args", json.dumps(["--no-such-flag"])]) == 2
    assert "SGLang's own parser rejected the argv" in capsys.readouterr().err


def test_the_specs_lint_resolves_paths_in_the_workspace_and_takes_the_target(tmp_path):
    from ops.spec import EstimateContext
    _drafter(tmp_path / "runs", [3, 31, 59], [3, 31, 59])       # tmp/runs/export
    ctx = EstimateContext(root=tmp_path, params={"mode": "speculative", "drafter": "runs/export"},
                          target={"path": "models/target", "architecture": "DeepseekV3ForCausalLM"})
    assert command.errors(SPEC.lint(ctx, [0])) == []
    # The llama rule (no config.json at the model path, no architecture): off by one.
    ctx = EstimateContext(root=tmp_path, params=ctx.params, target={"path": "models/target",
                                                                     "architecture": "LlamaForCausalLM"})
    errs = command.errors(SPEC.lint(ctx, [0]))
    assert len(errs) == 1 and "capture [4, 32, 60] on LlamaForCausalLM" in errs[0].message


def test_an_export_root_as_drafter_reaches_sglang_as_its_sglang_folder(sglang, parser, tmp_path):
    # README's drafter = "runs/export" is export's output root; SGLang's loader reads
    # <speculative-draft-model-path>/config.json, which only the root's sglang/ has.
    root = _drafter(tmp_path / "runs", [3, 31, 59], [3, 31, 59])
    proc = subprocess.run([sys.executable, "-m", "ops.serve", "--target", _target(tmp_path, "DeepseekV3ForCausalLM"),
                           "--mode", "speculative", "--drafter", str(root), "--launcher", "no.such.module"],
                          capture_output=True, text=True, timeout=60, cwd=ROOT,
                          env=dict(os.environ, CUDA_VISIBLE_DEVICES="0", PYTHONPATH=str(ROOT)))
    exec_line = next(line for line in proc.stdout.splitlines() if line.startswith("serve: exec "))
    argv = json.loads(exec_line[len("serve: exec "):])
    args = sglang.ServerArgs.from_cli_args(parser.parse_args(argv[3:]))
    assert args.speculative_draft_model_path == str(root / "sglang")
    assert (Path(args.speculative_draft_model_path) / "config.json").is_file()


def test_every_spelling_of_a_managed_flag_is_caught(parser):
    # SGLang's aliases (--tensor-parallel-size for --tp-size, --ep for --ep-size, ...) set the
    # same field; argparse keeps the last one, so an alias in extra_args would override the param.
    opts = options(parser)
    managed_dests = {opts[f].dest for f in command.MANAGED}
    spellings = {o for o, a in opts.items() if a.dest in managed_dests}
    for flag in sorted(spellings):
        errs = command.errors(lint({"extra_args": [flag, "1"]}, "/m", [0]))
        assert any("which the serve op sets from param" in x.message for x in errs), flag


def test_pipeline_parallel_and_attention_dp_count_their_gpus_as_sglang_does():
    # compute_world_size (server_args.py): dp * tp * pp; the deprecated --enable-dp-attention
    # turns dp into attention DP inside the TP group (parallel_hook.py), adding no GPUs.
    assert not command.errors(lint({"tp": 4, "extra_args": ["--pp-size", "2"]}, "/m", list(range(8))))
    assert not command.errors(lint({"tp": 4, "extra_args": ["--pipeline-parallel-size=2"]}, "/m",
                                           list(range(8))))
    errs = command.errors(lint({"tp": 4, "extra_args": ["--pp-size", "2"]}, "/m", list(range(4))))
    assert any("tp 4 x dp 1 x pp 2 = 8 GPUs" in x.message for x in errs)
    assert not command.errors(lint({"tp": 8, "dp": 8, "extra_args": ["--enable-dp-attention"]}, "/m",
                                           list(range(8))))


def test_ep_with_moe_dp_size_in_extra_args_follows_sglangs_rule():
    # parallel_hook.py: with ep > 1, ep_size * moe_dp_size == tp_size.
    assert not command.errors(lint({"tp": 8, "ep": 4, "extra_args": ["--moe-dp-size", "2"]}, "/m",
                                           list(range(8))))
    errs = command.errors(lint({"tp": 8, "ep": 2, "extra_args": ["--moe-data-parallel-size=2"]}, "/m",
                                       list(range(8))))
    assert len(errs) == 1 and "ep 2 x moe_dp_size 2 = 4, but tp is 8" in errs[0].message


def test_ready_timeout_s_must_be_positive_and_is_not_passed_to_sglang(capsys):
    # The bound is the param's (ops/serve/spec.py): the console refuses it at `run`,
    # the op's argparse on its own command line, in the same words.
    spec = get_spec("serve")
    assert spec.param_type_error("ready_timeout_s", 0) == "expected > 0, got 0"
    assert serve_main(["--target", "/m", "--ready-timeout-s", "0"]) == 2
    assert "argument --ready-timeout-s: expected > 0, got 0.0" in capsys.readouterr().err
    assert spec.param_type_error("ready_timeout_s", 90.0) is None
    assert not command.errors(lint({"ready_timeout_s": 90.0}, "/m", [0]))
    assert "--ready-timeout-s" not in command.server_argv(SERVE.effective({"ready_timeout_s": 90.0}), "/m")
