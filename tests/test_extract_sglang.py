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
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

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


# ---------------------------------------------------------------- (c) the forward path, doubled

torch = pytest.importorskip("torch")

from safetensors.torch import load_file  # noqa: E402
from tests import sglang_forward_double as double  # noqa: E402
from tests.test_op_extract import extract_argv, make_prepared, make_target  # noqa: E402

from ops.common import run_main  # noqa: E402
from ops.extract.__main__ import main as extract_main  # noqa: E402
from ops.formats import DATA_CONFIG, sample_path  # noqa: E402
from ops.verify.__main__ import main as verify_main  # noqa: E402

N = 16


@pytest.fixture(scope="module")
def hf_run(tmp_path_factory):
    """The HF engine's output for the tiny target: what the SGLang engine must match."""
    root = tmp_path_factory.mktemp("sglang_engine")
    target, prepared = make_target(root / "target"), make_prepared(root / "prep", n=N, seed=5)
    assert run_main(extract_main, extract_argv(target, prepared, root / "hf", "--token-budget", "120")) == 0
    return target, prepared, root / "hf"


@pytest.fixture
def doubled(monkeypatch):
    double.LOADS.clear()
    monkeypatch.setattr(sglang_capture, "load", double.load)
    return double.LOADS


def _files(out: Path) -> dict[int, bytes]:
    return {i: sample_path(out, i).read_bytes() for i in range(N)}


def test_sglang_engine_writes_the_hf_engines_files_byte_for_byte(hf_run, doubled, tmp_path, capsys):
    target, prepared, hf_out = hf_run
    out = tmp_path / "sg"
    code = run_main(extract_main, extract_argv(target, prepared, out, "--token-budget", "120", "--engine", "sglang"))
    stdout = capsys.readouterr().out
    assert code == 0, stdout
    assert _files(out) == _files(hf_out)
    config, hf_config = (json.loads((d / DATA_CONFIG).read_text()) for d in (out, hf_out))
    assert config["status"] == "complete"
    assert (config["extraction_method"], config["sglang_version"], config["tp"], config["ep"]) == \
        ("sglang", "0.5.23", 1, 1)
    assert hf_config["extraction_method"] == "hf_transformers_forward_hooks" and "sglang_version" not in hf_config
    for key in ("layer_ids", "sglang_layers_to_capture", "sglang_config_layer_ids", "hidden_size", "aux_hidden_size",
                "dtype", "total_samples", "total_tokens", "final_hidden_state", "world_size"):
        assert config[key] == hf_config[key], key
    # What SGLang was asked for: the draft-config ids, which its llama rule turns into k + 1.
    (load,) = doubled
    argv = load["argv"]
    at = argv.index("--return-aux-hidden-state-layer-ids")
    assert argv[at + 1:at + 4] == [str(i) for i in config["sglang_config_layer_ids"]]
    assert load["runner"].model.model.layers_to_capture == config["sglang_layers_to_capture"] == [2, 4, 5]
    # One forward per planned batch, each freeing its slots (the double's pools hold one batch).
    assert load["pools"].token_to_kv_pool_allocator.clears == len(load["runner"].forwards) > 1
    assert "loading target" in stdout and "in SGLang 0.5.23 (tp 1, ep 1, float32)" in stdout
    assert f"progress: samples {N}/{N}" in stdout and "rank" not in stdout.split("progress:")[-1]
    assert run_main(verify_main, ["--input", str(out), "--deep", "3", "--recompute", "3",
                                  "--target", str(target)]) == 0, capsys.readouterr()
    assert "verify: recomputing 3 samples with" in capsys.readouterr().out


