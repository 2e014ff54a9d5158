"""extract's engine seam (ops/extract/engine.py): run.py's loop drives any
Engine and never asks which one it has; the engine param picks one in one
place (engines.py); SGLang's version is checked once, before torch."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from safetensors.torch import load_file  # noqa: E402
from tests import sglang_forward_double as double  # noqa: E402
from tests.test_op_extract import extract_argv, make_prepared, make_target  # noqa: E402

from ops import common  # noqa: E402
from ops.common import run_main  # noqa: E402
from ops.extract import engine as engine_mod, engines, sglang_capture, sglang_engine  # noqa: E402
from ops.extract.__main__ import build_parser, main as extract_main  # noqa: E402
from ops.formats import DATA_CONFIG, sample_path  # noqa: E402
from ops.extract.spec import SPEC  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
N = 6


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    root = tmp_path_factory.mktemp("engine_seam")
    return make_target(root / "target"), make_prepared(root / "prep", n=N, seed=3)


class PackedTarget:
    """A target whose states are a function of the token ids, packed as SGLang's are."""

    def __init__(self, hidden: int, n_aux: int) -> None:
        self.hidden, self.n_aux, self.batches, self.closed = hidden, n_aux, [], 0

    def forward(self, tokens):
        self.batches.append([len(t) for t in tokens])
        ids = torch.cat([torch.from_numpy(t.astype("int64")) for t in tokens]).float()
        final = ids[:, None].expand(-1, self.hidden).contiguous()
        aux = torch.cat([final + k + 1 for k in range(self.n_aux)], dim=-1)
        return engine_mod.TargetOutput.packed(aux, final, [len(t) for t in tokens])

    def close(self) -> None:
        self.closed += 1


class FakeEngine:
    def __init__(self) -> None:
        self.target: PackedTarget | None = None
        self.closed = 0

    def coords(self):
        return 0, 1, 0

    def config_keys(self):
        return {"extraction_method": "fake", "fake_engine": True}

    def leads(self):
        return True

    def follow(self):
        raise AssertionError("a leader never follows")

    def load(self, info, dtype, layer_ids, placement):
        self.target = PackedTarget(info.hidden_size, len(layer_ids))
        return self.target

    def close(self):
        self.closed += 1


def test_the_loop_drives_any_engine(assets, tmp_path, capsys):
    from ops.extract.run import extract

    target, prepared = assets
    argv = extract_argv(target, prepared, tmp_path / "out", "--token-budget", "100", "--device", "cpu")
    args = build_parser().parse_args(argv)
    engine = FakeEngine()
    assert extract(args, engine, argv) == 0
    config = json.loads((tmp_path / "out" / DATA_CONFIG).read_text())
    assert (config["status"], config["extraction_method"], config["fake_engine"]) == ("complete", "fake", True)
    assert list(config).index("extraction_method") == 2      # where the HF engine's has always been
    assert config["command"][-len(argv):] == argv
    assert engine.closed == 1 and engine.target.closed == 1 and len(engine.target.batches) > 1
    for idx in range(N):
        data = load_file(str(sample_path(tmp_path / "out", idx)))
        ids = data["input_ids"].float()
        torch.testing.assert_close(data["final_hidden_states"][:, 0], ids)
        torch.testing.assert_close(data["aux_hidden_states"][:, -1], ids + 3)
    # Nothing left: the engine is closed, the target never loaded.
    engine = FakeEngine()
    assert extract(args, engine, argv) == 0
    assert engine.target is None and engine.closed == 1
    assert "nothing to extract" in capsys.readouterr().out


def test_a_follower_runs_only_follow(tmp_path):
    from ops.extract.run import extract

    class Follower(FakeEngine):
        def leads(self):
            return False

        def follow(self):
            return 7

    args = build_parser().parse_args(extract_argv(tmp_path / "t", tmp_path / "p", tmp_path / "o"))
    engine = Follower()
    assert extract(args, engine, []) == 7
    assert engine.closed == 0 and not (tmp_path / "o").exists()


def test_the_engine_param_names_an_engine_of_engines_py():
    assert set(engines.ENGINES) == {"hf", "sglang"}
    # Declared once, in the Param (spec.py stays cheap: it names them, engines.py imports them).
    assert SPEC.params.declared["engine"].choices == tuple(engines.ENGINES)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--target", "t", "--input", "i", "--output", "o", "--engine", "vllm"])


def test_run_py_and_loop_py_ask_no_engine_which_it_is():
    """No `engine ==` / `args.engine` / module-identity branch in the loop's modules."""
    for name in ("run.py", "loop.py"):
        tree = ast.parse((REPO / "ops" / "extract" / name).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute):
                assert node.attr != "engine", f"{name}:{node.lineno}"
            if isinstance(node, ast.ImportFrom) and node.module:
                assert "sglang" not in node.module and "hf_engine" not in node.module, f"{name}:{node.lineno}"
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                assert node.value not in ("hf", "sglang"), f"{name}:{node.lineno}"


def test_one_function_gives_the_torchrun_coordinates(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "2")
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    assert common.torchrun_coords() == (2, 4, 2)
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert common.torchrun_coords() == (2, 4, 0)


def test_sglangs_version_is_checked_once(assets, tmp_path, monkeypatch, capsys):
    target, prepared = assets
    calls = []
    real = sglang_engine.check_version

    def counted(*a, **kw):
        calls.append(1)
        return real(*a, **kw)

    monkeypatch.setattr(sglang_engine, "check_version", counted)
    double.LOADS.clear()
    monkeypatch.setattr(sglang_capture, "load", double.load)
    code = run_main(extract_main, extract_argv(target, prepared, tmp_path / "sg", "--engine", "sglang"))
    assert code == 0, capsys.readouterr()
    assert calls == [1] and len(double.LOADS) == 1
    config = json.loads((tmp_path / "sg" / DATA_CONFIG).read_text())
    assert (config["extraction_method"], config["sglang_version"]) == ("sglang", sglang_engine.PINNED_SGLANG)
