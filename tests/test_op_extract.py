"""extract (ops/extract): real tiny Llama target, real files, real subprocesses.

The helpers here (make_target, make_prepared, run_extract) are reused by
tests/test_op_verify.py.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from safetensors.numpy import save_file as save_numpy  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from ops.common import run_main  # noqa: E402
from ops.extract import batching  # noqa: E402
from ops.extract.__main__ import main as extract_main  # noqa: E402
from ops.formats import DATA_CONFIG, sample_path  # noqa: E402
from tests.conftest import ranks_abort_at_exit, wait_for  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
NUM_LAYERS = 8
AUX = [1, 3, 4]   # default_aux_layers(8)


def make_target(path: Path, hidden: int = 32, layers: int = NUM_LAYERS, seed: int = 0) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=100, hidden_size=hidden, intermediate_size=2 * hidden,
                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=512, tie_word_embeddings=False)
    LlamaForCausalLM(cfg).save_pretrained(path)
    return path


def make_prepared(path: Path, n: int, min_len: int = 4, max_len: int = 60, seed: int = 0) -> Path:
    """prepare's output contract, written directly: flat ids/mask + offsets + summary."""
    rng = np.random.default_rng(seed)
    lens = rng.integers(min_len, max_len + 1, size=n)
    offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    total = int(offsets[-1])
    path.mkdir(parents=True, exist_ok=True)
    save_numpy({"input_ids": rng.integers(0, 100, size=total).astype(np.int32),
                "loss_mask": (rng.random(total) < 0.6).astype(np.uint8),
                "offsets": offsets}, str(path / "samples.safetensors"))
    (path / "summary.json").write_text(json.dumps({"status": "complete", "samples": n, "total_tokens": total,
                                                   "max_seq_len": max_len}))
    return path


def extract_argv(target: Path, prepared: Path, out: Path, *extra: str) -> list[str]:
    return ["--target", str(target), "--input", str(prepared), "--output", str(out),
            "--progress-interval", "0.5", *extra]


