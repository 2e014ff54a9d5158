"""ops.export: both formats carry the names, shapes and config keys the
engines' loaders take (ops/drafter/formats.py cites them), --check reloads and
matches the training model, and a damaged export is caught."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")


torch.set_num_threads(1)


def export(trained, out, *extra) -> int:
    from ops.export.__main__ import main

    return main(["--checkpoint", str(trained), "--output", str(out), *extra])


def test_sglang_and_speculators_layouts(assets, trained, tmp_path, capsys):
    from safetensors.torch import load_file

    from ops.drafter.vocab import load_vocab

    out = tmp_path / "export"
    assert export(trained, out, "--check", "--dtype", "bfloat16") == 0
    printed = capsys.readouterr().out
    assert printed.count("-> ok") == 2

    sg = json.loads((out / "sglang" / "config.json").read_text())
    assert sg["architectures"] == ["LlamaForCausalLMEagle3"]
    assert sg["num_hidden_layers"] == 1 and sg["tie_word_embeddings"] is False
    assert (sg["draft_vocab_size"], sg["vocab_size"], sg["target_hidden_size"]) == (80, 96, 64)
    # Llama targets: SGLang adds 1 to the config ids, so config ids = canonical ids [0, 1, 2].
    assert sg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 1, 2]
    w = load_file(str(out / "sglang" / "model.safetensors"))
    assert sorted(w) == sorted([
        "fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d",
        *(f"midlayer.self_attn.{p}_proj.weight" for p in "qkvo"),
        *(f"midlayer.mlp.{p}_proj.weight" for p in ("gate", "up", "down")),
        *(f"midlayer.{n}.weight" for n in ("input_layernorm", "hidden_norm", "post_attention_layernorm"))])
    assert w["fc.weight"].shape == (64, 192) and w["fc.weight"].dtype == torch.bfloat16
    assert w["midlayer.self_attn.q_proj.weight"].shape == (64, 128)      # 2H in
    assert w["midlayer.self_attn.k_proj.weight"].shape == (32, 128)      # 2 kv heads x 16
    assert w["lm_head.weight"].shape == (80, 64)
    vocab = load_vocab(assets["vocab"])
    assert w["d2t"].dtype == torch.int64 and torch.equal(w["d2t"], vocab.d2t)
    assert w["t2d"].dtype == torch.bool and torch.equal(w["t2d"], vocab.t2d)

    sp = json.loads((out / "speculators" / "config.json").read_text())
    assert sp["architectures"] == ["Eagle3Speculator"] and sp["speculators_model_type"] == "eagle3"
    assert sp["norm_before_residual"] is False            # vLLM defaults an absent key to True
    assert sp["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]      # vLLM: input of layer k + 1
    assert sp["transformer_layer_config"]["num_hidden_layers"] == 1
    assert sp["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 3
    assert sp["speculators_config"]["verifier"]["name_or_path"] == str(assets["target"].resolve())
    ws = load_file(str(out / "speculators" / "model.safetensors"))
    assert sorted(ws) == sorted([*(k.replace("midlayer.", "layers.0.") for k in w), "embed_tokens.weight"])
    torch.testing.assert_close(ws["layers.0.self_attn.q_proj.weight"], w["midlayer.self_attn.q_proj.weight"])

    info = json.loads((out / "export_info.json").read_text())
    assert info["check"]["ok"] and info["layer_ids"] == [0, 1, 2] and info["step"] == 4
    assert info["check"]["samples"] == info["holdout"][:4]


def test_sglang_ids_for_a_deepseek_family_target():
    """deepseek_v2.py takes the config ids as they are unless the first is 1:
    canonical [2, 30, 58] must be written as [3, 31, 59] (the real Kimi run)."""
    from ops.drafter.config import DrafterConfig
    from ops.drafter.formats import canonical_ids, sglang_config

    cfg = DrafterConfig(hidden_size=7168, num_attention_heads=64, num_key_value_heads=64, head_dim=112,
                        intermediate_size=18432, draft_vocab_size=32000, target_vocab_size=163840,
                        aux_layer_ids=[2, 30, 58], target_num_layers=61,
                        target_architecture="DeepseekV3ForCausalLM")
    sg = sglang_config(cfg, "bfloat16")
    assert sg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [3, 31, 59]
    assert canonical_ids(sg, "sglang", "DeepseekV3ForCausalLM") == [2, 30, 58]
    cfg.target_architecture = "LlamaForCausalLM"
    assert sglang_config(cfg, "bfloat16")["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 30, 58]


def test_check_catches_damaged_exports(assets, trained, tmp_path):
    from safetensors.torch import load_file, save_file

    from ops.drafter.checkpoint import load_drafter
    from ops.export.__main__ import check
    from ops.drafter.formats import ExportFormatError, read_export

    out = tmp_path / "export"
    assert export(trained, out, "--dtype", "float32", "--format", "sglang") == 0
    weights = out / "sglang" / "model.safetensors"
    good = load_file(str(weights))
    model, meta = load_drafter(trained)
    args = argparse.Namespace(data=None, check_samples=2, dtype="float32", device="cpu")
    assert check(model, {"sglang": out / "sglang"}, meta, args, assets["target"])["ok"]

    # k_proj given q_proj's tensor (as a mis-mapped export would): the wrong shape is named.
    bad = dict(good)
    bad["midlayer.self_attn.k_proj.weight"] = good["midlayer.self_attn.q_proj.weight"].clone()
    save_file(bad, str(weights))
    with pytest.raises(ExportFormatError, match=r"midlayer.self_attn.k_proj.weight.*\(64, 128\).*\(32, 128\)"):
        read_export(out / "sglang")

    # Right names and shapes, wrong values: the logits comparison fails.
    bad = dict(good)
    bad["fc.weight"] = good["fc.weight"] * 1.5
    save_file(bad, str(weights))
    report = check(model, {"sglang": out / "sglang"}, meta, args, assets["target"])
    assert not report["ok"] and report["formats"]["sglang"]["rel_logit_err"] > 1e-3

    del bad["t2d"]
    save_file(bad, str(weights))
    with pytest.raises(ExportFormatError, match=r"missing tensors \['t2d'\]"):
        read_export(out / "sglang")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: tests/gpu checks --device cuda")
def test_check_on_cuda_without_cuda_is_one_line_and_writes_nothing(trained, tmp_path, capsys):
    out = tmp_path / "export"
    assert export(trained, out, "--dtype", "float32", "--format", "sglang", "--device", "cuda") == 2
    err = capsys.readouterr().err
    assert "--device cuda: CUDA is not available on this machine" in err and "Traceback" not in err
    assert not out.exists() and not list(tmp_path.glob("export*"))


def test_missing_checkpoint_is_a_clear_error(tmp_path, capsys):
    assert export(tmp_path / "nothing", tmp_path / "out") == 2
    assert "nothing" in capsys.readouterr().err


def test_speculators_names_the_target_so_it_loads_from_any_directory(assets, trained, tmp_path, monkeypatch):
    """The console passes the target as eagle3.toml says it (`assets/target`,
    relative to the workspace): the export must name it absolutely, or
    speculators, loaded from another directory, takes it for a Hub id."""
    from transformers import AutoConfig

    target = Path(assets["target"]).resolve()
    monkeypatch.chdir(target.parent)
    out = tmp_path / "export"
    assert export(trained, out, "--target", target.name, "--format", "speculators") == 0
    name = json.loads((out / "speculators" / "config.json").read_text())["speculators_config"]["verifier"]["name_or_path"]
    assert name == str(target)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    # What speculators does with it: the verifier's config through transformers.
    assert AutoConfig.from_pretrained(name).model_type == json.loads((target / "config.json").read_text())["model_type"]
    info = json.loads((out / "export_info.json").read_text())
    assert info["target"] == str(target)


def test_a_target_given_as_a_model_id_stays_a_model_id(trained, tmp_path):
    out = tmp_path / "export"
    # --no-check: the reload check needs the target itself, which a model id is not (offline).
    assert export(trained, out, "--target", "meta-llama/Llama-3.1-8B-Instruct", "--format", "speculators",
                  "--no-check") == 0
    sp = json.loads((out / "speculators" / "config.json").read_text())
    assert sp["speculators_config"]["verifier"]["name_or_path"] == "meta-llama/Llama-3.1-8B-Instruct"
