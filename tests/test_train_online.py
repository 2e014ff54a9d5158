"""Online training (issue 35): the drafter learns from the target's states
computed in the train run itself, never stored. On the tiny target the online
run trains the same drafter as the offline run over the same samples (the
toy's extraction is the same forward, unbatched), writes nothing but its
checkpoints and records, resumes a run killed mid-step to the same losses,
refuses bad input in one line, and the plan says what each mode costs."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, wait_for

torch = pytest.importorskip("torch")
torch.set_num_threads(1)

PY = sys.executable


def base_argv(assets, out, *extra) -> list[str]:
    return ["--vocab", str(assets["vocab"]), "--target", str(assets["target"]), "--output", str(out),
            "--workers", "0", "--lr", "3e-3", "--token-budget", "256", "--ttt-steps", "3", "--log-every", "2",
            "--warmup-ratio", "0", "--epochs", "2", "--holdout", "8", "--device", "cpu", "--save-every", "1000",
            *extra]


def offline(assets) -> list[str]:
    return ["--data", str(assets["data"])]


def online(assets) -> list[str]:
    # The toy's extraction captured layers 0, 1, 2 (ops/drafter/toy.py toy_assets).
    return ["--mode", "online", "--samples", str(assets["samples"]), "--layer-ids", "0,1,2"]


def run_train(argv) -> int:
    from ops.train.__main__ import main

    return main(argv)


def records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_online_trains_the_offline_drafter_and_stores_no_states(assets, tmp_path, capsys):
    off, on = tmp_path / "off", tmp_path / "on"
    assert run_train(base_argv(assets, off, *offline(assets))) == 0
    assert run_train(base_argv(assets, on, *online(assets))) == 0
    a, b = records(off), records(on)
    assert [r["step"] for r in a] == [r["step"] for r in b] == [2, 4, 6, 8, 10, 12, 14]
    for ra, rb in zip(a, b):
        assert abs(ra["loss"] - rb["loss"]) <= 1e-4 * max(1.0, abs(ra["loss"])), (ra, rb)
        assert ra["acc"] == pytest.approx(rb["acc"], abs=1e-3)
    assert abs(a[-1]["simulated_acceptance_length"] - b[-1]["simulated_acceptance_length"]) <= 0.03
    # Each online window says which side bounds the run, and the target's rate over the forwards it
    # timed. A window whose batches the prefetcher had all computed in the window before times none
    # and says no rate (a loaded machine's run, once: its line read "online: drafter step ...").
    online_windows = [r["online"] for r in b]
    assert all(o["bound"] in ("target", "drafter") for o in online_windows)
    assert all(o["target_tok_s"] > 0 if o["forward_s"] > 0 else o["target_tok_s"] is None for o in online_windows)
    assert any(o["target_tok_s"] for o in online_windows)
    assert "online" not in a[-1]
    printed = capsys.readouterr().out
    assert "online: target forward" in printed and "bound by the" in printed
    # Nothing of size: the checkpoints, metrics.jsonl and train_config.json, no state file anywhere.
    names = {p.relative_to(on).parts[0] for p in on.rglob("*")}
    assert names == {"checkpoints", "metrics.jsonl", "train_config.json"}, names
    assert all(p.relative_to(on).parts[0] == "checkpoints" for p in on.rglob("*.safetensors"))
    config = json.loads((on / "train_config.json").read_text())
    assert config["mode"] == "online" and config["samples"] == str(assets["samples"].resolve())
    assert "data" not in config


def test_the_result_line_says_the_bottleneck_in_words(assets, tmp_path):
    from ops.train.spec import SPEC

    out = tmp_path / "on"
    assert run_train(base_argv(assets, out, *online(assets))) == 0
    line = SPEC.result_line(records(out)[-1])
    assert "online, target forward" in line and ("bound by the target's forward" in line
                                                 or "bound by the drafter's step" in line), line


def _env() -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    env.pop("EAGLE3_RUN_ID", None)
    return env


def test_online_run_killed_mid_step_resumes_to_the_uninterrupted_losses(assets, tmp_path):
    """SIGKILL while the run is past its first checkpoint (inside a step or the
    forward of the next batch): --resume continues from the newest checkpoint
    with the same sample order, and the losses from there on are those of a
    run never killed."""
    whole = tmp_path / "whole"
    argv = base_argv(assets, whole, *online(assets), "--save-every", "4", "--log-every", "1", "--epochs", "3")
    assert run_train(argv) == 0
    want = {r["step"]: r["loss"] for r in records(whole)}
    out = tmp_path / "killed"
    argv = base_argv(assets, out, *online(assets), "--save-every", "4", "--log-every", "1", "--epochs", "3")
    proc = subprocess.Popen([PY, "-m", "ops.train", *argv], cwd=ROOT, env=_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        # The event: a step past the first checkpoint was logged (the run is mid-way through the next ones).
        def past_first_checkpoint():
            path = out / "metrics.jsonl"
            return path.exists() and any(json.loads(x)["step"] >= 5 for x in path.read_text().splitlines()
                                         if x.strip())
        wait_for(lambda: past_first_checkpoint() or proc.poll() is not None, timeout=120)
        killed = proc.poll() is None
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait(30)
    if not killed:
        pytest.skip("the run finished before it could be killed (a very fast machine)")
    from ops.drafter import checkpoint as ck

    newest = ck.newest(out)
    assert newest is not None
    resumed_from = int(newest.name.split("_")[-1])
    assert run_train(argv + ["--resume"]) == 0
    got = {r["step"]: r["loss"] for r in records(out) if r["step"] > resumed_from}
    assert sorted(got) == [s for s in sorted(want) if s > resumed_from]
    for step, loss in got.items():
        assert abs(loss - want[step]) <= 1e-4 * max(1.0, abs(want[step])), (step, loss, want[step])


@pytest.mark.parametrize("case", ["no_samples", "no_target", "bad_layers", "other_tokenizer", "offline_no_data"])
def test_bad_online_input_is_one_line_exit_2(assets, tmp_path, capsys, case):
    out = tmp_path / "out"
    argv = base_argv(assets, out, *online(assets))
    if case == "no_samples":
        i = argv.index("--samples")
        del argv[i:i + 2]
        want = "mode online needs samples"
    elif case == "no_target":
        i = argv.index("--target")
        argv[i + 1] = str(tmp_path / "missing")
        want = str(tmp_path / "missing")
    elif case == "bad_layers":
        argv[argv.index("--layer-ids") + 1] = "0,1,9"
        want = "layer_ids"
    elif case == "other_tokenizer":
        from ops.drafter import toy

        toy.write_prepared([([1, 4, 500, 9], [0, 0, 1, 1])] * 20, tmp_path / "prep")
        argv[argv.index("--samples") + 1] = str(tmp_path / "prep")
        want = "token id 500 outside the target's vocabulary"
    else:
        argv = base_argv(assets, out)
        want = "mode offline needs data"
    assert run_train(argv) == 2
    err = capsys.readouterr().err
    assert want in err and "Traceback" not in err, err
    assert len([line for line in err.splitlines() if "error" in line]) == 1, err
    assert not (out / "checkpoints").exists()


def test_the_plan_says_what_each_mode_costs(tmp_path):
    from ops.spec import EstimateContext
    from ops.train.spec import SPEC

    prep = tmp_path / "prep"
    prep.mkdir()
    (prep / "summary.json").write_text(json.dumps({"status": "complete", "samples": 10_000,
                                                   "total_tokens": 15_000_000}))
    target = {"hidden_size": 1536, "num_layers": 28, "vocab_size": 151936, "dtype": "bfloat16"}
    ctx = EstimateContext(tmp_path, {"mode": "online", "samples": "prep", "epochs": 3, "output": "o",
                                     "vocab": "v", "intermediate_size": 8960}, target, "train")
    lines = SPEC.plan_lines(ctx)
    text = "\n".join(lines)
    # 15M tokens x 4 states x 1536 x 2 B = 184.3 GB in bf16 (issue 35's figure), a quarter in int4.
    assert "15,000,000 tokens" in text and "bf16 171.7 GiB" in text and "int4 42.9 GiB" in text, text
    assert "3 x 15,000,000 = 45,000,000 token forwards" in text, text
    assert text.startswith("mode online: online needs checkpoints only"), text


@pytest.mark.parametrize("params,want", [
    ({"mode": "online", "vocab": "v", "output": "o"}, "stages.train.params.samples: mode online"),
    ({"vocab": "v", "output": "o"}, "stages.train.params.data: mode offline"),
])
def test_lint_refuses_a_mode_without_its_input(tmp_path, params, want):
    from ops.spec import EstimateContext
    from ops.train.spec import SPEC

    found = SPEC.lint(EstimateContext(tmp_path, params, {}, "train"), None)
    assert any(x.level == "error" and want in x.message for x in found), found


def test_console_refuses_online_train_without_samples_exit_3(ws):
    ws.write("""