def run_extract_subprocess(argv: list[str], **kw) -> subprocess.Popen:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    return subprocess.Popen([sys.executable, "-m", "ops.extract", *argv], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("extract")
    return make_target(root / "target"), make_prepared(root / "prep", n=24)


def test_captured_states_are_hf_hidden_states_at_canonical_layers(tiny, tmp_path, capsys):
    target, prepared = tiny
    out = tmp_path / "out"
    # A budget of 150 padded tokens puts 2-3 samples in a batch: padding must not leak.
    assert run_main(extract_main, extract_argv(target, prepared, out, "--token-budget", "150")) == 0
    log = capsys.readouterr().out
    assert "progress: samples 24/24 tokens" in log
    assert "samples, " in log and "tok/s." in log

    config = json.loads((out / DATA_CONFIG).read_text())
    assert config["status"] == "complete"
    assert config["layer_ids"] == AUX
    assert config["hf_hidden_states_indices"] == [2, 4, 5]
    assert config["sglang_layers_to_capture"] == [2, 4, 5]
    assert config["vllm_eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]
    assert config["final_hidden_state"] == "post_norm"
    assert (config["hidden_size"], config["dtype"], config["total_samples"]) == (32, "float32", 24)
    lengths = json.loads((out / "sample_lengths.json").read_text())
    assert config["total_tokens"] == sum(lengths.values())

    model = transformers.AutoModelForCausalLM.from_pretrained(str(target)).eval()
    for idx in range(24):
        data = load_file(str(sample_path(out, idx)))
        ids = data["input_ids"]
        assert ids.dtype == torch.int64 and data["loss_mask"].dtype == torch.uint8
        assert data["aux_hidden_states"].shape == (len(ids), 3 * 32)
        assert len(ids) == lengths[str(idx)]
        with torch.no_grad():
            ref = model(ids[None], output_hidden_states=True)
        for j, k in enumerate(AUX):
            torch.testing.assert_close(data["aux_hidden_states"][:, 32 * j:32 * (j + 1)],
                                       ref.hidden_states[k + 1][0], atol=1e-5, rtol=1e-4)
        with torch.no_grad():
            logits = model.lm_head(data["final_hidden_states"])
        torch.testing.assert_close(logits, ref.logits[0], atol=1e-5, rtol=1e-4)


def test_an_unpadded_batch_passes_no_mask_and_gets_the_same_states(tiny, tmp_path, capsys, monkeypatch):
    """Equal lengths: the forward runs without an attention mask (no device
    sync for transformers' all-ones check) and the states are still the
    reference forward's."""
    from ops.target_model.capture import HiddenStateCapture

    target, _ = tiny
    prepared = make_prepared(tmp_path / "prep", n=6, min_len=20, max_len=20, seed=3)
    masks = []
    real_call = HiddenStateCapture.__call__

    def spy(self, input_ids, attention_mask):
        masks.append(attention_mask)
        return real_call(self, input_ids, attention_mask)

    monkeypatch.setattr(HiddenStateCapture, "__call__", spy)
    out = tmp_path / "out"
    assert run_main(extract_main, extract_argv(target, prepared, out, "--token-budget", "60")) == 0
    assert len(masks) == 2 and all(m is None for m in masks)
    model = transformers.AutoModelForCausalLM.from_pretrained(str(target)).eval()
    for idx in range(6):
        data = load_file(str(sample_path(out, idx)))
        with torch.no_grad():
            ref = model(data["input_ids"][None], output_hidden_states=True)
        for j, k in enumerate(AUX):
            torch.testing.assert_close(data["aux_hidden_states"][:, 32 * j:32 * (j + 1)],
                                       ref.hidden_states[k + 1][0], atol=1e-5, rtol=1e-4)


def test_kill_9_halfway_then_resume_is_byte_identical(tmp_path, capsys):
    # hidden 64 and one sample a batch: slow enough on CPU to be killed halfway.
    target = make_target(tmp_path / "target", hidden=64)
    prepared = make_prepared(tmp_path / "prep", n=240, min_len=20, max_len=60, seed=1)
    opts = ("--token-budget", "60", "--writers", "2")

    # The reference and the resume in this process (a subprocess's imports cost 4 s of CPU each);
    # the run that is killed is a process of its own.
    assert run_main(extract_main, extract_argv(target, prepared, tmp_path / "ref", *opts)) == 0

    out = tmp_path / "out"
    proc = run_extract_subprocess(extract_argv(target, prepared, out, *opts))
    shard = out / "rows_0-2000"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if shard.is_dir() and len(os.listdir(shard)) >= 60:
            break
        time.sleep(0.005)
    assert proc.poll() is None, "extraction ended before it could be killed halfway"
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)
    killed_with = len([n for n in os.listdir(shard) if n.endswith(".safetensors")])
    assert 0 < killed_with < 240
    assert json.loads((out / DATA_CONFIG).read_text())["status"] == "running"

    capsys.readouterr()
    code = run_main(extract_main, extract_argv(target, prepared, out, *opts))
    log = capsys.readouterr().out
    assert code == 0, log
    assert "samples were already on disk" in log
    assert json.loads((out / DATA_CONFIG).read_text())["status"] == "complete"
    names = sorted(os.listdir(shard))
    assert not [n for n in names if n.endswith(".tmp")]
    assert names == sorted(os.listdir(tmp_path / "ref" / "rows_0-2000"))
    assert len(names) == 240
    for name in names:
        assert (shard / name).read_bytes() == (tmp_path / "ref" / "rows_0-2000" / name).read_bytes(), name


def test_preflight_refuses_a_run_that_would_fill_the_disk(tiny, tmp_path, capsys):
    target, prepared = tiny
    out = tmp_path / "out"
    code = run_main(extract_main, extract_argv(target, prepared, out, "--tokens", str(10 ** 15)))
    assert code == 2
    err = capsys.readouterr().err
    assert "refusing to start: not enough free disk space" in err and "--force" in err
    assert not (out / DATA_CONFIG).exists()   # refused before anything was written or loaded


def test_bad_inputs_get_clear_errors(tiny, tmp_path, capsys):
    target, prepared = tiny
    empty = tmp_path / "empty"
    empty.mkdir()
    assert run_main(extract_main, extract_argv(target, empty, tmp_path / "o1")) == 2
    assert f"{empty / 'samples.safetensors'}: not found" in capsys.readouterr().err

    unfinished = make_prepared(tmp_path / "unfinished", n=2)
    (unfinished / "summary.json").write_text(json.dumps({"status": "running"}))
    assert run_main(extract_main, extract_argv(target, unfinished, tmp_path / "o0")) == 2
    assert "status 'running', not 'complete'; prepare did not finish" in capsys.readouterr().err

    assert run_main(extract_main, extract_argv(target, prepared, tmp_path / "o2", "--layer-ids", "1,9")) == 2
    assert "outside the target's layers 0..7" in capsys.readouterr().err
    assert run_main(extract_main, extract_argv(target, prepared, tmp_path / "o4", "--host-batches", "0")) == 2
    assert "argument --host-batches: expected >= 1, got 0" in capsys.readouterr().err

    # An output made with other layers is not resumed into.
    out = tmp_path / "o3"
    assert run_main(extract_main, extract_argv(target, prepared, out, "--num-samples", "3")) == 0
    capsys.readouterr()
    # Re-running a finished output is a no-op that does not load the target.
    assert run_main(extract_main, extract_argv(target, prepared, out, "--num-samples", "3")) == 0
    log = capsys.readouterr().out
    assert "nothing to extract" in log and "loading target" not in log
    assert json.loads((out / DATA_CONFIG).read_text())["status"] == "complete"
    assert run_main(extract_main, extract_argv(target, prepared, out, "--num-samples", "3",
                                               "--layer-ids", "0,2,5")) == 2
    assert "the output holds other data" in capsys.readouterr().err


def test_oom_halves_the_batch_budget_and_gives_up_only_on_one_sample():
    lengths = {i: n for i, n in enumerate([50, 40, 40, 30, 20, 10, 10, 5])}
    seen: list[list[int]] = []
    logs: list[str] = []

    def forward(batch):   # a device with room for 60 padded tokens
        if len(batch) * max(lengths[i] for i in batch) > 60:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 896.00 MiB.")
        seen.append(batch)

    for batch in batching.plan_batches(list(lengths), lengths.__getitem__, 200):
        batching.run_with_oom_retry(batch, lengths.__getitem__, 200, forward,
                                    (torch.cuda.OutOfMemoryError,), logs.append)
    assert sorted(i for b in seen for i in b) == list(lengths)
    assert logs and all(line.startswith("OOM: halving token budget to ") for line in logs)

    with pytest.raises(batching.SampleTooLarge, match="sample 0 \\(50 tokens\\) alone does not fit"):
        batching.run_with_oom_retry([0, 1], lengths.__getitem__, 200,
                                    lambda b: (_ for _ in ()).throw(torch.cuda.OutOfMemoryError("oom")),
                                    (torch.cuda.OutOfMemoryError,), logs.append)


def test_plan_batches_is_length_sorted_and_within_budget():
    lengths = [5, 70, 30, 30, 12, 200]
    batches = batching.plan_batches(range(6), lengths.__getitem__, 100)
    assert batches[0] == [5]             # longer than the budget: alone
    flat = [i for b in batches for i in b]
    assert sorted(flat) == list(range(6))
    assert [lengths[i] for i in flat] == sorted(lengths, reverse=True)
    assert all(len(b) * max(lengths[i] for i in b) <= 100 for b in batches[1:])


@pytest.mark.slow
def test_torchrun_two_ranks_split_the_samples(tiny, tmp_path):
    """Two CPU ranks (gloo): each takes r::2, rank 0 finalises; same states as one process.
    The ranks never reach the interpreter's exit (tests/conftest.py: ranks_abort_at_exit)."""
    target, prepared = tiny
    single, multi = tmp_path / "single", tmp_path / "multi"
    assert run_main(extract_main, extract_argv(target, prepared, single, "--token-budget", "150")) == 0
    env = ranks_abort_at_exit(tmp_path, dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1"))
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                           "--master_port", str(29500 + os.getpid() % 1000), "-m", "ops.extract",
                           *extract_argv(target, prepared, multi, "--token-budget", "150", "--device", "cpu")],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "rank 0/2" in proc.stdout and "rank 1/2" in proc.stdout
    config = json.loads((multi / DATA_CONFIG).read_text())
    assert config["status"] == "complete" and config["world_size"] == 2
    for idx in range(24):
        a, b = load_file(str(sample_path(single, idx))), load_file(str(sample_path(multi, idx)))
        assert a.keys() == b.keys()
        for key in a:
            torch.testing.assert_close(a[key], b[key], atol=1e-5, rtol=1e-4)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_extraction_halves_the_budget_on_a_real_oom(tmp_path):
    """On a GPU: a per-process memory cap makes the first batches run out of
    memory for real; extraction halves their budget, completes, and the bf16
    states are HF's at the canonical layers (checked by verify --deep too)."""
    target = tmp_path / "target"
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=1000, hidden_size=512, intermediate_size=1024, num_hidden_layers=8,
                      num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=2048)
    LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(target)
    prepared = make_prepared(tmp_path / "prep", n=64, min_len=100, max_len=1000, seed=5)
    weights = sum(p.stat().st_size for p in target.glob("*.safetensors"))
    fraction = (weights + 160 * 2**20) / torch.cuda.get_device_properties(0).total_memory
    out = tmp_path / "out"
    proc = run_extract_subprocess(extract_argv(target, prepared, out, "--token-budget", "65536",
                                               "--memory-fraction", f"{fraction:.6f}"))
    log, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, log
    assert "OOM: halving token budget to" in log
    assert "on cuda:0" in log
    config = json.loads((out / DATA_CONFIG).read_text())
    assert config["status"] == "complete" and config["dtype"] == "bfloat16"

    model = transformers.AutoModelForCausalLM.from_pretrained(str(target), dtype=torch.bfloat16).cuda().eval()
    for idx in (0, 17, 63):
        data = load_file(str(sample_path(out, idx)))
        with torch.no_grad():
            ref = model(data["input_ids"][None].cuda(), output_hidden_states=True)
        for j, k in enumerate([1, 3, 4]):
            block = data["aux_hidden_states"][:, 512 * j:512 * (j + 1)].float()
            errs = [float(torch.linalg.norm(block - h[0].float().cpu()) / torch.linalg.norm(h[0].float().cpu()))
                    for h in ref.hidden_states]
            assert errs.index(min(errs)) == k + 1 and errs[k + 1] < 2e-2, (idx, k, errs)
    verify = subprocess.run([sys.executable, "-m", "ops.verify", "--input", str(out), "--deep", "4",
                             "--recompute", "2", "--target", str(target)],
                            cwd=REPO, capture_output=True, text=True, timeout=300)
    assert verify.returncode == 0, verify.stdout + verify.stderr


