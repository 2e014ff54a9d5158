"""extract with engine = "sglang", tested at the boundary SGLang allows here.

SGLang 0.5.23 is installed (bin/test, --no-deps); its GPU-side modules cannot
be imported on this machine, only sglang.srt.server_args. So:
- the ServerArgs the engine builds go through SGLang's real parser and record;
- every internal the engine calls is found in the installed source, and a
  copy of that source with one name or parameter removed is caught;
- the adapter's batch assembly and the per-sample split run against a test
  double of SGLang's forward path (tests/sglang_forward_double.py, whose
  docstring cites the 0.5.23 lines it mirrors), through run.py's own loop, to
  sample files that verify accepts and that are byte-identical to the HF
  engine's for the same hidden states;
- another SGLang, or none, is refused before anything loads.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ops.extract import sglang_capture, sglang_engine

REPO = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------- (b) ServerArgs

def test_the_engines_server_args_parse_with_sglangs_own_parser():
    argv = sglang_capture.server_argv(target="/models/t", tp=8, ep=8, dtype="bfloat16", context_length=4096,
                                      config_layer_ids=[3, 31, 59], mem_fraction_static=0.8)
    args = sglang_capture.server_args(argv)
    assert type(args).__module__ == "sglang.srt.server_args"
    assert (args.model_path, args.tp_size, args.ep_size, args.dtype) == ("/models/t", 8, 8, "bfloat16")
    assert args.disable_radix_cache is True
    assert args.chunked_prefill_size == -1                      # one extend per sample, all its tokens
    assert (args.cuda_graph_backend_decode, args.cuda_graph_backend_prefill) == ("disabled", "disabled")
    assert args.enable_return_aux_hidden_states is True and args.speculative_algorithm == "EAGLE3"
    assert args.return_aux_hidden_state_layer_ids == [3, 31, 59]
    assert args.skip_tokenizer_init is True and args.disable_overlap_schedule is True
    assert args.mem_fraction_static == 0.8 and args.context_length == 4096
    # Under these a rank holds only its share of the tokens' states.
    assert args.enable_layernorm_sp is False and args.attn_dp_size == 1 and args.dp_size == 1


def test_without_mem_fraction_static_sglang_chooses():
    argv = sglang_capture.server_argv(target="/m", tp=1, ep=1, dtype="float16", context_length=512,
                                      config_layer_ids=[1, 2])
    assert "--mem-fraction-static" not in argv
    assert sglang_capture.server_args(argv).mem_fraction_static is None


def test_the_capture_only_mode_validation_accepts_the_argv():
    """SGLang's own check of --enable-return-aux-hidden-states (run by resolve_once,
    which also reads the checkpoint, so it is called alone here)."""
    from sglang.srt.arg_groups.validation_hook import handle_aux_hidden_state_capture

    argv = sglang_capture.server_argv(target="/m", tp=2, ep=1, dtype="bfloat16", context_length=512,
                                      config_layer_ids=[2, 4, 5])
    handle_aux_hidden_state_capture(sglang_capture.server_args(argv))
    bad = [a for a in argv if a not in ("--speculative-algorithm", "EAGLE3")]
    with pytest.raises(ValueError, match="needs --speculative-algorithm"):
        handle_aux_hidden_state_capture(sglang_capture.server_args(bad))


# ---------------------------------------------------------------- (a) static check

def _copy_sources(dst: Path) -> Path:
    """The installed sglang's files that INTERNALS names, under dst/sglang."""
    import importlib.util

    installed = Path(list(importlib.util.find_spec("sglang").submodule_search_locations)[0])
    (dst / "sglang").mkdir(parents=True)
    shutil.copy(installed / "__init__.py", dst / "sglang" / "__init__.py")
    for module in {it.module for it in sglang_engine.INTERNALS}:
        src = sglang_engine._source_path(module)
        rel = src.relative_to(installed.parent)
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(src, dst / rel)
    return dst


def test_every_internal_the_engine_calls_is_in_the_installed_source():
    assert sglang_engine.check_static() == []


def test_the_engine_calls_nothing_from_sglang_that_internals_does_not_list():
    """Every `from sglang... import X` in the adapter is an INTERNALS module."""
    tree = ast.parse((REPO / "ops/extract/sglang_capture.py").read_text())
    listed = {it.module for it in sglang_engine.INTERNALS} | {"sglang.srt.server_args"}
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module
                and n.module.startswith("sglang")}
    assert imported - listed == set()
    names = {it.qualname.split(".")[0] for it in sglang_engine.INTERNALS}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("sglang"):
            for alias in node.names:
                assert alias.name in names, alias.name


@pytest.mark.parametrize("module_rel,old,new,expect", [
    ("sglang/srt/model_executor/forward_batch_info.py", "return_hidden_states_before_norm: bool,\n",
     "", "ForwardBatch.init_new: no parameter(s) ['return_hidden_states_before_norm']"),
    ("sglang/srt/layers/logits_processor.py", "    last_hidden_states: Optional[torch.Tensor] = None\n",
     "", "LogitsProcessorOutput.last_hidden_states: not found"),
    ("sglang/srt/managers/tp_worker.py", "    def init_attention_backends(self):",
     "    def init_backends(self):", "TpModelWorker.init_attention_backends: not found"),
])
def test_a_removed_name_or_parameter_in_a_copy_of_the_source_is_caught(tmp_path, monkeypatch, module_rel, old,
                                                                       new, expect):
    root = _copy_sources(tmp_path)
    monkeypatch.syspath_prepend(str(root))
    import importlib

    importlib.invalidate_caches()
    monkeypatch.delitem(sys.modules, "sglang", raising=False)
    assert sglang_engine._source_path("sglang.srt.server_args").is_relative_to(root)
    assert sglang_engine.check_static() == []          # the copy as it is: whole
    path = root / module_rel
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))
    problems = sglang_engine.check_static()
    assert len(problems) == 1 and expect in problems[0], problems


# ---------------------------------------------------------------- (d) the version

def _run(argv, env_path: str, *python_flags: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=env_path)
    return subprocess.run([sys.executable, *python_flags, "-m", "ops.extract", *argv], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)


ARGV = ["--engine", "sglang", "--target", "/nonexistent/target", "--input", "/nonexistent/in",
        "--output", "/nonexistent/out"]


def test_another_sglang_version_is_refused_in_one_line(tmp_path):
    dist = tmp_path / "sglang-0.5.22.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.22\n")
    p = _run(ARGV, f"{tmp_path}{os.pathsep}{REPO}")
    assert p.returncode == 2, p.stderr
    assert p.stdout == "" and p.stderr.count("\n") == 1, p.stderr
    assert p.stderr.startswith("extract: error: engine sglang: sglang 0.5.22 is installed, but this engine "
                               "drives SGLang internals checked against 0.5.23 only")
    assert "pip install sglang==0.5.23" in p.stderr


def test_no_sglang_is_refused_in_one_line():
    # -S: no site-packages, so no sglang (and no torch: refused before either is needed).
    p = _run(ARGV, str(REPO), "-S")
    assert (p.returncode, p.stdout) == (2, "")
    assert p.stderr == "extract: error: engine sglang: sglang is not installed; pip install sglang==0.5.23\n"


def test_the_hf_engine_does_not_look_at_sglangs_version(tmp_path):
    dist = tmp_path / "sglang-0.5.22.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.22\n")
    p = _run(ARGV[2:], f"{tmp_path}{os.pathsep}{REPO}")
    assert "sglang" not in p.stderr and p.returncode == 2   # the missing target, not the engine
    assert "config.json" in p.stderr
