"""verify --recompute on a real model: SmolLM2-135M-Instruct (30 layers, hidden 576), bf16, on CPU.

A few real conversations are extracted with the HF engine; the correct bf16
output of two numerically different engines must pass, and each real fault
must be caught by its check, with the figure and the bound in the report.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from safetensors.numpy import save_file as save_numpy  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

from ops.common import run_main  # noqa: E402
from ops.extract.__main__ import main as extract_main  # noqa: E402
from ops.formats import DATA_CONFIG, sample_path  # noqa: E402
from ops.verify.__main__ import main as verify_main  # noqa: E402

HIDDEN = 576
CONVERSATIONS = [
    ("What is the capital of France?", "The capital of France is Paris."),
    ("Explain why the sky is blue in two sentences.",
     "Sunlight scatters off air molecules, and blue light scatters more because its wavelength is shorter. "
     "So we see blue everywhere we look."),
    ("Give me a short recipe for scrambled eggs.",
     "Whisk two eggs with a pinch of salt, melt butter in a pan over low heat, and stir the eggs gently "
     "until they are just set."),
    ("How many legs does a spider have?", "A spider has eight legs."),
]
N = len(CONVERSATIONS)


def _prepared(root: Path, model_dir: Path) -> Path:
    """prepare's output contract for the conversations, tokenized with the model's chat template."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    ids, mask = [], []
    for question, answer in CONVERSATIONS:
        prompt = tok.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True)
        full = tok.apply_chat_template([{"role": "user", "content": question},
                                        {"role": "assistant", "content": answer}])
        prompt = list(prompt["input_ids"] if hasattr(prompt, "keys") else prompt)
        full = list(full["input_ids"] if hasattr(full, "keys") else full)
        ids.append(full)
        mask.append([0] * len(prompt) + [1] * (len(full) - len(prompt)))
    offsets = np.concatenate([[0], np.cumsum([len(x) for x in ids])]).astype(np.int64)
    root.mkdir(parents=True)
    save_numpy({"input_ids": np.concatenate(ids).astype(np.int32),
                "loss_mask": np.concatenate(mask).astype(np.uint8), "offsets": offsets},
               str(root / "samples.safetensors"))
    (root / "summary.json").write_text(json.dumps({"status": "complete", "samples": N,
                                                   "total_tokens": int(offsets[-1]), "max_seq_len": 512}))
    return root


def _extract(model_dir: Path, prepared: Path, out: Path, dtype: str, *extra: str) -> Path:
    # A budget of 160 padded tokens puts two samples in a batch: padding is part of the numerics.
    argv = ["--target", str(model_dir), "--input", str(prepared), "--output", str(out), "--device", "cpu",
            "--dtype", dtype, "--token-budget", "160", "--progress-interval", "5", *extra]
    assert run_main(extract_main, argv) == 0
    return out


