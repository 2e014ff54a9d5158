"""One source of each op's defaults: every op's argument parser takes its
defaults from its SPEC.params (ops.params.build_parser), and the argv the
console builds from a spec parses back to the same params."""

from __future__ import annotations

import importlib

import pytest

from ops import KNOWN_OPS, get_spec
from ops.spec import REQUIRED


@pytest.mark.parametrize("op", KNOWN_OPS)
def test_parser_defaults_are_the_spec_params(op):
    spec = get_spec(op)
    parser = importlib.import_module(f"ops.{op}.__main__").build_parser()
    actions = {a.dest: a for a in parser._actions if a.dest != "help"}
    flags = set(actions) - {"target"}          # --target comes from [target] (uses_target)
    assert flags == set(spec.params), (sorted(flags - set(spec.params)), sorted(set(spec.params) - flags))
    for key, default in spec.params.items():
        if default is REQUIRED:
            assert actions[key].required, key
        else:
            assert actions[key].default == default and not actions[key].required, (key, actions[key].default, default)


@pytest.mark.parametrize("op", KNOWN_OPS)
def test_spec_argv_parses_back_to_the_params(op):
    """What `run` builds from the defaults (and from each boolean flipped) is what the program sees."""
    spec = get_spec(op)
    parser = importlib.import_module(f"ops.{op}.__main__").build_parser()
    base = {k: (f"/x/{k}" if v is REQUIRED else v) for k, v in spec.params.items()}
    variants = [base] + [{**base, k: not v} for k, v in spec.params.items() if isinstance(v, bool)]
    for params in variants:
        argv = spec.argv(params, target_path="/x/target" if spec.uses_target else None)[3:]
        args = vars(parser.parse_args(argv))
        for key, value in params.items():
            if isinstance(value, (list, tuple)):
                continue        # joined with commas: the op parses them itself
            assert args[key] == value or str(args[key]) == str(value), (op, key, args[key], value)
