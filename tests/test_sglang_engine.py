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


# The runtime check on the GPU host reported 4 internals "not found" that the
# static check accepts: dataclass fields without a class default
# (ModelRunnerOutput.logits_output) and class attributes whose default is None
# (ScheduleBatch.prefill_input_ids_cpu). The same shapes, in a module both
# checks can read here, must get the same verdict from both.
_SHAPES = '''
import dataclasses
from typing import Optional


@dataclasses.dataclass
class Output:
    logits_output: object
    can_run_graph: bool
    hidden: Optional[int] = None


@dataclasses.dataclass(slots=True, kw_only=True)
class Slotted:
    rows: int


class Batch:
    prefill_input_ids_cpu: Optional[int] = None

    def prepare(self, batch, future_map):
        pass
'''


def test_runtime_and_static_checks_agree_on_fields_and_none_defaults(tmp_path, monkeypatch):
    pkg = tmp_path / "shapes_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "mod.py").write_text(_SHAPES)
    monkeypatch.syspath_prepend(str(tmp_path))
    present = tuple(eng.Internal("shapes_pkg.mod", q, p, "t") for q, p in (
        ("Output.logits_output", ()), ("Output.can_run_graph", ()), ("Output.hidden", ()),
        ("Slotted.rows", ()), ("Batch.prefill_input_ids_cpu", ()), ("Batch.prepare", ("batch", "future_map"))))
    assert eng.check_static(present) == []
    assert eng.check_runtime(present) == []
    absent = (eng.Internal("shapes_pkg.mod", "Output.no_field", (), "t"),
              eng.Internal("shapes_pkg.mod", "Batch.prepare", ("nope",), "t"))
    assert [p.split(":")[0] for p in eng.check_static(absent)] == [p.split(":")[0] for p in eng.check_runtime(absent)]
    assert len(eng.check_runtime(absent)) == 2