@pytest.fixture(scope="module")
def extracted(smollm2_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("verify_real")
    prepared = _prepared(root / "prep", smollm2_dir)
    bf16 = _extract(smollm2_dir, prepared, root / "bf16", "bfloat16")
    f32 = _extract(smollm2_dir, prepared, root / "f32", "float32")
    return smollm2_dir, bf16, f32, prepared


@pytest.fixture
def out(extracted, tmp_path) -> Path:
    copy = tmp_path / "out"
    shutil.copytree(extracted[1], copy)
    return copy


def verify(model_dir: Path, out: Path, tmp_path: Path, capsys) -> tuple[int, dict, str]:
    report = tmp_path / "report.json"
    code = run_main(verify_main, ["--input", str(out), "--deep", str(N), "--recompute", str(N),
                                  "--target", str(model_dir), "--report", str(report)])
    text = capsys.readouterr().out
    return code, json.loads(report.read_text()), text


def records(report: dict) -> dict[int, dict]:
    return {r["sample"]: r for r in report["deep"]["recomputed"]}


def reason(report: dict, idx: int) -> str:
    [bad] = [b for b in report["bad_files"] if b["sample"] == idx]
    return bad["reason"]


def rewrite(path: Path, **tensors) -> None:
    data = load_file(str(path))
    data.update(tensors)
    save_file(data, str(path))


def test_bf16_output_of_two_engines_passes(extracted, tmp_path, capsys):
    """The HF engine's own bf16 output, and a numerically different engine's:
    the float32 forward rounded to bf16 once at the end. Against the bf16
    recompute it differs by 0.5-2.8 % per layer, about what SGLang's bf16
    kernels differ from HF's on this model (RMS 1.1 % aux / 3.0 % final, cosine
    >= 0.9995): another accumulation order and rounding at every layer."""
    model_dir, bf16, f32, _prepared = extracted
    code, report, text = verify(model_dir, bf16, tmp_path, capsys)
    assert code == 0, text

    other = tmp_path / "other"
    shutil.copytree(f32, other)
    for i in range(N):
        path = sample_path(other, i)
        data = load_file(str(path))
        save_file({k: (v.bfloat16() if v.is_floating_point() else v) for k, v in data.items()}, str(path))
    config = json.loads((other / DATA_CONFIG).read_text())
    config["dtype"] = "bfloat16"
    (other / DATA_CONFIG).write_text(json.dumps(config))
    code, report, text = verify(model_dir, other, tmp_path, capsys)
    assert code == 0, text
    finals = [r["final"]["rms_rel"] for r in report["deep"]["recomputed"]]
    # Really different numerics: the final state is 2-4 % off (above the old fixed 2 % bound).
    assert min(finals) > 0.015, finals
    for r in report["deep"]["recomputed"]:
        for block in r["blocks"] + [r["final"]]:
            assert block["failed"] == [] and block["rms_rel"] <= block["bound"]["rms"]
            # Far nearer its own layer than a neighbour: the bound is not what lets a fault pass.
            assert block["rms_rel"] < 0.2 * min(block["neighbours"].values())


def test_states_of_another_sample_are_caught(extracted, out, tmp_path, capsys):
    model_dir = extracted[0]
    victim, source = 3, 1          # sample 1 is longer: its first rows fit sample 3's shape
    src = load_file(str(sample_path(out, source)))
    t = load_file(str(sample_path(out, victim)))["input_ids"].shape[0]
    rewrite(sample_path(out, victim), aux_hidden_states=src["aux_hidden_states"][:t].clone(),
            final_hidden_states=src["final_hidden_states"][:t].clone())
    code, report, _ = verify(model_dir, out, tmp_path, capsys)
    assert code == 1
    assert [b["sample"] for b in report["bad_files"]] == [victim]
    rec = records(report)[victim]
    for block in rec["blocks"] + [rec["final"]]:
        assert "rms" in block["failed"] and block["rms_rel"] > 0.3 > block["bound"]["rms"]
    why = reason(report, victim)
    assert "aux block 1 (layer_ids[1]=14): rows' RMS relative error" in why and "> numerics bound" in why


@pytest.mark.parametrize("shift", [-1, 1])
def test_a_layer_off_by_one_is_caught(extracted, out, tmp_path, capsys, shift):
    """States of layers k recorded as k - shift: the block holds layer k-1's or k+1's state."""
    model_dir = extracted[0]
    config = json.loads((out / DATA_CONFIG).read_text())
    real = config["layer_ids"]
    config["layer_ids"] = [k - shift for k in real]
    (out / DATA_CONFIG).write_text(json.dumps(config))
    code, report, _ = verify(model_dir, out, tmp_path, capsys)
    assert code == 1 and len(report["bad_files"]) == N
    for rec in report["deep"]["recomputed"]:
        for block, k in zip(rec["blocks"], real):
            assert "neighbour" in block["failed"] and block["nearest_layer"] == k
            assert block["neighbours"][f"layer {k}"] < 0.2 * block["rms_rel"]
    why = reason(report, 0)
    claimed = real[1] - shift
    assert (f"aux block 1 (layer_ids[1]={claimed}): not nearer layer {claimed}" in why
            and f"than 0.5 x its distance from layer {real[1]}" in why)
    assert f"it matches layer {real[1]} best (hidden_states[{real[1] + 1}])" in why


def test_a_zeroed_row_is_caught(extracted, out, tmp_path, capsys):
    model_dir = extracted[0]
    path = sample_path(out, 2)
    aux = load_file(str(path))["aux_hidden_states"].clone()
    aux[7, HIDDEN:2 * HIDDEN] = 0          # one token's state of the middle layer
    rewrite(path, aux_hidden_states=aux)
    code, report, _ = verify(model_dir, out, tmp_path, capsys)
    assert code == 1 and [b["sample"] for b in report["bad_files"]] == [2]
    block = records(report)[2]["blocks"][1]
    assert "row" in block["failed"] and block["worst_row"] == 7 and block["max_row_rel"] == 1.0
    assert "aux block 1 (layer_ids[1]=14): row 7's relative error 1 > row bound" in reason(report, 2)


def test_a_nan_row_is_caught(extracted, out, tmp_path, capsys):
    model_dir = extracted[0]
    path = sample_path(out, 0)
    final = load_file(str(path))["final_hidden_states"].clone()
    final[5] = float("nan")
    rewrite(path, final_hidden_states=final)
    code, report, _ = verify(model_dir, out, tmp_path, capsys)
    assert code == 1
    assert reason(report, 0) == f"final_hidden_states: {HIDDEN} NaN/Inf values"


def test_a_truncated_file_is_caught(extracted, out, tmp_path, capsys):
    model_dir = extracted[0]
    path = sample_path(out, 1)
    size = path.stat().st_size
    with open(path, "r+b") as fh:
        fh.truncate(size - 1000)
    code, report, _ = verify(model_dir, out, tmp_path, capsys)
    assert code == 1
    assert reason(report, 1) == f"truncated ({size - 1000} of {size} bytes)"


def test_float16_overflow_is_caught(extracted, tmp_path, capsys):
    """A float16 output (the float32 forward's states rounded to float16) in which
    one sample's largest activations pass float16's 65,504: the cast gives inf
    there (here the massive first-token entries, x4)."""
    model_dir = extracted[0]
    out = tmp_path / "out"
    shutil.copytree(extracted[2], out)
    for i in range(N):
        path = sample_path(out, i)
        data = load_file(str(path))
        aux = data["aux_hidden_states"].float()
        if i == 2:
            aux[aux.abs() > 10_000] *= 4
        save_file({**data, "aux_hidden_states": aux.half(),
                   "final_hidden_states": data["final_hidden_states"].half()}, str(path))
    config = json.loads((out / DATA_CONFIG).read_text())
    config["dtype"] = "float16"
    (out / DATA_CONFIG).write_text(json.dumps(config))
    code, report, text = verify(model_dir, out, tmp_path, capsys)
    assert code == 1
    assert [b["sample"] for b in report["bad_files"]] == [2], text
    assert reason(report, 2).startswith("aux_hidden_states: ") and reason(report, 2).endswith(" NaN/Inf values")


def test_the_wrong_dtype_is_caught(extracted, out, tmp_path, capsys):
    model_dir = extracted[0]
    # Declared: float16 tensors in a bfloat16 output.
    path = sample_path(out, 0)
    data = load_file(str(path))
    rewrite(path, final_hidden_states=data["final_hidden_states"].half())
    # Not declared: float16 bits written into a bfloat16 tensor (a view instead of a cast).
    path = sample_path(out, 3)
    data = load_file(str(path))
    rewrite(path, aux_hidden_states=data["aux_hidden_states"].clamp(-6e4, 6e4).half().view(torch.bfloat16))
    code, report, _ = verify(model_dir, out, tmp_path, capsys)
    assert code == 1
    assert reason(report, 0) == "final_hidden_states dtype F16, expected BF16 (data_config dtype)"
    rec = records(report).get(3)
    why = reason(report, 3)
    if rec is None:       # garbage bits that decode to NaN/Inf: the load check's
        assert why.endswith("NaN/Inf values")
    else:
        assert all({"rms", "row"} <= set(b["failed"]) for b in rec["blocks"]), rec["blocks"]
        assert "aux block 0 (layer_ids[0]=1): rows' RMS relative error" in why


def test_an_fp8_output_passes_within_its_format_error_and_a_zeroed_row_is_still_caught(extracted, tmp_path,
                                                                                       capsys):
    """The stored format's own error is an input of the bound (ops/hidden_formats.py: fp8 0.04)."""
    model_dir, _bf16, _f32, prepared = extracted
    out = _extract(model_dir, prepared, tmp_path / "fp8", "bfloat16", "--format", "fp8")
    code, report, text = verify(model_dir, out, tmp_path, capsys)
    assert code == 0, text
    blocks = [b for r in report["deep"]["recomputed"] for b in r["blocks"] + [r["final"]]]
    assert all(b["bound"]["rms"] > 0.04 and "stored 0.0439" in b["bound"]["basis"] for b in blocks)
    assert max(b["rms_rel"] for b in blocks) > 0.005          # fp8 adds its rounding to bf16's
    from ops.verify.deep import load_sample
    cfg = json.loads((out / DATA_CONFIG).read_text())
    path = sample_path(out, 2)
    data = load_file(str(path))
    key = next(k for k in data if k.startswith("aux_hidden_states") and not k.endswith("_scale"))
    data[key][7] = 0                        # one token row of every aux layer, as stored
    save_file(data, str(path), metadata={"format": "fp8"})
    assert float(load_sample(str(path), cfg)["aux_hidden_states"][7].abs().max()) == 0.0
    code, report, _ = verify(model_dir, out, tmp_path, capsys)
    assert code == 1 and [b["sample"] for b in report["bad_files"]] == [2]
    assert "row" in records(report)[2]["blocks"][1]["failed"]
