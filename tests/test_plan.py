"""Day one of the Kimi-K2.5 job (issue 20): the disk figure and the layer ids are
right before anything runs. The pipeline file is examples/kimi-k2.5.toml as
committed; a real workspace, the CLI's reads and refusals in this process (WS.call), its
launches as real subprocesses."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from eagle3_console.kernel import config as cfg
from eagle3_console.kernel.model import DiskUsage
from eagle3_console.monitor.disk import free_space
from eagle3_console.kernel.workspace import Workspace
from ops import layers
from tests.conftest import ROOT

EXAMPLE = ROOT / "examples" / "kimi-k2.5.toml"
UPPER = 10_000 * 4_096 * 4 * 7_168 * 2          # 2,348,810,240,000 B = 2.35 TB
EXACT = 17_285_548 * 4 * 7_168 * 2              # 923 GiB (the seed's du -sh: 924G)
GiB = 2**30


@pytest.fixture
def kimi(ws):
    shutil.copy(EXAMPLE, ws.root / "eagle3.toml")
    # The target's folder, empty (run refuses one that is not there): the op itself fails on it at once.
    (ws.root / "models" / "Kimi-K2.5").mkdir(parents=True)
    return ws


def prepare_summary(ws, tokens: int = 17_285_548, samples: int = 10_000) -> None:
    out = ws.root / "data" / "prepared"
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps({"status": "complete", "samples": samples,
                                                  "total_tokens": tokens, "max_seq_len": 4096}))


def extract_disk(ws) -> dict:
    snap = json.loads(ws.call("status", "--json", "--no-gpus").stdout)
    return next(d for d in snap["disk"] if d["stage"] == "extract")


def test_the_example_is_the_job():
    pipe = cfg.load(EXAMPLE)
    t = pipe.target
    assert (t["num_layers"], t["hidden_size"], t["vocab_size"], t["dtype"]) == (61, 7168, 163840, "bfloat16")
    ex = pipe.stages["extract"]
    assert ex.params["engine"] == "sglang" and ex.params["tp"] == 8 and len(ex.gpus) == 8
    # The layers the seed's operator captured (SCENARIO.md run 2: layer_ids [2, 30, 58],
    # sglang_layers_to_capture [3, 31, 59]), written canonically: SGLang's capture list is k + 1.
    assert ex.params["layer_ids"] == [2, 30, 58]
    assert layers.sglang_capture_ids(ex.params["layer_ids"]) == [3, 31, 59]
    assert pipe.stages["prepare"].params["limit"] == 10_000
    assert pipe.stages["prepare"].params["max_seq_len"] == 4096
    assert pipe.stages["serve_spec"].op == "serve" and pipe.stages["bench"].depends_on == ["serve_spec"]
    assert pipe.stages["bench"].params["server"] == "serve_spec"


def test_before_anything_ran_status_shows_the_upper_bound_labelled(kimi):
    d = extract_disk(kimi)
    assert d["estimate_bytes"] == UPPER and d["estimate_kind"] == "upper_bound"
    assert d["final_kind"] == "upper_bound" and d["written_bytes"] == 0
    assert "10,000 samples" in d["estimate_basis"] and "4,096 tokens" in d["estimate_basis"]
    assert "per-file overhead" in d["estimate_basis"]
    text = kimi.call("status", "--no-gpus").stdout
    assert "2.1 TiB upper bound" in text
    assert ("extract: upper bound 2.1 TiB (2.35 TB) = 10,000 samples (prepare's limit) x 4,096 tokens "
            "(extract's max_seq_len) x 4 states (3 aux + final) x 7,168 x 2 B (bfloat16), plus per-file overhead") \
        in text


def test_run_prints_the_plan_before_refusing_on_a_dependency(kimi):
    proc = kimi.call("run", "extract", check=2)
    assert "depends on 'prepare', which has not succeeded" in proc.stderr
    assert "disk: upper bound 2.1 TiB (2.35 TB) = 10,000 samples" in proc.stdout
    assert ("layers (61-layer target): canonical [2, 30, 58] + final 60 | SGLang capture (layers_to_capture) "
            "[3, 31, 59] | vLLM eagle_aux_hidden_state_layer_ids [3, 31, 59]") in proc.stdout
    assert kimi.latest("extract") is None


def test_the_exact_figure_once_prepare_wrote_its_summary(kimi):
    prepare_summary(kimi)
    d = extract_disk(kimi)
    assert d["estimate_bytes"] == EXACT and d["estimate_kind"] == "exact"
    assert round(EXACT / GiB) == 923
    assert d["estimate_basis"].startswith("17,285,548 tokens (prepare's summary.json in ")
    # The states only: each file's header, input_ids and loss_mask come on top (measured: 21.8 MiB
    # where the states of the same samples were 21.5 MiB), so the basis says so, as the upper bound's does.
    assert d["estimate_basis"].endswith("plus per-file overhead (headers, input_ids, loss_mask)"), d
    proc = kimi.call("run", "extract", check=2)
    assert "disk: exact 923.1 GiB (991 GB) = 17,285,548 tokens" in proc.stdout


def test_force_overrides_the_dependencies_not_the_disk(kimi):
    prepare_summary(kimi)
    free, _total = free_space(kimi.root)
    if free >= EXACT:
        pytest.skip("this filesystem has room for 923 GiB")
    # engine hf, tp 1: the op itself fails at once (an empty target folder); what matters is who refuses.
    sets = ["--set", "engine=hf", "--set", "tp=1"]
    proc = kimi.call("run", "extract", "--force", *sets, check=2)
    assert "needs about 923.1 GiB more (exact: 17,285,548 tokens" in proc.stderr
    assert "pass --ignore-disk" in proc.stderr
    assert kimi.latest("extract") is None
    kimi.call("run", "extract", "--ignore-disk", *sets, check=2)        # the dependency still counts
    assert kimi.latest("extract") is None
    kimi.cli("run", "extract", "--force", "--ignore-disk", *sets, check=0)
    run = kimi.latest("extract")
    assert run is not None and "--force" in run.argv      # the op's own disk check is overridden too
    run = kimi.wait_status("extract", ("failed", "succeeded"))
    log = Path(run.log_path).read_text()
    # The op ran past its own disk check and failed on what is missing here: the target.
    assert run.status == "failed" and "more (exact:" not in log, log[-2000:]
    assert "extract: error: target models/Kimi-K2.5: no config.json" in log, log[-2000:]
    with kimi.registry() as reg:
        assert any(e.detail == "forced, disk ignored" for e in reg.events() if e.action == "run")


def test_restart_checks_the_disk_and_has_its_own_override(kimi):
    prepare_summary(kimi)
    free, _total = free_space(kimi.root)
    if free >= EXACT:
        pytest.skip("this filesystem has room for 923 GiB")
    pipe = cfg.load(kimi.root / "eagle3.toml")
    params = dict(pipe.stages["extract"].params, engine="hf", tp=1)
    kimi.record_finished_run("extract", params, status="failed")
    proc = kimi.cli("restart", "extract", "--force", "--yes", check=2)
    assert "pass --ignore-disk" in proc.stdout + proc.stderr
    assert kimi.latest("extract").restart_of is None
    proc = kimi.cli("restart", "extract", "--force", "--ignore-disk", "--yes", check=0)
    assert "disk: exact 923.1 GiB" in proc.stdout
    assert kimi.latest("extract").restart_of is not None


def test_a_foreign_tree_is_estimated_from_its_own_metadata(kimi):
    """No prepare summary: the seed's data_config.json says tokens, hidden size, states."""
    out = kimi.root / "data" / "hidden_states"
    out.mkdir(parents=True)
    (out / "data_config.json").write_text(json.dumps({
        "extraction_method": "sglang_server_dump_patch", "layer_ids": [2, 30, 58, 60],
        "sglang_layers_to_capture": [3, 31, 59], "max_seq_len": 4096, "total_samples": 10000,
        "total_tokens": 17285548, "data_format_version": 1, "hidden_size": 7168, "num_layers_captured": 4}))
    d = extract_disk(kimi)
    assert d["estimate_bytes"] == EXACT and d["estimate_kind"] == "metadata"
    assert "data_config.json's total_tokens" in d["estimate_basis"] and "num_layers_captured" in d["estimate_basis"]