def test_resume_rewrites_a_cut_file_and_reloads_nothing_when_done(hf_run, doubled, tmp_path, capsys):
    target, prepared, hf_out = hf_run
    out = tmp_path / "sg"
    argv = extract_argv(target, prepared, out, "--token-budget", "120", "--engine", "sglang")
    assert run_main(extract_main, argv) == 0
    cut = sample_path(out, 3)
    cut.write_bytes(cut.read_bytes()[:-40])
    capsys.readouterr()
    assert run_main(extract_main, argv) == 0
    stdout = capsys.readouterr().out
    assert "rewriting 1 sample file(s)" in stdout and f"{N - 1} already on disk" in stdout
    assert _files(out) == _files(hf_out)
    assert len(doubled) == 2
    assert run_main(extract_main, argv) == 0
    assert "nothing to extract" in capsys.readouterr().out and len(doubled) == 2   # no third load


def test_an_oom_halves_the_batch_as_with_the_hf_engine(hf_run, monkeypatch, tmp_path, capsys):
    target, prepared, hf_out = hf_run
    double.LOADS.clear()
    monkeypatch.setattr(sglang_capture, "load", lambda *a, **kw: double.load(*a, oom_above_tokens=70, **kw))
    out = tmp_path / "sg"
    assert run_main(extract_main, extract_argv(target, prepared, out, "--token-budget", "120",
                                               "--engine", "sglang")) == 0
    stdout = capsys.readouterr().out
    assert "OOM: halving token budget to" in stdout
    forwards = double.LOADS[0]["runner"].forwards
    assert any(len(f) * max(f) > 70 for f in forwards)          # it did run out
    for idx in range(N):
        a, b = load_file(str(sample_path(out, idx))), load_file(str(sample_path(hf_out, idx)))
        for key in a:   # other batches, other padding: equal up to float noise
            torch.testing.assert_close(a[key], b[key], atol=1e-5, rtol=1e-4)


def test_a_batch_larger_than_the_pools_runs_in_several_extends(hf_run, monkeypatch, tmp_path, capsys):
    target, prepared, hf_out = hf_run
    double.LOADS.clear()
    monkeypatch.setattr(sglang_capture, "load", lambda *a, **kw: double.load(*a, req_slots=4, kv_slots=70, **kw))
    out = tmp_path / "sg"
    assert run_main(extract_main, extract_argv(target, prepared, out, "--token-budget", "120",
                                               "--engine", "sglang")) == 0, capsys.readouterr()
    forwards = double.LOADS[0]["runner"].forwards
    assert max(len(f) for f in forwards) <= 3 and max(sum(f) for f in forwards) <= 70
    for idx in range(N):
        a, b = load_file(str(sample_path(out, idx))), load_file(str(sample_path(hf_out, idx)))
        for key in a:
            torch.testing.assert_close(a[key], b[key], atol=1e-5, rtol=1e-4)


def test_a_sample_larger_than_the_kv_pool_is_the_one_sample_oom(hf_run, monkeypatch, tmp_path, capsys):
    target, prepared, _ = hf_run
    monkeypatch.setattr(sglang_capture, "load", lambda *a, **kw: double.load(*a, kv_slots=20, **kw))
    code = run_main(extract_main, extract_argv(target, prepared, tmp_path / "sg", "--token-budget", "120",
                                               "--engine", "sglang"), prog="extract")
    err = capsys.readouterr().err
    assert code == 1 and "alone does not fit in device memory" in err and "exceeds SGLang's KV pool (20 tokens" in err


@pytest.mark.parametrize("field,value,message", [
    ("hidden_states", None, "SGLang returned no hidden states"),
    ("last_hidden_states", None, "SGLang returned no hidden states"),
])
def test_a_forward_without_the_states_is_an_error_naming_the_cause(field, value, message):
    out = SimpleNamespace(hidden_states=torch.zeros(5, 6), last_hidden_states=torch.zeros(5, 2))
    setattr(out, field, value)
    with pytest.raises(RuntimeError, match=message):
        sglang_capture.split_states(out, [2, 3], n_aux=3)


def test_split_states_refuses_rows_that_are_not_every_token():
    out = SimpleNamespace(hidden_states=torch.zeros(2, 6), last_hidden_states=torch.zeros(2, 2))
    with pytest.raises(RuntimeError, match="2 aux / 2 final rows for 5 tokens"):
        sglang_capture.split_states(out, [2, 3], n_aux=3)        # LAST mode: one row per sample
    out = SimpleNamespace(hidden_states=torch.zeros(5, 4), last_hidden_states=torch.zeros(5, 2))
    with pytest.raises(RuntimeError, match="captured 2 aux layers, 3 asked"):
        sglang_capture.split_states(out, [2, 3], n_aux=3)