[target]
path = "models/target"
num_layers = 4
hidden_size = 64

[stages.train]
op = "train"
params = { mode = "online", vocab = "v", output = "o" }
""")
    proc = ws.cli("run", "train", check=3)
    assert "stages.train.params.samples: mode online" in proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr


def test_the_exporter_gauges_carry_both_sides(assets, tmp_path):
    from ops.train.spec import SPEC

    out = tmp_path / "on"
    assert run_train(base_argv(assets, out, *online(assets))) == 0
    gauges = {g.name: g.value for g in SPEC.gauges(records(out)[-1])}
    assert gauges["eagle3_train_target_tokens_per_second"] > 0
    assert gauges["eagle3_train_drafter_tokens_per_second"] > 0
    assert 0 <= gauges["eagle3_train_wait_ratio"] <= 1 and gauges["eagle3_train_bound_by_target"] in (0, 1)


def test_an_online_drafter_exports_checked_and_benches_on_its_held_out_samples(assets, tmp_path):
    """No states were stored: export's check computes the held-out samples' states with the
    target, bench reads its prompts from prepare's samples (export_info.json names them)."""
    from ops.bench.__main__ import main as bench
    from ops.export.__main__ import main as export

    out = tmp_path / "on"
    assert run_train(base_argv(assets, out, *online(assets))) == 0
    exported = tmp_path / "export"
    assert export(["--checkpoint", str(out), "--output", str(exported), "--dtype", "float32"]) == 0
    info = json.loads((exported / "export_info.json").read_text())
    assert info["check"]["ok"] and info["samples"] == str(assets["samples"].resolve()) and info["data"] is None
    held = info["holdout"]
    assert bench(["--drafter", str(exported / "sglang"), "--target", str(assets["target"]), "--output",
                  str(tmp_path / "bench"), "--draft-tokens", "3", "--max-new-tokens", "8", "--num-prompts", "4",
                  "--device", "cpu"]) == 0
    result = json.loads((tmp_path / "bench" / "bench.json").read_text())
    assert result["prompts"] == held[:4] and result["outputs_match"], result["prompts"]


def test_a_window_without_a_forward_of_its_own_says_no_target_rate():
    """The prefetcher may compute a window's batches in the window before: that window timed no
    forward, so it has no target rate to say (not 0 tok/s, not the last window's)."""
    from ops.train.online import OnlineData, bound_words

    data = OnlineData(root=Path("p"), hidden_size=8, layer_ids=[0], final_post_norm=True, config={},
                      samples={}, lengths={}, prepared=None)
    data.clock.add(0.5, 4000)
    first = data.window(elapsed=1.0, waited=0.6, tokens=4000)
    second = data.window(elapsed=1.0, waited=0.0, tokens=4000)
    assert (first["target_tok_s"], first["bound"]) == (8000.0, "target")
    assert (second["target_tok_s"], second["forward_s"], second["bound"]) == (None, 0.0, "drafter")
    assert bound_words(second).startswith("drafter step 4000 tok/s; bound by the drafter's step")
    assert bound_words(first).startswith("target forward 8000 tok/s, drafter step 10000 tok/s; bound by the target")
