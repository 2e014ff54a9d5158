"""Each op's params are declared once (ops/params.py, issue 21): the console's
check at `run`, the op's argparse and the argv come from the same Param, so a
bad bound is refused before launch (exit 3) and the op refuses it in the same
words; the argv the console builds parses back to the params."""

from __future__ import annotations

import importlib
import json

import pytest

from ops import KNOWN_OPS, get_spec
from ops.params import REQUIRED, Param, ParamSet
from tests.conftest import TINY_TARGET

# Every op's parser is built from its SPEC (ops.params.build_parser).
FROM_PARAMS = KNOWN_OPS


def parser_of(op: str):
    return importlib.import_module(f"ops.{op}.__main__").build_parser()


def required_argv(op: str) -> list[str]:
    spec = get_spec(op)
    out = ["--target", "/x/target"] if spec.uses_target else []
    for key in spec.params.required():
        out += ["--" + key.replace("_", "-"), f"/x/{key}"]
    return out


def out_of_bounds(param: Param):
    """A value the param refuses, of its own type (so the console and argv say it alike)."""
    if param.choices is not None:
        return "bogus"
    kind = param.kind
    if param.low is not None:
        return kind(param.low) if param.low_open else kind(param.low) - 1
    if param.high is not None:
        return kind(param.high) if param.high_open else kind(param.high) + 1
    return None


BOUNDED = [(op, p.name) for op in KNOWN_OPS for p in get_spec(op).params.declared.values()
           if out_of_bounds(p) is not None]


# ------------------------------------------------------------------ Param itself
def test_a_param_checks_type_bounds_and_choices_in_one_set_of_words():
    n = Param("n", 4, low=1)
    assert n.check(4) is None and n.check("8") is None
    assert n.check(0) == "expected >= 1, got 0"
    assert n.check("abc") == "expected an integer (default 4), got 'abc'"
    assert n.check(True) == "expected an integer (default 4), got True"
    frac = Param("f", None, type=float, low=0, low_open=True, high=1, high_open=True)
    assert frac.check(None) is None and frac.check(0.5) is None
    assert frac.check(0) == "expected > 0 and < 1, got 0" and frac.check(1.0) == "expected > 0 and < 1, got 1.0"
    assert frac.check(float("nan")) == "expected a finite number, got nan"
    assert Param("m", "a", choices=("a", "b")).check("c") == "expected one of a, b, got 'c'"
    assert Param("flag", False).check("yes") == "expected true or false (default False), got 'yes'"


def test_a_bare_flag_param_and_a_converted_one():
    def bucket(text: str) -> str:
        if text != "auto" and not text.isdigit():
            raise ValueError("expected 'auto' or a whole number")
        return text

    const = Param("fused", "auto", choices=("auto", "on", "off"), const="on")
    assert const.check(True) is None and const.check(False) is None and const.check("x") is not None
    conv = Param("bucket", "auto", convert=bucket)
    assert conv.check(64) is None and conv.check("-3") == "expected 'auto' or a whole number, got '-3'"
    spec = type("S", (), {"name": "t", "module": None, "summary": "t", "uses_target": False,
                          "params": ParamSet((const, conv))})()
    from ops.params import build_parser
    parser = build_parser(spec)
    args = parser.parse_args(["--fused", "--bucket", "64"])
    assert (args.fused, args.bucket) == ("on", "64")
    assert vars(parser.parse_args([])) == {"fused": "auto", "bucket": "auto"}


def test_a_param_set_reads_as_its_defaults_and_knows_the_required():
    ps = ParamSet((Param("input"), Param("n", 3), Param("x", None, type=int)))
    assert dict(ps) == {"input": REQUIRED, "n": 3, "x": None}
    assert ps.defaults() == {"n": 3, "x": None} and ps.required() == ["input"]
    with pytest.raises(ValueError, match="twice"):
        ParamSet((Param("n", 1), Param("n", 2)))


def test_json_params_come_from_the_params_declared_json():
    assert get_spec("serve").json_params == ("extra_args",)
    assert get_spec("extract").json_params == ("extra_args",)
    assert all(get_spec(op).json_params == () for op in KNOWN_OPS if op not in ("serve", "extract"))


def test_effective_is_the_defaults_then_the_stage():
    spec = get_spec("prepare")
    eff = spec.effective({"input": "a.jsonl", "max_seq_len": 128})
    assert eff["max_seq_len"] == 128 and eff["workers"] == 0 and eff["input"] == "a.jsonl"
    assert "output" not in eff          # REQUIRED is no default


