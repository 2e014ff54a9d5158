"""The speculative server's argv carries the settings that shorten a verify cycle in sglang 0.5.23
(ops/serve/command.py, CYCLE_ARGS and its comment, which cites the source), checked by that
version's own parser (ServerArgs.add_cli_args + from_cli_args, as tests/test_op_serve.py does);
extra_args that lengthen the cycle are named by a lint, and the operator's own choice stands."""

from __future__ import annotations

import argparse
import json

import pytest

from ops.serve import command
from ops.serve.spec import SPEC as SERVE
from tests.test_op_serve import _drafter, _serve_args, lint


@pytest.fixture(scope="module")
def parse():
    from sglang.srt.server_args import ServerArgs

    p = argparse.ArgumentParser(prog="sglang.launch_server", exit_on_error=False)
    ServerArgs.add_cli_args(p)
    return lambda argv: ServerArgs.from_cli_args(p.parse_args(argv))


def server_argv(tmp_path, **params) -> list[str]:
    """The argv `python -m ops.serve` builds from the stage's argv (SPEC.argv), as the supervisor runs it."""
    params = {"port": 31000, "num_steps": 3, "topk": 1, "num_draft_tokens": 4, **params}
    if params.get("mode") == "speculative":
        params.setdefault("drafter", str(tmp_path / "drafter"))
    ours = SERVE.argv(params, target_path="/models/target", python="python")
    return command.server_argv({k.replace("-", "_"): v for k, v in vars(_serve_args(ours[3:])).items()},
                               "/models/target")


def test_the_speculative_server_keeps_its_cuda_graphs_and_overlap_by_sglangs_parser(parse, tmp_path):
    argv = server_argv(tmp_path, mode="speculative")
    assert argv[argv.index("--cuda-graph-backend-decode") + 1] == "full"
    args = parse(argv)
    assert args.cuda_graph_backend_decode == "full"         # draft, draft-extend and verify graphs
    assert args.disable_overlap_schedule is False           # spec v2's overlap scheduler
    assert args.disable_decode_cuda_graph is False and args.disable_cuda_graph is False
    assert args.attention_backend is None                   # SGLang's per-GPU choice (FA3 on Hopper, topk 1)
    assert args.speculative_token_map is None               # EAGLE3: the drafter's own draft vocabulary
    assert (args.speculative_num_steps, args.speculative_eagle_topk, args.speculative_num_draft_tokens) == (3, 1, 4)
    # The baseline (mode target) is served as SGLang defaults it.
    assert "--cuda-graph-backend-decode" not in server_argv(tmp_path, mode="target")


@pytest.mark.parametrize("extra", [["--disable-decode-cuda-graph"], ["--disable-cuda-graph"],
                                   ["--cuda-graph-backend-decode", "disabled"], ["--cuda-graph-backend-decode=breakable"],
                                   ["--cuda-graph-config", '{"decode": {"backend": "breakable"}}']])
def test_an_operators_own_decode_graph_flag_stands(parse, tmp_path, extra):
    # SGLang's precedence (arg_groups/cuda_graph_hook.py parse_cuda_graph_config): a per-phase backend
    # flag wins over --disable-decode-cuda-graph and --disable-cuda-graph; the op adds none beside them.
    argv = server_argv(tmp_path, mode="speculative", extra_args=json.dumps(extra))
    assert argv.count("--cuda-graph-backend-decode") == extra.count("--cuda-graph-backend-decode")
    parse(argv)


def test_extra_args_that_lengthen_the_cycle_are_named(tmp_path):
    d = _drafter(tmp_path, [1, 2, 3], [2, 3, 4])
    p = {"mode": "speculative", "drafter": str(d),
         "extra_args": ["--disable-overlap-schedule", "--disable-decode-cuda-graph",
                        "--cuda-graph-backend-decode=disabled", "--speculative-token-map", "/m/map.pt"]}
    text = "\n".join(str(x) for x in lint(p, "/m", [0]))
    assert ("warning: extra_args --disable-overlap-schedule: every verify cycle then waits for the CPU scheduler "
            "(SGLang runs spec v2 without overlap)") in text
    assert ("warning: extra_args --disable-decode-cuda-graph: the drafter's draft and draft-extend steps and the "
            "target's verify run without CUDA graphs") in text
    assert "warning: extra_args --cuda-graph-backend-decode disabled: the drafter's draft" in text
    assert "warning: extra_args --speculative-token-map: SGLang ignores it for EAGLE3" in text
    # A target server is not told about speculative cycles.
    assert "verify cycle" not in "\n".join(str(x) for x in lint(dict(p, mode="target"), "/m", [0]))


def test_a_drafter_head_over_the_whole_vocabulary_is_named(tmp_path):
    d = _drafter(tmp_path, [1, 2, 3], [2, 3, 4])
    cfg = d / "sglang" / "config.json"
    base = json.loads(cfg.read_text())
    cfg.write_text(json.dumps(dict(base, vocab_size=151936, draft_vocab_size=151936)))
    text = "\n".join(str(x) for x in lint({"mode": "speculative", "drafter": str(d)}, "/m", [0]))
    assert ("draft_vocab_size 151936: the drafter's LM head spans the whole vocabulary (151936), each draft step "
            "pays for it") in text
    cfg.write_text(json.dumps(dict(base, vocab_size=151936, draft_vocab_size=32000)))
    assert "draft_vocab_size" not in "\n".join(str(x) for x in lint({"mode": "speculative", "drafter": str(d)},
                                                                    "/m", [0]))