def test_a_capture_that_is_not_k_plus_one_stops_the_load(hf_run):
    model = double.TargetModel(SimpleNamespace(config=None))
    model.set_eagle3_layers_to_capture([1, 3, 4])
    sglang_capture.check_capture(model, [2, 4, 5])
    with pytest.raises(RuntimeError, match=r"SGLang captures layers \[2, 4, 5\], expected \[1, 3, 4\]"):
        sglang_capture.check_capture(model, [1, 3, 4])


@pytest.mark.parametrize("extra,env,message", [
    (["--tp", "2"], {}, "engine sglang: tp 2 but 1 process(es) (WORLD_SIZE): launch one process per TP rank"),
    (["--tp", "4", "--ep", "3"], {"WORLD_SIZE": "4"}, "engine sglang: ep 3 must divide tp 4"),
    (["--memory-fraction", "0.5"], {}, "engine sglang: memory_fraction is the HF engine's cap"),
    (["--compile"], {}, "engine sglang: compile is the HF engine's"),
    (["--device", "cpu"], {}, "engine sglang: device 'cpu': SGLang places rank r on GPU LOCAL_RANK"),
])
def test_params_the_engine_cannot_honour_are_refused_in_one_line(hf_run, doubled, tmp_path, capsys, monkeypatch,
                                                                 extra, env, message):
    target, prepared, _ = hf_run
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    code = run_main(extract_main, extract_argv(target, prepared, tmp_path / "o", "--engine", "sglang", *extra),
                    prog="extract")
    err = capsys.readouterr().err
    assert code == 2 and err.startswith(f"extract: error: {message}") and err.count("\n") == 1, err
    assert doubled == [] and not (tmp_path / "o").exists()


@pytest.mark.parametrize("value", ["1.5", "0", "1"])
def test_a_mem_fraction_static_outside_0_1_is_refused_by_its_param(hf_run, doubled, tmp_path, capsys, value):
    """SGLang's parser takes any float; a wrong one would surface only after the
    load. Its Param's bounds (ops/extract/spec.py) refuse it in the op's argparse,
    in the words the console's `run` uses too."""
    target, prepared, _ = hf_run
    code = run_main(extract_main, extract_argv(target, prepared, tmp_path / "o", "--engine", "sglang",
                                               "--mem-fraction-static", value), prog="extract")
    err = capsys.readouterr().err
    assert code == 2 and f"error: argument --mem-fraction-static: expected > 0 and < 1, got {value}" in err, err
    assert doubled == [] and not (tmp_path / "o").exists()


def test_torchrun_two_tp_ranks_one_writer(hf_run, tmp_path):
    """Two CPU ranks as one TP group (the double's gloo group for SGLang's): rank 0
    hands each batch to rank 1, both run the same extends (cut to the smaller
    rank's pools), rank 0 alone writes; a re-run with nothing left lets rank 1
    go without a load."""
    target, prepared, hf_out = hf_run
    out = tmp_path / "sg"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", PYTHONPATH=str(REPO))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
           "--master_port", str(29500 + (os.getpid() + 7) % 1000), "tests/sglang_torchrun_double.py",
           *extract_argv(target, prepared, out, "--token-budget", "120", "--engine", "sglang", "--tp", "2")]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for idx in range(N):    # cut to rank 1's smaller KV pool: other padding than the HF run's
        a, b = load_file(str(sample_path(out, idx))), load_file(str(sample_path(hf_out, idx)))
        for key in a:
            torch.testing.assert_close(a[key], b[key], atol=1e-5, rtol=1e-4)
    config = json.loads((out / DATA_CONFIG).read_text())
    assert (config["status"], config["tp"], config["world_size"]) == ("complete", 2, 1)
    assert proc.stdout.count("loading target") == 1 and proc.stdout.count(f"progress: samples {N}/{N}") >= 1
    said = dict(re.findall(r"double: rank (\d) (loads \d+ forwards \d+ samples \d+ group \w+)", proc.stderr))
    assert said["0"] == said["1"] and said["0"].startswith("loads 1 ") and said["0"].endswith(f"samples {N} group left"), said
    again = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "nothing to extract" in again.stdout and "loading target" not in again.stdout
    said = dict(re.findall(r"double: rank (\d) (loads \d+)", again.stderr))
    assert said == {"0": "loads 0", "1": "loads 0"}, again.stderr[-2000:]


