"""ops.train on a tiny learnable target: the drafter learns, the TTT unroll
equals incremental decoding, DDP over 2 gloo ranks matches 1 rank at the same
global batch, resume continues the loss curve, bad inputs get clear errors."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ranks_abort_at_exit

torch = pytest.importorskip("torch")


ROOT = Path(__file__).resolve().parent.parent
torch.set_num_threads(1)     # the test machine's cores are shared; threads only contend


def train_argv(assets, out, *extra):
    return ["--data", str(assets["data"]), "--vocab", str(assets["vocab"]), "--target", str(assets["target"]),
            "--output", str(out), "--workers", "0", "--lr", "3e-3", "--token-budget", "256",
            "--ttt-steps", "3", "--log-every", "1", "--warmup-ratio", "0", *extra]


def run_train(argv) -> int:
    from ops.train.__main__ import main

    return main(argv)


def metrics(out: Path) -> dict[int, dict]:
    """step -> the last record written for it."""
    recs = {}
    for line in (out / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        recs[rec["step"]] = rec
    return recs


def test_loss_decreases_and_progress_lines(assets, tmp_path, capsys):
    out = tmp_path / "run"
    assert run_train(train_argv(assets, out, "--epochs", "3", "--save-every", "1000")) == 0
    recs = metrics(out)
    steps = sorted(recs)
    # 64 samples of 12..40 tokens in 256-token batches: 8 batches an epoch.
    assert steps == list(range(1, 25)) and recs[24]["total"] == 24
    first = sum(recs[s]["loss"] for s in steps[:3]) / 3
    last = sum(recs[s]["loss"] for s in steps[-3:]) / 3
    assert last < 0.7 * first, (first, last)
    assert recs[steps[-1]]["acc"][0] > recs[steps[0]]["acc"][0] + 0.2
    printed = capsys.readouterr().out
    line = re.compile(r"^progress: step (\d+)/24 loss [\d.]+ acc \[[\d.]+,[\d.]+,[\d.]+\] tok/s \d+ lr [\d.e+-]+",
                      re.M)
    assert len(line.findall(printed)) == 24
    ck = out / "checkpoints" / "step_00000024"
    assert (ck / "model.safetensors").exists() and (ck / "meta.json").exists()
    assert not list((out / "checkpoints").glob("*.tmp-*"))
    assert not prefetch_threads()


def prefetch_threads() -> list:
    import threading

    return [t for t in threading.enumerate() if t.name == "device-prefetch"]


@pytest.mark.parametrize("workers", ["0", "1"])
def test_a_shard_failing_mid_run_is_one_error_line_exit_2_and_leaves_no_thread(assets, tmp_path, workers, capsys):
    """The batches are read in the prefetcher's thread (in a DataLoader worker
    with --workers 1): the loader's error reaches the training thread, which
    ends with exit 2 and one line naming the file (not a traceback), and the
    thread is stopped on the way out."""
    data = tmp_path / "hs"
    shutil.copytree(assets["data"], data)
    victim = sorted(data.glob("rows_*/data_*.safetensors"))[5]
    victim.write_bytes(victim.read_bytes()[:200])
    argv = train_argv(assets, tmp_path / "out", "--epochs", "1")
    argv[argv.index("--data") + 1] = str(data)
    argv[argv.index("--workers") + 1] = workers
    assert run_train(argv) == 2
    err = capsys.readouterr().err
    assert f"error: {victim}: unreadable" in err and "Traceback" not in err, err
    assert not prefetch_threads()


def test_ttt_unroll_equals_incremental_chain(assets):
    """Step k of the training unroll at index t = drafting k+1 tokens after
    position t with a KV cache (prefix from the target's states, then own states)."""
    from ops.drafter.config import from_target
    from ops.drafter.data import collate, load_sample, read_data
    from ops.drafter.model import DraftCache, Eagle3Drafter
    from ops.drafter.target_head import load_target_head
    from ops.drafter.vocab import load_vocab

    info = read_data(assets["data"])
    head = load_target_head(assets["target"])
    vocab = load_vocab(assets["vocab"])
    torch.manual_seed(0)
    model = Eagle3Drafter(from_target(assets["target"], vocab.size, info.layer_ids)).eval()
    model.init_from_target(head.lm_head, vocab.d2t, vocab.t2d)
    batch = collate([load_sample(info.samples[0], info.hidden_size, 64)])
    ids, aux = batch["input_ids"], batch["aux"]
    steps = 4
    with torch.no_grad():
        ttt = [lg for _, lg in model.unroll(ids, aux, head.embed, steps)]
        for t in (0, 5, ids.shape[1] - steps - 2):
            cache = DraftCache()
            emb = torch.nn.functional.embedding(ids[:, 1:t + 2], head.embed)
            out, logits = model.extend(emb, aux[:, :t + 1], 0, cache, fuse=True)
            hidden = out[:, -1:]
            torch.testing.assert_close(logits[:, -1], ttt[0][:, t], atol=1e-4, rtol=1e-4)
            for k in range(1, steps):
                emb = torch.nn.functional.embedding(ids[:, t + k + 1:t + k + 2], head.embed)
                hidden, logits = model.extend(emb, hidden, t + k, cache, fuse=False)
                torch.testing.assert_close(logits[:, -1], ttt[k][:, t], atol=1e-4, rtol=1e-4)


def test_target_head_sharded_and_tied(tmp_path):
    """Only embed / final norm / lm_head are read, through the index of a sharded
    checkpoint; tied embeddings give lm_head = embed."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from ops.drafter.target_head import load_target_head

    for tie in (False, True):
        cfg = LlamaConfig(hidden_size=32, num_attention_heads=2, num_hidden_layers=2, intermediate_size=64,
                          vocab_size=50, tie_word_embeddings=tie)
        model = LlamaForCausalLM(cfg)
        d = tmp_path / f"tie{tie}"
        model.save_pretrained(d, max_shard_size="20KB")
        assert (d / "model.safetensors.index.json").exists()
        head = load_target_head(d)
        assert head.tied is tie
        torch.testing.assert_close(head.embed, model.model.embed_tokens.weight.detach())
        torch.testing.assert_close(head.lm_head, model.lm_head.weight.detach())
        torch.testing.assert_close(head.norm, model.model.norm.weight.detach())


def test_bad_inputs_get_specific_errors(assets, tmp_path, capsys):
    data = tmp_path / "hs"
    shutil.copytree(assets["data"], data)
    cfg = json.loads((data / "data_config.json").read_text())
    (data / "data_config.json").write_text(json.dumps(dict(cfg, status="running")))
    argv = train_argv(assets, tmp_path / "out")
    argv[argv.index("--data") + 1] = str(data)
    assert run_train(argv) == 2
    err = capsys.readouterr().err
    assert "data_config.json" in err and "'running'" in err

    vocab = tmp_path / "vocab"
    vocab.mkdir()
    from safetensors.torch import save_file
    save_file({"d2t": torch.zeros(4, dtype=torch.long), "t2d": torch.zeros(10, dtype=torch.bool)},
              str(vocab / "vocab.safetensors"))
    argv = train_argv(assets, tmp_path / "out")
    argv[argv.index("--vocab") + 1] = str(vocab)
    assert run_train(argv) == 2
    err = capsys.readouterr().err
    assert "vocab.safetensors" in err and "t2d covers 10 ids" in err and "96" in err


def test_resume_continues_the_loss_curve(assets, tmp_path):
    whole, sliced = tmp_path / "whole", tmp_path / "sliced"
    common = ("--max-steps", "10", "--save-every", "1000")
    assert run_train(train_argv(assets, whole, *common)) == 0
    assert run_train(train_argv(assets, sliced, *common, "--stop-at", "4")) == 0
    assert [s for s, _ in __import__("ops.drafter.checkpoint", fromlist=["x"]).list_checkpoints(sliced)] == [4]
    # A torn checkpoint (crash mid-write) is never picked up.
    (sliced / "checkpoints" / "step_00000009.tmp-1").mkdir()
    assert run_train(train_argv(assets, sliced, *common, "--resume")) == 0
    a, b = metrics(whole), metrics(sliced)
    assert sorted(b) == list(range(1, 11))
    for step in range(1, 11):
        assert b[step]["loss"] == pytest.approx(a[step]["loss"], rel=1e-4, abs=1e-5), step


def test_two_gloo_ranks_match_one_rank_at_the_same_global_batch(assets, tmp_path):
    """2 ranks x 1 micro-batch (torchrun, DDP over gloo) vs 1 rank x 2
    accumulated micro-batches: same batches per step, so the same losses up to
    float reduction order. Tolerance: 1e-3 relative per step over 6 steps.
    The ranks never reach the interpreter's exit, where a teardown that aborts
    (tests/conftest.py: ranks_abort_at_exit) would fail a run whose work is done."""
    one, two = tmp_path / "one", tmp_path / "two"
    common = ("--max-steps", "6", "--save-every", "1000")
    assert run_train(train_argv(assets, one, *common, "--grad-accum", "2")) == 0
    env = ranks_abort_at_exit(tmp_path, dict(os.environ, OMP_NUM_THREADS="1"))
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           "-m", "ops.train", *train_argv(assets, two, *common)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "2 rank(s) x accum 1" in proc.stdout
    a, b = metrics(one), metrics(two)
    assert sorted(a) == sorted(b) == list(range(1, 7))
    for step in a:
        assert b[step]["loss"] == pytest.approx(a[step]["loss"], rel=1e-3), step
        assert b[step]["counted"] == a[step]["counted"]
    from safetensors.torch import load_file
    wa = load_file(str(one / "checkpoints" / "step_00000006" / "model.safetensors"))
    wb = load_file(str(two / "checkpoints" / "step_00000006" / "model.safetensors"))
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], atol=2e-4, rtol=1e-3)


@pytest.mark.parametrize("stage", ["train", "export", "bench"])
def test_spec_params_are_the_programs_flags(stage):
    """Every param the console may pass (defaults included) parses as a flag of
    the program, and importing the spec pulls in no torch."""
    import importlib

    from ops import get_spec

    spec = get_spec(stage)
    required = {k: f"/x/{k}" for k in spec.missing_params({})}
    argv = spec.argv(required, target_path="/x/target")
    main_mod = importlib.import_module(f"ops.{stage}.__main__")
    args = main_mod.parse_args(argv[3:])
    for key, value in required.items():
        assert getattr(args, key) == value
    code = f"import sys, ops.{stage}.spec; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT).returncode == 0


def test_chunked_loss_and_fused_adamw_follow_the_default_loss_curve(assets, tmp_path):
    """ops.train --loss chunked --fused-adamw (issue 11's speed levers) trains the
    same run as the defaults, step for step (fp32 on the CPU: rounding only)."""
    common = ("--max-steps", "6", "--save-every", "1000")
    assert run_train(train_argv(assets, tmp_path / "default", *common)) == 0
    assert run_train(train_argv(assets, tmp_path / "levers", *common, "--loss", "chunked", "--fused-adamw", "on")) == 0
    a, b = metrics(tmp_path / "default"), metrics(tmp_path / "levers")
    assert sorted(a) == sorted(b) == list(range(1, 7))
    for step in a:
        assert b[step]["loss"] == pytest.approx(a[step]["loss"], rel=1e-4, abs=1e-5), step
        assert b[step]["acc"] == pytest.approx(a[step]["acc"], abs=1e-3), step
        assert b[step]["counted"] == a[step]["counted"]


def test_compiled_bucketed_run_trains_and_says_its_levers(assets, tmp_path, capsys, monkeypatch):
    """ops.train with what CUDA runs by default, on the CPU: the compiled step
    (aot_eager here: dynamo's capture and autograd's split, no code
    generation), the chunked loss, fused AdamW and 64-token length buckets."""
    from ops.drafter import model as model_mod

    monkeypatch.setattr(model_mod, "COMPILE_BACKEND", "aot_eager")
    monkeypatch.setattr(model_mod, "_COMPILED", {})
    out = tmp_path / "run"
    argv = train_argv(assets, out, "--max-steps", "4", "--save-every", "1000", "--compile", "on",
                      "--loss", "chunked", "--fused-adamw", "on", "--length-bucket", "64")
    assert run_train(argv) == 0
    said = capsys.readouterr().out
    assert "ttt attention mask, loss chunked, fused AdamW on, compile on, length bucket 64" in said
    assert " 16 batches," in said        # 64 samples, 4 rows of 64 tokens a batch (8 unbucketed)
    recs = metrics(out)
    assert sorted(recs) == [1, 2, 3, 4]
    # 256-token budget / 64-token bucket: 4 rows a batch, 12..40-token samples
    assert all(0 < sum(r["counted"][:1]) <= 4 * 40 for r in recs.values())
    assert all(r["loss"] == r["loss"] for r in recs.values())          # finite, not NaN
