"""The SGLang engine's contract with the pinned SGLang (0.5.23, installed by bin/test with
--no-deps): its version, every internal the extraction engine would drive, and ops/layers.py's
rule against SGLang's own set_eagle3_layers_to_capture, run from the installed source."""

from __future__ import annotations

import ast
import typing
from types import SimpleNamespace

import pytest

from ops import layers
from ops.extract import sglang_engine as eng


def test_the_installed_sglang_is_the_pinned_one_and_every_internal_is_there():
    assert eng.check_version() == eng.PINNED_SGLANG
    assert eng.check_static() == []


def test_another_version_is_refused_with_what_to_do():
    with pytest.raises(eng.EngineVersionError) as exc:
        eng.check_version("0.5.22")
    msg = str(exc.value)
    assert msg.startswith("engine sglang: sglang 0.5.22 is installed, but this engine drives SGLang internals "
                          "checked against 0.5.23 only")
    assert "pip install sglang==0.5.23" in msg


def test_a_missing_internal_or_parameter_is_named():
    probs = eng.check_static((
        eng.Internal("sglang.srt.models.llama", "LlamaForCausalLM.no_such_method", (), "test"),
        eng.Internal("sglang.srt.models.llama", "LlamaForCausalLM.set_eagle3_layers_to_capture", ("ids",), "t"),
        eng.Internal("sglang.srt.no_such_module", "X", (), "t"),
    ))
    assert probs[0].startswith("sglang.srt.models.llama.LlamaForCausalLM.no_such_method: not found in ")
    assert probs[1] == ("sglang.srt.models.llama.LlamaForCausalLM.set_eagle3_layers_to_capture: "
                        "no parameter(s) ['ids'] (t)")
    assert probs[2].startswith("sglang.srt.no_such_module: no such module")


def sglang_setter(module: str, cls: str):
    """SGLang's own set_eagle3_layers_to_capture, compiled from the installed source
    (importing the model module needs GPU-side packages this machine lacks)."""
    path = eng._source_path(module)
    tree = ast.parse(path.read_text())
    fn = eng._find(tree, [cls, "set_eagle3_layers_to_capture"])
    mod = ast.Module(body=[fn], type_ignores=[])
    ns = {"Optional": typing.Optional, "List": typing.List, "list": list}
    exec(compile(mod, str(path), "exec"), ns)
    return ns["set_eagle3_layers_to_capture"]


@pytest.mark.parametrize("module,cls,arch", [
    ("sglang.srt.models.llama", "LlamaForCausalLM", "LlamaForCausalLM"),
    ("sglang.srt.models.deepseek_v2", "DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM"),
])
def test_ops_layers_rule_is_sglangs(module, cls, arch):
    setter = sglang_setter(module, cls)

    def capture(ids):
        me = SimpleNamespace(pp_group=SimpleNamespace(is_last_rank=True),
                             config=SimpleNamespace(num_hidden_layers=61), model=SimpleNamespace())
        setter(me, ids)
        assert me.capture_aux_hidden_states is True
        return me.model.layers_to_capture

    for ids in ([1, 29, 57], [2, 30, 58], [3, 31, 59], [0, 5, 9]):
        assert capture(ids) == layers.apply_sglang_rule(arch, ids), ids
    # The default: inputs of [2, N//2, N-3], i.e. canonical [1, N//2-1, N-4].
    assert capture(None) == layers.sglang_capture_ids(layers.default_aux_layers(61))
    # The real run: canonical [2, 30, 58] -> capture [3, 31, 59] through the ids export writes.
    assert capture(layers.sglang_config_ids_for(arch, [2, 30, 58])) == [3, 31, 59]