def test_an_sglang_whose_runtime_does_not_import_is_one_line(hf_run, tmp_path, capsys):
    # bin/test installs sglang with --no-deps: its version is right, its model runner does
    # not import (torchvision and the GPU kernel packages are missing). The real load, not
    # the double: one line naming the missing module, exit 2, not a traceback. In this
    # process, as `python -m ops.extract` runs main(): a process would import torch again.
    try:
        import sglang.srt.configs.model_config  # noqa: F401
    except ImportError as exc:
        missing = str(exc)
    else:
        pytest.skip("SGLang's runtime imports here")
    target, prepared, _ = hf_run
    code = run_main(extract_main, ["--engine", "sglang", "--target", str(target), "--input", str(prepared),
                                   "--output", str(tmp_path / "o"), "--dtype", "bfloat16"], prog="extract")
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err and err.count("\n") == 1, err
    assert err.startswith("extract: error: engine sglang: sglang 0.5.23 is installed, but its runtime "
                          f"does not import here ({missing})"), err


def test_float32_is_refused_in_one_line_before_the_load(hf_run, tmp_path, capsys):
    # On the H200 a float32 target loaded (a minute) and died at its first forward:
    # sgl_kernel's rmsnorm "failed to dispatch data type Float".
    target, prepared, _ = hf_run
    code = run_main(extract_main, ["--engine", "sglang", "--target", str(target), "--input", str(prepared),
                                   "--output", str(tmp_path / "o")], prog="extract")
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err and err.count("\n") == 1, err
    assert err.startswith("extract: error: engine sglang: dtype float32: SGLang 0.5.23's fused kernels"), err
    assert 'set the stage\'s dtype = "bfloat16"' in err


def test_the_context_length_is_capped_at_the_models_positions(tmp_path):
    # On the H200: "User-specified context_length (4096) is greater than the derived
    # context_length (512)" from SGLang's ModelConfig, for the demo target.
    from ops.extract.sglang_run import context_length

    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 512}))
    assert context_length(4096, tmp_path) == 512
    assert context_length(256, tmp_path) == 256
    (tmp_path / "config.json").write_text(json.dumps({"text_config": {"max_position_embeddings": 2048}}))
    assert context_length(4096, tmp_path) == 2048
    (tmp_path / "config.json").write_text("{}")
    assert context_length(4096, tmp_path) == 4096


@pytest.mark.parametrize("fmt", ["fp8", "int4"])
def test_both_engines_write_each_format_the_same(hf_run, doubled, tmp_path, capsys, fmt):
    """The format is encoded in the loop both engines share: SGLang's fp8 / int4
    files are the HF engine's byte for byte, and their header says the format."""
    from safetensors import safe_open

    target, prepared, _hf_out = hf_run
    outs = {}
    for engine in ("hf", "sglang"):
        outs[engine] = tmp_path / engine
        argv = extract_argv(target, prepared, outs[engine], "--token-budget", "120", "--format", fmt,
                            "--engine", engine)
        assert run_main(extract_main, argv) == 0, capsys.readouterr().out
    assert _files(outs["sglang"]) == _files(outs["hf"])
    assert json.loads((outs["sglang"] / DATA_CONFIG).read_text())["format"] == fmt
    with safe_open(str(sample_path(outs["sglang"], 0)), framework="pt") as fh:
        assert fh.metadata() == {"format": fmt}