def _extract_estimate(root, config: dict | None, lengths: dict | None = None):
    (root / "eagle3.toml").write_text("""
[target]
num_layers = 61
hidden_size = 7168
dtype = "bfloat16"

[stages.extract]
op = "extract"
params = { input = "data/prepared", output = "data/hs" }
""")
    out = root / "data" / "hs"
    out.mkdir(parents=True, exist_ok=True)
    if config is not None:
        (out / "data_config.json").write_text(json.dumps(config))
    if lengths is not None:
        (out / "sample_lengths.json").write_text(json.dumps(lengths))
    from eagle3_console.runs import plan
    ws = Workspace(root)
    pipe = cfg.load(ws.config_path)
    st = pipe.stages["extract"]
    return plan.disk_estimate(ws, pipe, st, dict(st.params))


def test_speculators_metadata_tokens_from_sample_lengths(tmp_path):
    est = _extract_estimate(tmp_path, {"data": {"num_samples": 3}}, {"0": 100, "1": 200, "2": 300})
    assert est.kind == "metadata" and est.bytes == 600 * 4 * 7168 * 2
    assert "600 tokens (sample_lengths.json in " in est.basis


def test_speculators_samples_alone_give_an_upper_bound(tmp_path):
    est = _extract_estimate(tmp_path, {"data": {"num_samples": 3}})
    assert est.kind == "upper_bound" and est.bytes == 3 * 4096 * 4 * 7168 * 2
    assert "data_config.json's data.num_samples" in est.basis