def test_spec_argv_is_what_the_program_parses():
    from ops.extract.__main__ import build_parser
    from ops.extract.spec import SPEC

    argv = SPEC.argv({"input": "p", "output": "o", "layer_ids": [2, 30, 58], "force": True,
                      "memory_fraction": 0.9}, target_path="t")
    args = build_parser().parse_args(argv[3:])
    assert (args.target, args.layer_ids, args.force, args.memory_fraction) == ("t", "2,30,58", True, 0.9)
    for key, default in SPEC.params.items():
        if default is not None and not isinstance(default, bool) and key not in ("input", "output"):
            assert str(getattr(args, key)) == str(default) or key == "layer_ids", key


@pytest.mark.parametrize("mode", ["fsync", "direct", "syncfs"])
def test_sample_files_are_durable_before_the_config_says_complete(tiny, tmp_path, capsys, monkeypatch, mode):
    """Every sample file's bytes (fsync before its rename) or the whole filesystem
    (one syncfs) reach the disk before data_config.json says complete."""
    from ops.extract import durable

    target, prepared = tiny
    out = tmp_path / "out"
    events: list[tuple[str, str]] = []
    real_fsync, real_syncfs = os.fsync, durable._syncfs

    def spy_fsync(fd):
        direct = bool(int(Path(f"/proc/self/fdinfo/{fd}").read_text().split("flags:")[1].split()[0], 8)
                      & getattr(os, "O_DIRECT", 0))
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}"), direct))
        return real_fsync(fd)

    def spy_syncfs(path):
        events.append(("syncfs", str(path), False))
        return real_syncfs(path)

    def config_status():
        cfg = out / DATA_CONFIG
        return json.loads(cfg.read_text()).get("status") if cfg.exists() else None

    import ops.common
    real_write = ops.common.write_json_atomic

    def spy_write(path, data):
        if Path(path).name == DATA_CONFIG and data.get("status") == "complete":
            events.append(("complete", str(path), False))
        return real_write(path, data)

    monkeypatch.setattr(os, "fsync", spy_fsync)
    monkeypatch.setattr(durable, "_syncfs", spy_syncfs)
    monkeypatch.setattr("ops.extract.output.write_json_atomic", spy_write)
    assert run_main(extract_main, extract_argv(target, prepared, out, "--durable", mode)) == 0
    assert config_status() == "complete"
    assert "extract: durable: " in capsys.readouterr().out
    done_at = events.index(("complete", str(out / DATA_CONFIG), False))
    before = events[:done_at]
    if mode in ("fsync", "direct"):
        synced = {Path(p).name: direct for kind, p, direct in before if kind == "fsync"}
        for idx in range(24):
            name = sample_path(out, idx).name + ".tmp"
            assert name in synced, idx
            # O_DIRECT where the filesystem takes it (tmp_path's here; not tmpfs).
            assert synced[name] == (mode == "direct" and _takes_o_direct(tmp_path)), idx
        assert "rows_0-2000" in synced and out.name in synced   # the renames
    else:
        assert ("syncfs", str(out), False) in before
        assert not [p for kind, p, _ in before if kind == "fsync" and ".safetensors" in p]


