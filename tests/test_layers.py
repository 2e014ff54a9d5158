"""The layer convention (ops/layers.py): canonical ids and what each engine gets."""

from __future__ import annotations

import pytest

from ops import layers


def test_default_aux_layers_are_the_engines_defaults_shifted_back():
    assert layers.default_aux_layers(61) == [1, 29, 57]
    assert layers.default_aux_layers(32) == [1, 15, 28]
    # SGLang/vLLM default capture [2, N//2, N-3] is the input of k+1.
    for n in (8, 32, 61, 80):
        assert layers.sglang_capture_ids(layers.default_aux_layers(n)) == [2, n // 2, n - 3]


def test_default_refuses_a_target_too_shallow_for_three_distinct_layers():
    with pytest.raises(ValueError, match="4-layer target"):
        layers.default_aux_layers(4)


def test_real_run_kimi_61_layers():
    ks = [2, 30, 58]
    assert layers.sglang_capture_ids(ks) == [3, 31, 59]
    assert layers.vllm_aux_ids(ks) == [3, 31, 59]
    assert layers.hf_hidden_states_indices(ks) == [3, 31, 59]
    # Kimi K2's config.json says DeepseekV3ForCausalLM: deepseek_v2.py takes
    # ids as they are unless the first is 1, so the draft config gets [3, 31, 59].
    for arch in ("DeepseekV3ForCausalLM", "kimi_k2", "deepseek_v3"):
        ids = layers.sglang_config_ids_for(arch, ks)
        assert ids == [3, 31, 59]
        assert layers.apply_sglang_rule(arch, ids) == [3, 31, 59]
    # llama.py adds 1 to whatever the config says.
    assert layers.sglang_config_ids_for("LlamaForCausalLM", ks) == [2, 30, 58]
    record = layers.engine_ids(ks, 61, "DeepseekV3ForCausalLM")
    assert record["final_layer_id"] == 60
    assert record["num_layers_captured"] == 4
    assert record["sglang_layers_to_capture"] == [3, 31, 59]


def test_deepseek_rule_with_first_layer_one_writes_canonical_ids():
    ks = [1, 29, 57]
    ids = layers.sglang_config_ids_for("DeepseekV3ForCausalLM", ks)
    assert ids == [1, 29, 57]
    assert layers.apply_sglang_rule("DeepseekV3ForCausalLM", ids) == [2, 30, 58]


def test_deepseek_rule_refuses_layer_zero():
    # [0, ...] is taken as is (0 != k+1) and [1, ...] gets +1 (2 != 1): no ids work.
    with pytest.raises(ValueError, match="choose other aux layers"):
        layers.sglang_config_ids_for("DeepseekV2ForCausalLM", [0, 10, 20])
    record = layers.engine_ids([0, 10, 20], 30, "deepseek_v2")
    assert record["sglang_config_layer_ids"] is None
    assert "choose other aux layers" in record["sglang_config_error"]
    # llama has no such hole.
    assert layers.sglang_config_ids_for("LlamaForCausalLM", [0, 10, 20]) == [0, 10, 20]


@pytest.mark.parametrize("value, message", [
    ("2,x,5", "comma-separated integers"),
    ("3,2,5", "strictly increasing"),
    ("1,2,8", "outside the target's layers 0..7"),
    ("", None),
])
def test_parse_layer_ids(value, message):
    if message is None:
        assert layers.parse_layer_ids(value, 8) == [1, 3, 4]
    else:
        with pytest.raises(ValueError, match=message):
            layers.parse_layer_ids(value, 8)
    assert layers.parse_layer_ids([0, 2, 7], 8) == [0, 2, 7]