def test_nothing_known_gives_no_figure(tmp_path):
    assert _extract_estimate(tmp_path, None) is None


def test_files_landing_give_the_measured_projection(ws):
    ws.write("""
[target]
num_layers = 61
hidden_size = 7168

[stages.extract]
op = "extract"
params = { input = "data/prepared", output = "data/hs", num_samples = 4 }
""")
    shard = ws.root / "data" / "hs" / "rows_0-2000"
    shard.mkdir(parents=True)
    for i in range(2):
        (shard / f"data_{i}.safetensors").write_bytes(b"x" * 1000)
    d = extract_disk(ws)
    assert d["final_kind"] == "measured" and d["projected_bytes"] == 4000   # 2 of 4 samples, 2,000 B
    assert d["estimate_kind"] == "upper_bound" and d["estimate_bytes"] == 4 * 4096 * 4 * 7168 * 2


def test_the_disk_pane_labels_the_estimate():
    import io

    from rich.console import Console, Group

    from eagle3_console.tui.panes.disk import usage_lines
    d = DiskUsage(stage="extract", path="/data/hs", estimate_bytes=UPPER, free_bytes=68 * GiB,
                  total_bytes=3 * 2**40, fits=False, estimate_kind="upper_bound", final_kind="upper_bound",
                  estimate_label="upper bound",      # the kind in words, as the snapshot's pass labels it
                  estimate_basis="10,000 samples (prepare's limit) x 4,096 tokens")
    console = Console(width=60, file=io.StringIO(), color_system=None)
    with console.capture() as cap:
        console.print(Group(*usage_lines(d, 60)))
    text = " ".join(cap.get().split())
    assert "upper bound 2.1T (2.35 TB)" in text
    assert "10,000 samples (prepare's limit) x 4,096 tokens" in text
    assert "MAY NOT FIT: needs at most 2.1T" in text     # the verdict of an upper bound says so