def _takes_o_direct(directory: Path) -> bool:
    try:
        fd = os.open(directory / "o_direct_probe", os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o644)
    except OSError:
        return False
    os.close(fd)
    (directory / "o_direct_probe").unlink()
    return True


@pytest.mark.slow
def test_compiled_layers_write_the_eager_states(tiny, tmp_path, capsys):
    """--compile (each decoder layer torch.compiled, the hooks inside): the
    files hold the eager forward's states, over batches of several lengths."""
    target, prepared = tiny
    eager, compiled = tmp_path / "eager", tmp_path / "compiled"
    assert run_main(extract_main, extract_argv(target, prepared, eager, "--token-budget", "150")) == 0
    assert run_main(extract_main, extract_argv(target, prepared, compiled, "--token-budget", "150",
                                               "--compile")) == 0
    log = capsys.readouterr().out
    assert f"compile: {NUM_LAYERS} decoder layers compiled" in log
    assert json.loads((compiled / DATA_CONFIG).read_text())["compiled_layers"] is True
    for idx in range(24):
        a, b = load_file(str(sample_path(eager, idx))), load_file(str(sample_path(compiled, idx)))
        assert torch.equal(a["input_ids"], b["input_ids"])
        torch.testing.assert_close(b["aux_hidden_states"], a["aux_hidden_states"], atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(b["final_hidden_states"], a["final_hidden_states"], atol=1e-5, rtol=1e-4)


def test_a_target_that_fails_to_load_leaves_no_running_data_config(tiny, tmp_path):
    """data_config.json is written before the load; a load that fails must
    not leave it saying "running" (a monitor would show a live extraction)."""
    import shutil

    target, prepared = tiny
    broken = tmp_path / "broken"
    shutil.copytree(target, broken)
    weights = next(broken.glob("*.safetensors"))
    weights.write_bytes(weights.read_bytes()[:4096])      # cut: the header says more than is there
    out = tmp_path / "out"
    # In this process, as `python -m ops.extract` runs main(): the record is what is tested.
    from ops.common import run_main
    from ops.extract.__main__ import main as extract_main

    assert run_main(extract_main, extract_argv(broken, prepared, out), prog="extract") != 0
    config = json.loads((out / DATA_CONFIG).read_text())
    assert config["status"] == "incomplete", config
    assert config["incomplete_reason"], config


def test_an_incomplete_data_config_says_why_in_its_result_line():
    from ops.extract.spec import result_line

    assert result_line({"status": "incomplete", "missing_samples": 3, "total_samples": 24,
                        "incomplete_reason": "disk full: /x: No space left on device (ENOSPC)"}) == \
        "incomplete: 3 of 24 samples missing; disk full: /x: No space left on device (ENOSPC)"
    assert result_line({"status": "incomplete"}) == "incomplete"
    assert result_line({"status": "running"}) is None


TIME_RE = re.compile(r"extract: time: ([\d.]+) s; loop: forward ([\d.]+) s, waiting for the writers ([\d.]+) s; "
                     r"writers \((\d+), summed\): waiting for the device copy ([\d.]+) s, writing ([\d.]+) s, "
                     r"idle ([\d.]+) s$", re.M)


class StepClock:
    """A clock that moves only when a test moves it, standing in for time.perf_counter
    and time.monotonic in the modules that time an extraction: every second the
    closing line counts is then one the test put in, wherever it put it."""

    def __init__(self) -> None:
        self._now = 1000.0      # perf_counter is never 0: the writer reads a 0 as "not taken"
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += seconds


@pytest.mark.parametrize("slow", ["disk", "forward"])
def test_the_closing_time_line_says_whether_the_disk_or_the_forward_bounds_the_run(tiny, tmp_path, capsys,
                                                                                     monkeypatch, slow):
    """What an operator reads to know whether more writers (or a faster disk)
    or a faster target would help: a slow disk shows as the writers writing
    while the loop waits for them; a slow forward as the loop's forward time,
    the loop not waiting. The slow part takes `pause` on a clock only it moves,
    so each figure is exactly what the line should attribute to it."""
    from ops.extract import hf_engine, loop, progress, staging, writer

    target, prepared = tiny
    pause, n = 0.5, 24
    clock = StepClock()
    forwards: list[int] = []        # samples per forward
    for module in (loop, writer, staging, progress):
        monkeypatch.setattr(module, "time", SimpleNamespace(perf_counter=clock, monotonic=clock))
    if slow == "disk":
        # The loop blocks on the one slab the writer holds: a write takes its pause
        # while the loop waits for that slab, or once the loop has nothing left to
        # submit (the last batch's samples, which nothing waits on).
        state = {"waiting": False, "done": False}
        waited: list[bool] = []        # per write: whether the loop was waiting during its pause

        class WatchedCondition(threading.Condition):
            def wait(self, timeout=None):
                state["waiting"] = True
                try:
                    return super().wait(timeout)
                finally:
                    state["waiting"] = False

        monkeypatch.setattr(staging, "threading", SimpleNamespace(Lock=threading.Lock, Condition=WatchedCondition))
        real_write, real_close = writer.write_image, writer.SampleWriter.close

        def slow_write(*a, **kw):
            wait_for(lambda: state["waiting"] or state["done"], timeout=60, poll=0.005)
            waited.append(state["waiting"])
            clock.advance(pause)
            return real_write(*a, **kw)

        def close(self):
            state["done"] = True
            return real_close(self)

        monkeypatch.setattr(writer, "write_image", slow_write)
        monkeypatch.setattr(writer.SampleWriter, "close", close)
    else:
        # A forward takes its pause once the writer is through the previous sample
        # (its slab back in the pool), so no write is timed across a pause.
        real_forward, real_put, released = hf_engine.HFTarget.forward, staging.SlabPool._put, []

        def put(self, slab):
            real_put(self, slab)
            released.append(1)

        def slow_forward(self, tokens):
            wait_for(lambda: len(released) >= len(forwards), timeout=60, poll=0.005)
            forwards.append(len(tokens))
            clock.advance(pause)
            return real_forward(self, tokens)

        monkeypatch.setattr(staging.SlabPool, "_put", put)
        monkeypatch.setattr(hf_engine.HFTarget, "forward", slow_forward)
    out = tmp_path / "out"
    # One sample a batch (a budget below every sample), one writer, one slab.
    argv = extract_argv(target, prepared, out, "--token-budget", "1", "--writers", "1", "--queue-size", "1",
                        "--host-batches", "1")
    assert run_main(extract_main, argv) == 0
    m = TIME_RE.search(capsys.readouterr().out)
    assert m, "no closing time line"
    elapsed, forward, waiting, threads, copy_wait, writing, idle = (float(g) for g in m.groups())
    assert threads == 1 and copy_wait == 0         # CPU: no device copy to wait for
    assert elapsed == n * pause
    if slow == "disk":
        # Every write's pause is the writers'; the loop waited out all but the last batch's.
        assert waited == [True] * (n - 1) + [False], waited
        assert (forward, waiting, writing, idle) == (0, (n - 1) * pause, n * pause, 0)
    else:
        assert forwards == [1] * n and elapsed == n * pause
        assert (forward, waiting, writing, idle) == (n * pause, 0, 0, n * pause)