# ------------------------------------------------------------------ the op's parser and its SPEC
@pytest.mark.parametrize("op", FROM_PARAMS)
def test_every_param_has_its_flag_with_the_specs_default_and_help(op):
    spec = get_spec(op)
    actions = {a.dest: a for a in parser_of(op)._actions}
    for key, param in spec.params.declared.items():
        action = actions[key]
        assert action.option_strings[0] == param.flag, key
        assert action.help == (param.help or None), key
        if param.default is REQUIRED:
            assert action.required, key
        else:
            assert action.default == param.default and not action.required, key


@pytest.mark.parametrize("op,key", [b for b in BOUNDED if b[0] in FROM_PARAMS])
def test_a_value_out_of_bounds_is_refused_by_the_console_and_the_op_in_the_same_words(op, key, capsys):
    spec = get_spec(op)
    param = spec.params.declared[key]
    bad = out_of_bounds(param)
    words = spec.param_type_error(key, bad)
    assert words and words.startswith("expected "), (key, bad, words)
    with pytest.raises(SystemExit) as exc:
        parser_of(op).parse_args(required_argv(op) + [param.flag, str(bad)])
    assert exc.value.code == 2
    assert f"error: argument {param.flag}: {words}" in capsys.readouterr().err


def sample_value(param: Param):
    """A value other than the default, of the param's type."""
    if param.json:
        return ["--flag", "{\"a\": 1, \"b\": 2}"]
    if param.choices is not None:
        return next(c for c in param.choices if c != param.default)
    if param.convert is not None:
        # The first of a few spellings that this param's own converter takes (a size, a
        # setting list, a concurrency list), so every converter is exercised.
        for text in ("64", "3/1/4,5/1/6", "1,8"):
            try:
                param.convert(text)
            except (ValueError, TypeError):
                continue
            if text != param.default:
                return text
        raise AssertionError(f"no sample value for {param.name}")
    kind = param.kind
    if kind is bool:
        return not param.default
    if kind is int:
        base = param.default if isinstance(param.default, int) else int(param.low or 0)
        return base + 1 if param.high is None or base + 1 <= param.high else base - 1
    if kind is float:
        return 0.5 if param.high is not None else (param.default or 1.0) * 2
    return "/x/value"


@pytest.mark.parametrize("op", FROM_PARAMS)
def test_the_argv_of_values_other_than_the_defaults_parses_back_to_them(op):
    spec = get_spec(op)
    params = {k: sample_value(p) for k, p in spec.params.declared.items()}
    for key, value in params.items():
        assert spec.param_type_error(key, value) is None, (key, value)
    argv = spec.argv(params, target_path="/x/target" if spec.uses_target else None)
    # The op's own words follow its `-m ops.<op>` (a launcher such as torchrun may come first).
    argv = argv[len(argv) - argv[::-1].index("-m") + 1:]
    args = vars(parser_of(op).parse_args(argv))
    for key, value in params.items():
        got = json.loads(args[key]) if spec.params.declared[key].json else args[key]
        assert got == value, (op, key, got, value)


# ------------------------------------------------------------------ the console refuses before a launch
TRAIN_PIPELINE = TINY_TARGET + """
[stages.train]
op = "train"
params = { data = "out/data", vocab = "out/vocab", output = "out/train" }
"""


def test_run_refuses_a_bound_with_exit_3_before_anything_starts(ws):
    """Before: `--set grad_accum=0` passed (an integer), the run started and died
    dividing by it; now the console says which stage, param and value."""
    ws.write(TRAIN_PIPELINE)
    proc = ws.cli("run", "train", "--set", "grad_accum=0")
    assert proc.returncode == 3, (proc.stdout, proc.stderr)
    assert "stages.train: param grad_accum: expected >= 1, got 0" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    assert ws.latest("train") is None
    assert not (ws.root / "out" / "train").exists()


def test_a_pipeline_file_with_tp_0_is_refused_at_run_naming_the_stage_and_key(ws):
    ws.write("""
[stages.serve]
op = "serve"
params = { tp = 0 }
""")
    proc = ws.cli("run", "serve")
    assert proc.returncode == 3, (proc.stdout, proc.stderr)
    assert "stages.serve.params.tp: expected >= 1, got 0" in proc.stderr, proc.stderr
    assert ws.latest("serve") is None


def test_a_choice_outside_the_declared_ones_is_refused_at_run(ws):
    ws.write(TRAIN_PIPELINE)
    proc = ws.cli("run", "train", "--set", "report_to=wandb")
    assert proc.returncode == 3, (proc.stdout, proc.stderr)
    assert "param report_to: expected one of none, tensorboard, got 'wandb'" in proc.stderr, proc.stderr
    assert ws.latest("train") is None