# ------------------------------------------------------------------ layer ids
def _kimi_target(ws, arch: str = "DeepseekV3ForCausalLM") -> None:
    """The target's config.json, as much of it as the plan reads (its architecture)."""
    d = ws.root / "models" / "Kimi-K2.5"
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps({"architectures": [arch], "num_hidden_layers": 61}))


def _lint_warning(proc) -> str:
    return next(line for line in proc.stderr.splitlines() if line.startswith("lint warning:"))


def test_sglangs_spelling_of_the_default_is_a_lint_warning_naming_every_reading(kimi):
    proc = kimi.call("run", "extract", "--set", "layer_ids=[2, 30, 58]", check=2)
    warning = _lint_warning(proc)
    assert "layer_ids [2, 30, 58] is read as canonical ids" in warning
    assert "SGLang capture [3, 31, 59]" in warning
    assert ("if it is SGLang's capture list (layers_to_capture), vLLM's eagle_aux_hidden_state_layer_ids "
            "or an HF hidden_states index: canonical [1, 29, 57]") in warning
    assert "keep it only to capture [3, 31, 59]" in warning
    proc = kimi.call("run", "extract", "--set", "layer_ids=auto", check=2)
    assert "lint warning" not in proc.stderr


def test_a_pasted_capture_list_is_named_in_every_spelling_it_could_be(kimi):
    """The seed's SGLang list [3, 31, 59] pasted as layer_ids would capture [4, 32, 60]:
    the lint says so, and what it stands for if it was the capture list or a draft config's."""
    _kimi_target(kimi)
    proc = kimi.call("run", "extract", "--set", "layer_ids=[3, 31, 59]", check=2)
    warning = _lint_warning(proc)
    assert "layer_ids [3, 31, 59] is read as canonical ids" in warning
    assert "SGLang capture [4, 32, 60]" in warning
    assert "vLLM's eagle_aux_hidden_state_layer_ids or an HF hidden_states index: canonical [2, 30, 58]" in warning
    # Kimi's rule (deepseek_v2.py) takes [3, 31, 59] as it is: capture [3, 31, 59] = canonical [2, 30, 58].
    assert ("if it is an SGLang draft config.json's eagle_aux_hidden_state_layer_ids "
            "(plus_one_if_first_is_one rule): canonical [2, 30, 58]") in warning


def test_the_plan_line_names_each_spelling_for_what_it_is(kimi):
    """The SGLang draft config's ids are the ones export writes, per the target's rule:
    for Kimi and the seed's layers [3, 31, 59]; for a Llama target the canonical ids."""
    _kimi_target(kimi)
    line = next(x for x in kimi.call("run", "extract", check=2).stdout.splitlines() if x.startswith("layers ("))
    ks = [2, 30, 58]
    wrote = layers.sglang_config_ids_for("DeepseekV3ForCausalLM", ks)
    assert wrote == [3, 31, 59]
    assert f"SGLang draft config.json eagle_aux_hidden_state_layer_ids (export writes) {wrote}" in line
    assert "SGLang capture (layers_to_capture) [3, 31, 59]" in line
    assert "vLLM eagle_aux_hidden_state_layer_ids [3, 31, 59]" in line
    _kimi_target(kimi, "LlamaForCausalLM")
    line = next(x for x in kimi.call("run", "extract", "--set", "layer_ids=auto", check=2).stdout.splitlines()
                if x.startswith("layers ("))
    assert "SGLang draft config.json eagle_aux_hidden_state_layer_ids (export writes) [1, 29, 57]" in line
    assert "SGLang capture (layers_to_capture) [2, 30, 58]" in line


def test_layer_ids_the_target_cannot_have_are_a_lint_error(kimi):
    proc = kimi.call("run", "extract", "--set", "layer_ids=[2, 30, 61]", check=2)
    assert "lint error: stages.extract.params.layer_ids: layer_ids [2, 30, 61]: [61] outside" in proc.stderr
    assert kimi.latest("extract") is None


