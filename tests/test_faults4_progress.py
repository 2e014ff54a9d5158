"""Issue 37 (fault battery 4): progress, rate, ETA and the disk projection of an
extraction follow tokens (samples come longest first); a custom stage's live
progress is its run's own; extract's exact estimate counts num_samples; verify's
recompute allows for the storage format's own error; and the pre-launch checks
(--force, the target, layer_ids against an existing output).

Real files and processes; every clock is injected (ShardMonitor.refresh(now=)).
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from eagle3_console.monitor.disk import DiskMonitor
from eagle3_console.monitor.shards import ShardMonitor, fraction
from tests.conftest import STAGES, stage_cmd, wait_for

H = 4


def sample(path: Path, tokens: int, mtime: float | None = None) -> None:
    """One sample as extract writes it (*.tmp, then renamed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    save_file({"input_ids": np.arange(tokens, dtype=np.int64), "loss_mask": np.ones(tokens, dtype=np.uint8),
               "aux_hidden_states": np.zeros((tokens, 3 * H), dtype=np.float16),
               "final_hidden_states": np.zeros((tokens, H), dtype=np.float16)}, str(tmp))
    os.rename(tmp, path)
    if mtime is not None:
        os.utime(path, (mtime, mtime))


def longest_first(n: int) -> list[int]:
    """Sample lengths as extract takes them: the longest first (a long tail of short ones)."""
    return sorted((int(8 + 600 / (1 + i)) for i in range(n)), reverse=True)


# ---------------------------------------------------------------- M1: tokens, not samples
def test_progress_eta_and_projection_follow_tokens_when_samples_come_longest_first(tmp_path):
    out = tmp_path / "hs"
    out.mkdir()
    (out / "data_config.json").write_text(json.dumps({"status": "running", "total_samples": 100}))
    lengths = longest_first(100)
    total = sum(lengths)
    mon = ShardMonitor(out, expected_samples=100, expected_tokens=total, window_s=60)
    t0 = 1_000_000.0
    # The first pass finds nothing yet: tokens unknown, which must not blank tok/s later.
    assert mon.refresh(now=t0).tokens_done is None
    for i in range(13):
        sample(out / "rows_0-2000" / f"data_{i}.safetensors", lengths[i])
    p = mon.refresh(now=t0 + 10)
    done_tokens = sum(lengths[:13])
    assert (p.samples_done, p.tokens_done) == (13, done_tokens)
    assert fraction(p) == pytest.approx(done_tokens / total)
    assert fraction(p) > 2 * 13 / 100          # the first 13 % of samples hold far more of the tokens
    assert p.tokens_per_s == pytest.approx(done_tokens / 10)
    assert p.eta_s == pytest.approx((total - done_tokens) / (done_tokens / 10))
    # The projection: written / the token fraction, near what the whole run writes.
    usage = DiskMonitor("extract", out, index=mon.index).refresh(fraction(p), refresh_index=False)
    for i in range(13, 100):
        sample(out / "rows_0-2000" / f"data_{i}.safetensors", lengths[i])
    final = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    assert usage.projected_bytes is not None and 0.8 * final <= usage.projected_bytes <= 1.25 * final
    p = mon.refresh(now=t0 + 20)
    assert fraction(p) == 1.0 and p.eta_s == 0.0 or p.eta_s == pytest.approx(0.0)


def test_without_a_token_count_progress_stays_in_samples(tmp_path):
    for i, n in enumerate([50, 40, 30, 20]):
        sample(tmp_path / "rows_0-2000" / f"data_{i}.safetensors", n)
    p = ShardMonitor(tmp_path, expected_samples=8).refresh(now=time.time())
    assert fraction(p) == pytest.approx(4 / 8)


def test_tokens_per_s_after_a_first_pass_that_found_no_sample(tmp_path):
    from eagle3_console.monitor.rate import RateWindow

    w = RateWindow(60)
    assert w.observe(100.0, 0, None) is None
    assert w.observe(110.0, 5, 3000) == (pytest.approx(0.5), pytest.approx(300.0))
    # An observation that knew no tokens with samples done stays unknown.
    w = RateWindow(60)
    w.observe(100.0, 3, None)
    assert w.observe(110.0, 5, 3000)[1] is None


def extract_ws(ws, lengths: list[int], params: str = "", prep_len: int = 256) -> Path:
    """An extract stage over a prepare output written by hand (samples.safetensors + summary.json)."""
    ws.write(f"""
        [target]
        path = "models/target"
        num_layers = 8
        hidden_size = {H}
        dtype = "float16"

        [stages.extract]
        op = "extract"
        params = {{ input = "data/prepared", output = "data/hs", max_seq_len = {prep_len}{params} }}
    """)
    prep = ws.root / "data" / "prepared"
    prep.mkdir(parents=True)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    save_file({"input_ids": np.zeros(int(offsets[-1]), dtype=np.int32),
               "loss_mask": np.ones(int(offsets[-1]), dtype=np.uint8), "offsets": offsets},
              str(prep / "samples.safetensors"))
    (prep / "summary.json").write_text(json.dumps({"status": "complete", "samples": len(lengths),
                                                   "total_tokens": int(offsets[-1]), "max_seq_len": prep_len}))
    return ws.root / "data" / "hs"


def test_status_shows_the_token_fraction_and_projects_the_disk_from_it(ws):
    lengths = longest_first(100)
    out = extract_ws(ws, lengths)
    out.mkdir(parents=True)
    (out / "data_config.json").write_text(json.dumps({"status": "running", "total_samples": 100}))
    for i in range(13):
        sample(out / "rows_0-2000" / f"data_{i}.safetensors", lengths[i])
    snap = json.loads(ws.call("status", "--json", "--no-gpus").stdout)
    st = next(s for s in snap["stages"] if s["name"] == "extract")
    disk = next(d for d in snap["disk"] if d["stage"] == "extract")
    frac = sum(lengths[:13]) / sum(lengths)
    assert st["progress"] == pytest.approx(frac)
    assert st["shards"]["tokens_expected"] == sum(lengths)
    assert disk["projected_bytes"] == int(disk["written_bytes"] / frac)
    # The table says which count its percentage is of (13/100 next to 51.9 % read as a contradiction).
    assert f"{100 * frac:.1f}% of tokens (13/100 samples)" in ws.call("status", "--no-gpus").stdout
    # What the whole run writes: within a quarter of the projection (the samples' count gave 2.4-4x).
    assert disk["projected_bytes"] <= 1.25 * disk["estimate_bytes"] + 100 * 400


# ---------------------------------------------------------------- Q35: num_samples in the exact estimate
def test_the_exact_estimate_counts_num_samples_and_max_seq_len(ws):
    lengths = [300, 20, 50, 120, 7] * 20           # 100 samples, prepare cut nothing at 512
    extract_ws(ws, lengths, ", num_samples = 12, format = \"int4\"", prep_len=512)
    snap = json.loads(ws.call("status", "--json", "--no-gpus").stdout)
    disk = next(d for d in snap["disk"] if d["stage"] == "extract")
    tokens = sum(lengths[:12])
    assert disk["estimate_kind"] == "exact"
    assert disk["estimate_bytes"] == tokens * 4 * H // 2
    assert f"{tokens:,} tokens (the first 12 samples" in disk["estimate_basis"]
    toml = ws.root / "eagle3.toml"
    toml.write_text(toml.read_text().replace("max_seq_len = 512", "max_seq_len = 100"))
    disk = next(d for d in json.loads(ws.call("status", "--json", "--no-gpus").stdout)["disk"]
                if d["stage"] == "extract")
    assert disk["estimate_bytes"] == sum(min(n, 100) for n in lengths[:12]) * 4 * H // 2
    assert "cut at max_seq_len 100" in disk["estimate_basis"]


# ---------------------------------------------------------------- M6: a custom stage's own progress
def custom(ws, argv: str) -> Path:
    ws.write(f"""
        [stages.bins]
        argv = {argv}
        outputs = ["out/bins"]
        expected_samples = 40
        sample_glob = "sample_*.bin"
    """)
    out = ws.root / "out" / "bins"
    out.mkdir(parents=True)
    old = time.time() - 3600
    for i in range(41):         # a previous run's files (one more than this run makes)
        (out / f"sample_{i}.bin").write_bytes(b"x" * 16)
        os.utime(out / f"sample_{i}.bin", (old, old))
    return out


def end_run(ws, stage: str) -> None:
    """End what the test started: the run's process group, by its recorded pgid."""
    run = ws.latest(stage)
    if run is not None and run.pgid and run.status in ("running", "pending"):
        try:
            os.killpg(run.pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        ws.wait_status(stage, ("failed", "killed", "lost", "succeeded"), timeout=30)


def stage_json(ws) -> dict:
    return json.loads(ws.call("status", "--json", "--no-gpus").stdout)["stages"][0]


def test_a_rerun_counts_its_own_files_not_the_previous_runs(ws):
    out = custom(ws, stage_cmd("bins.py", "--output", "out/bins", "--n", "40", "--pause-at", "9"))
    try:
        ws.cli("run", "bins", check=0)
        wait_for(lambda: (s := stage_json(ws))["log"] and s["log"]["progress_done"] == 9, timeout=30)
        st = stage_json(ws)
        assert st["progress"] == pytest.approx(9 / 40)
        assert (st["shards"]["samples_done"], st["shards"]["samples_expected"]) == (9, 40)
        text = ws.call("status", "--no-gpus").stdout
        assert "22.5%" in text and "(9/40)" in text and "(41/40)" not in text
        (out / "go").touch()
        ws.wait_status("bins", ("succeeded",))
        assert stage_json(ws)["progress"] == 1.0
    finally:
        (out / "go").touch()
        end_run(ws, "bins")


def test_a_failed_rerun_reads_what_it_wrote_not_100_percent(ws):
    # bins.py writes 6 of the 40 files, then the run fails.
    code = (f"import runpy, sys; sys.argv = ['bins', '--output', 'out/bins', '--n', '6']; "
            f"runpy.run_path({str(STAGES / 'bins.py')!r}, run_name='__main__'); sys.exit(1)")
    custom(ws, json.dumps(["python", "-c", code]))
    try:
        ws.cli("run", "bins", check=0)
        ws.wait_status("bins", ("failed",))
        st = stage_json(ws)
        assert st["status"] == "failed"
        assert st["progress"] == pytest.approx(6 / 40)
        assert st["shards"]["samples_done"] == 6
        assert "100.0%" not in ws.call("status", "--no-gpus").stdout
        # The run's own count is no fraction of the folder's bytes (the old files are in them):
        # its 6 files of 16 B at 6/40 make 640 B, what is there already.
        disk = json.loads(ws.call("status", "--json", "--no-gpus").stdout)["disk"][0]
        assert disk["written_bytes"] == 41 * 16 and disk["projected_bytes"] == 41 * 16
    finally:
        end_run(ws, "bins")


# ---------------------------------------------------------------- Q29: verify allows for the format's own error
def test_verify_recompute_passes_an_untouched_int4_extraction_of_close_layers(tmp_path, capsys):
    """A target whose layers each add little to the residual stream (as a trained
    one: the demo's are 0.16-0.3 apart): int4's own error (0.12-0.15) is as large
    as half a neighbour's distance, so the neighbour check must take it out."""
    torch = pytest.importorskip("torch")
    import shutil

    from transformers import AutoModelForCausalLM

    from ops.common import run_main
    from ops.extract.__main__ import main as extract_main
    from ops.verify.__main__ import main as verify_main
    from tests.test_op_extract import extract_argv, make_prepared, make_target

    target = make_target(tmp_path / "target", hidden=64)
    model = AutoModelForCausalLM.from_pretrained(str(target))
    with torch.no_grad():
        for layer in model.model.layers:
            layer.mlp.down_proj.weight.mul_(0.5)
            layer.self_attn.o_proj.weight.mul_(0.5)
    model.save_pretrained(target)
    prepared = make_prepared(tmp_path / "prep", n=10, seed=5)
    out = tmp_path / "int4"
    assert run_main(extract_main, extract_argv(target, prepared, out, "--format", "int4",
                                               "--token-budget", "150")) == 0
    pristine = tmp_path / "pristine"
    shutil.copytree(out, pristine)
    report = tmp_path / "ok.json"
    code = run_main(verify_main, ["--input", str(out), "--deep", "10", "--recompute", "6",
                                  "--target", str(target), "--report", str(report)])
    text = capsys.readouterr().out
    assert code == 0, text
    assert json.loads(report.read_text())["bad_files"] == []
    # Still caught: the ids recorded one off (the states of layer k named k + 1).
    config = json.loads((out / "data_config.json").read_text())
    config["layer_ids"] = [k + 1 for k in config["layer_ids"]]
    (out / "data_config.json").write_text(json.dumps(config))
    code = run_main(verify_main, ["--input", str(out), "--deep", "3", "--recompute", "2",
                                  "--target", str(target), "--report", str(tmp_path / "bad.json")])
    assert code == 1
    bad = json.loads((tmp_path / "bad.json").read_text())["bad_files"]
    assert len(bad) == 2 and all("matches layer" in b["reason"] for b in bad)


# ---------------------------------------------------------------- minors
def test_bf16_format_on_a_float32_target_says_what_is_written(ws):
    out = extract_ws(ws, [10, 8])
    toml = ws.root / "eagle3.toml"
    toml.write_text(toml.read_text().replace('dtype = "float16"', 'dtype = "float32"'))
    out.mkdir(parents=True)
    (out / "data_config.json").write_text(json.dumps({
        "status": "complete", "total_samples": 2, "total_tokens": 18, "dtype": "float32", "format": "bf16",
        "layer_ids": [1, 3, 4], "final_layer_id": 7, "sglang_layers_to_capture": [2, 4, 5]}))
    for i, n in enumerate([10, 8]):
        sample(out / "rows_0-2000" / f"data_{i}.safetensors", n)
    snap = json.loads(ws.call("status", "--json", "--no-gpus").stdout)
    st = next(s for s in snap["stages"] if s["name"] == "extract")
    assert st["shards"]["format"] == "bf16 (stored as computed: float32)"
    assert st["result_line"].endswith("format bf16 (stored as computed: float32)")
    plan = ws.cli("run", "extract", "--dry-run").stdout
    assert "disk by format (exact): bf16 (as computed: float32) " in plan


def test_force_never_launches_layer_ids_the_target_cannot_have(ws):
    extract_ws(ws, [10, 8], ", layer_ids = [2, 4, 8]")
    (ws.root / "models" / "target").mkdir(parents=True)
    try:
        for extra in ((), ("--force",)):
            proc = ws.cli("run", "extract", "--ignore-disk", *extra)
            assert proc.returncode == 3, (proc.stdout, proc.stderr)
            assert "layer_ids" in proc.stderr and "Traceback" not in proc.stderr
        assert ws.latest("extract") is None
    finally:
        end_run(ws, "extract")      # a launch this test refuses: none, unless it fails


def test_run_refuses_a_target_that_is_not_there_in_one_line(ws):
    extract_ws(ws, [10, 8])
    try:
        proc = ws.cli("run", "extract", "--force", "--ignore-disk")
        assert proc.returncode == 3, (proc.stdout, proc.stderr)
        said = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
        assert len(said) == 1
        assert f"[target].path {ws.root / 'models' / 'target'}: no such checkpoint folder" in said[0]
        assert ws.latest("extract") is None
    finally:
        end_run(ws, "extract")


def test_the_plan_refuses_other_layer_ids_than_the_output_holds(ws):
    out = extract_ws(ws, [10, 8], ", layer_ids = [1, 3, 5]")
    (ws.root / "models" / "target").mkdir(parents=True)
    out.mkdir(parents=True)
    (out / "data_config.json").write_text(json.dumps({"status": "running", "layer_ids": [1, 3, 4],
                                                      "total_samples": 2}))
    try:
        proc = ws.cli("run", "extract", "--ignore-disk", "--force")
        assert proc.returncode == 3, (proc.stdout, proc.stderr)
        assert "the output holds aux layers [1, 3, 4] (canonical), this run would capture [1, 3, 5]" in proc.stderr
        assert ws.latest("extract") is None
    finally:
        end_run(ws, "extract")


def test_a_plain_counter_gets_a_rate_and_an_eta(ws):
    ws.write(f"""
        [stages.bins]
        argv = {stage_cmd("bins.py", "--output", "out/bins", "--n", "40", "--pause-at", "21")}
        outputs = ["out/bins"]
        expected_samples = 40
    """)
    out = ws.root / "out" / "bins"
    try:
        ws.cli("run", "bins", check=0)
        wait_for(lambda: (s := stage_json(ws))["log"] and s["log"]["progress_done"] == 21, timeout=30)
        st = stage_json(ws)
        assert st["progress"] == pytest.approx(21 / 40)
        assert st["rate"] is not None and st["rate"] > 0
        assert st["eta_s"] == pytest.approx(19 / st["rate"])
    finally:
        out.mkdir(parents=True, exist_ok=True)
        (out / "go").touch()
        end_run(ws, "bins")


def test_the_log_pane_counts_one_error_line_in_the_singular():
    import asyncio

    from textual.app import App

    from eagle3_console.kernel.model import LogState
    from eagle3_console.tui.panes.log import LogPane

    class Host(App):
        def compose(self):
            yield pane

    pane = LogPane()

    async def main():
        async with Host().run_test(size=(100, 30)) as pilot:
            pane.show("extract", 1, LogState(path="x.log", tail=["ok", "RuntimeError: CUDA out of memory"]))
            await pilot.pause()
            assert "1 error line ·" in str(pane.border_subtitle)
            pane.filter_text = "memory"
            pane._refresh_lines()
            await pilot.pause()
            assert "filter 'memory': 1 line ·" in str(pane.border_subtitle)
    asyncio.run(main())


def test_a_load_before_the_first_sample_is_no_part_of_the_rate():
    """The passes that found nothing done (the target loading) mark the start once:
    the first window's ETA counted the load's seconds as work (85 s, 13 s from the end)."""
    from eagle3_console.monitor.rate import RateWindow

    w = RateWindow(60)
    for t in (0.0, 5.0, 10.0, 15.0):
        w.observe(t, 0, None)
    assert w.observe(20.0, 10, 1000) == (pytest.approx(2.0), pytest.approx(200.0))
    # Once under way, a stall is part of the rate.
    assert w.observe(30.0, 10, 1000) == (pytest.approx(10 / 15), pytest.approx(1000 / 15))


def test_the_rate_is_of_this_run_only(tmp_path):
    """A restart's first passes: the window held the previous run's last count
    (9 at t0), so 20 files in a second read 0.18 samples/s and an ETA of 1m49s."""
    old = 1_000_000.0
    for i in range(9):
        sample(tmp_path / "rows_0-2000" / f"data_{i}.safetensors", 10, mtime=old)
    mon = ShardMonitor(tmp_path, expected_samples=40, window_s=60)
    mon.refresh(now=old + 1)
    mon.run_started = old + 55
    for i in range(9, 29):
        sample(tmp_path / "rows_0-2000" / f"data_{i}.safetensors", 10, mtime=old + 56 + (i - 9) * 0.05)
    p = mon.refresh(now=old + 57)
    assert p.samples_per_s == pytest.approx(19 / 0.95)
