"""The pipeline file: a good one loads, every kind of bad one exits 3 with the file and key named."""

from __future__ import annotations

import pytest

from eagle3_console.kernel import config as cfg
from tests.conftest import stage_cmd

GOOD = f"""
[target]
path = "models/t"
num_layers = 61
hidden_size = 7168
dtype = "bfloat16"
vocab_size = 163840

[stages.a]
argv = {stage_cmd("progress.py", "--n", "{n}")}
params = {{ n = 5 }}
outputs = ["out/a"]
batch_param = "n"
restart = {{ max = 2, backoff_s = 1 }}

[stages.b]
argv = ["python", "-c", "print(1)"]
depends_on = ["a"]
outputs = ["out/b"]
gpus = [0, 1]
"""


def test_good_pipeline_loads_and_fills_params(ws):
    ws.write(GOOD)
    pipe = cfg.load(ws.root / "eagle3.toml")
    assert pipe.order() == ["a", "b"]
    a = pipe.stage("a")
    argv = a.command({"n": 7}, pipe.target)
    assert argv[-2:] == ["--n", "7"]
    assert a.restart.max == 2 and a.batch_param == "n"
    assert pipe.stage("b").environment()["CUDA_VISIBLE_DEVICES"] == "0,1"


BAD = [
    ("[stages.a]\nargv = ['x']\nbogus = 1\n", "stages.a.bogus", "unknown key"),
    ("[stages.a]\nargv = 'python x.py'\n", "stages.a.argv", "expected a list"),
    ("[stages.a]\nparams = {}\n", "stages.a", "exactly one of"),
    ("[target]\nnum_layers = 'sixty'\n", "target.num_layers", "expected an integer"),
    ("[stages.a]\nargv = ['x']\ndepends_on = ['b']\n[stages.b]\nargv = ['y']\ndepends_on = ['a']\n",
     "depends_on", "dependency cycle"),
    ("[stages.a]\nargv = ['x']\ndepends_on = ['nope']\n", "stages.a.depends_on", "'nope'"),
    ("[stages.a]\nargv = ['x']\noutputs = ['out']\n[stages.b]\nargv = ['y']\noutputs = ['out/inner']\n",
     "stages.b.outputs", "inside stage 'a'"),
    ("[stages.a]\nargv = ['x', '{n}']\n", "stages.a.argv", "names {n}"),
    ("[stages.a]\nop = 'extract'\nparams = { output = 'o' }\n", "stages.a.params", "requires ['input']"),
    ("[stages.a]\nop = 'extract'\nparams = { input = 'i', output = 'o', batch_size = 4 }\n",
     "stages.a.params.batch_size", "no such param"),
    ("[stages.a]\nop = 'nosuch'\n", "stages.a.op", "expected one of"),
    ("[stages.a\nargv = ['x']\n", "(syntax)", ""),
    ("[stages.a]\nargv = ['x']\nrestart = { max = 'two' }\n", "stages.a.restart.max", "expected an integer"),
]


@pytest.mark.parametrize("text,key,words", BAD, ids=[b[1] + ":" + b[2][:12] for b in BAD])
def test_bad_pipeline_names_file_and_key(ws, text, key, words):
    ws.write(text)
    with pytest.raises(cfg.ConfigError) as info:
        cfg.load(ws.root / "eagle3.toml")
    msg = str(info.value)
    assert str(ws.root / "eagle3.toml") in msg and key in msg and words in msg


def test_bad_pipeline_exits_3_and_writes_nothing(ws):
    ws.write(BAD[0][0])
    proc = ws.call("run", "a")
    assert proc.returncode == 3
    assert "stages.a.bogus" in proc.stderr
    assert not (ws.root / ".eagle3" / "state.db").exists()
    proc = ws.call("status", "--json")
    assert proc.returncode == 3


def test_missing_pipeline_file_is_a_clear_error(ws):
    proc = ws.call("status")
    assert proc.returncode == 3 and "eagle3-console init" in proc.stderr


def test_set_values_parse_as_toml_scalars():
    assert cfg.parse_overrides(["n=4", "u=0.85", "f=true", "s=hello", "l=[1,2]"]) == \
        {"n": 4, "u": 0.85, "f": True, "s": "hello", "l": [1, 2]}
    with pytest.raises(cfg.ConfigError):
        cfg.parse_overrides(["novalue"])


def test_init_writes_a_template_that_loads_and_never_overwrites(ws):
    target = ws.root / "new"
    proc = ws.cli("init", str(target), check=0)
    assert "wrote" in proc.stdout
    pipe = cfg.load(target / "eagle3.toml")
    assert pipe.order() == ["prepare", "vocab", "extract", "verify", "train", "export", "bench"]
    assert pipe.stage("extract").environment()["CUDA_VISIBLE_DEVICES"] == "0,1,2,3,4,5,6,7"
    before = (target / "eagle3.toml").read_text()
    again = ws.cli("init", str(target))
    assert again.returncode == 2 and "not overwriting" in again.stderr
    assert (target / "eagle3.toml").read_text() == before


def test_logs_prints_the_tail_of_the_latest_run(ws):
    from tests.conftest import stage_cmd
    ws.write(f"[stages.p]\nargv = {stage_cmd('progress.py', '--n', '5', '--sleep', '0.01')}\n")
    assert ws.cli("logs", "p").returncode == 2          # no runs yet
    ws.cli("run", "p", check=0)
    ws.wait_status("p", ("succeeded",))
    proc = ws.cli("logs", "p", "-n", "2", check=0)
    lines = proc.stdout.splitlines()
    assert len(lines) == 2 and lines[0].startswith("progress: samples 5/5") and "succeeded" in lines[1]