def test_the_readme_names_layer_ids_and_each_spelling_for_61_layers():
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("### The pipeline file"):readme.index("### Runs")]
    assert "layer_ids" in section and "canonical" in section
    rows = {m.group(1).strip(): m.group(2) for m in re.finditer(r"^\| ([^|]+?) \| (\[[\d, ]+\])", section, re.M)}
    ks = layers.default_aux_layers(61)
    assert rows[next(k for k in rows if k.startswith("canonical"))] == str(ks)
    assert rows[next(k for k in rows if "layers_to_capture" in k)] == str(layers.sglang_capture_ids(ks))
    assert rows[next(k for k in rows if k.startswith("vLLM"))] == str(layers.vllm_aux_ids(ks))
    assert rows[next(k for k in rows if "draft `config.json`" in k)] == \
        str(layers.sglang_config_ids_for("DeepseekV3ForCausalLM", ks))
    assert rows[next(k for k in rows if "hidden_states" in k and "HF" in k)] == str(layers.hf_hidden_states_indices(ks))


def test_a_summary_whose_token_count_is_no_number_gives_no_exact_figure_and_no_traceback(ws):
    """prepare's summary.json with total_tokens "lots" (a hand-edited or foreign file):
    before, int("lots") raised out of the estimate; now that count is absent (the
    upper bound stands) and a good one still gives the exact figure."""
    import json as _json
    from tests.conftest import extract_pipeline
    ws.write(extract_pipeline(", max_seq_len = 128"))
    prepared = ws.root / "data" / "prepared"
    prepared.mkdir(parents=True)
    (prepared / "summary.json").write_text('{"samples": 10, "total_tokens": "lots"}')
    proc = ws.call("status", "--json", "--no-gpus")
    assert "Traceback" not in proc.stderr, proc.stderr
    row = next(d for d in _json.loads(proc.stdout)["disk"] if d["stage"] == "extract")
    assert row["estimate_kind"] == "upper_bound", row
    (prepared / "summary.json").write_text('{"samples": 10, "total_tokens": 1000}')
    row = next(d for d in _json.loads(ws.call("status", "--json", "--no-gpus").stdout)["disk"] if d["stage"] == "extract")
    assert row["estimate_kind"] == "exact" and row["estimate_bytes"] == 1000 * 4 * 16 * 2, row


def test_run_checks_a_launch_once(ws, monkeypatch):
    """`run` prints its plan (disk, lint) and launches on the same figures: the
    params, the op's lint and the disk preflight are computed once a launch (before,
    the CLI computed each and launch computed each again)."""
    from eagle3_console.runs import launching

    calls = {"preflight": 0, "lints": 0, "stage_params": 0}

    def counted(name, real):
        def wrapper(*args, **kw):
            calls[name] += 1
            return real(*args, **kw)
        return wrapper

    for name in calls:      # where a launch looks them up
        monkeypatch.setattr(launching, name, counted(name, getattr(launching, name)))
    ws.write('[stages.w]\nargv = ["true"]\noutputs = ["out/w"]\nestimate_bytes = 1000\n')
    proc = ws.call("run", "w", check=0)
    assert "disk:" in proc.stdout, proc.stdout
    assert calls == {"preflight": 1, "lints": 1, "stage_params": 1}, calls
    ws.wait_status("w", ("succeeded",))


def test_a_command_reads_the_pipeline_file_once(ws, monkeypatch):
    """The pipeline file is read once a command and handed down (run: the plan, the
    checks and the launch; restart: its snapshot, its plan and the launch)."""
    from eagle3_console.kernel import config as cfg

    reads = []
    real = cfg.load

    def counted(path, *args, **kw):
        reads.append(path)
        return real(path, *args, **kw)

    monkeypatch.setattr(cfg, "load", counted)
    ws.write('[stages.w]\nargv = ["false"]\noutputs = ["out/w"]\n')
    ws.call("run", "w", check=0)
    assert len(reads) == 1, reads
    ws.wait_status("w", ("failed",))
    reads.clear()
    ws.call("restart", "w", "--yes", check=0)
    assert len(reads) == 1, reads
    ws.wait_status("w", ("failed",))
