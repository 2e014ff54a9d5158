"""The storage formats where the console shows them: run's plan line (the disk
estimate in each format), the estimate of the chosen format, the lint against
an output of another format, and the shard monitor's format and bytes a token
in status --json. Real workspaces, the CLI in this process
where it only reads (WS.call), else as a subprocess; no torch."""

from __future__ import annotations

import json

from tests.test_plan import EXACT, GiB, UPPER, kimi, prepare_summary  # noqa: F401 - kimi is a fixture

from ops.formats import DATA_CONFIG, SAMPLE_LENGTHS, sample_path


def _disk(ws) -> dict:
    snap = json.loads(ws.call("status", "--json", "--no-gpus").stdout)
    return next(d for d in snap["disk"] if d["stage"] == "extract")


def test_the_plan_line_gives_the_disk_estimate_in_each_format(kimi):  # noqa: F811
    proc = kimi.call("run", "extract", check=2)
    assert "disk by format (upper bound): bf16 2.1 TiB | fp8 1.1 TiB | int4 546.9 GiB (this run: format = bf16)" \
        in proc.stdout
    prepare_summary(kimi)
    proc = kimi.call("run", "extract", check=2)
    # Kimi-K2.5's 17,285,548 tokens: 923 GiB in bf16, about 462 in fp8, 231 in int4.
    assert "disk by format (exact): bf16 923.1 GiB | fp8 461.8 GiB | int4 230.8 GiB (this run: format = bf16)" \
        in proc.stdout
    proc = kimi.call("run", "extract", "--set", "format=fp8", check=2)
    assert "disk: exact 461.8 GiB (496 GB) = 17,285,548 tokens" in proc.stdout
    assert "x 4 states (3 aux + final) x (7,168 x 1 B + a 4 B scale) (fp8)" in proc.stdout
    assert "(this run: format = fp8)" in proc.stdout


def test_the_estimate_in_status_follows_the_format(kimi):  # noqa: F811
    prepare_summary(kimi)
    toml = kimi.root / "eagle3.toml"
    toml.write_text(toml.read_text().replace('output = "data/hidden_states"\n',
                                             'output = "data/hidden_states"\nformat = "int4"\n', 1))
    d = _disk(kimi)
    assert d["estimate_bytes"] == EXACT // 4 and d["estimate_kind"] == "exact"
    assert "x 4 states (3 aux + final) x 7,168 x 0.5 B (int4)" in d["estimate_basis"]
    assert EXACT // 4 / GiB <= 231
    assert UPPER // 4 < UPPER


def test_an_unknown_format_is_refused_at_run_with_exit_3(kimi):  # noqa: F811
    proc = kimi.call("run", "extract", "--set", "format=fp6", check=3)
    assert "format" in proc.stderr and "fp6" in proc.stderr and "bf16, fp8, int4" in proc.stderr
    assert kimi.latest("extract") is None


def _output(ws, fmt: str | None, n: int = 2, tokens: int = 5) -> None:
    out = ws.root / "data" / "hidden_states"
    out.mkdir(parents=True)
    config = {"status": "complete", "total_samples": n, "total_tokens": n * tokens, "hidden_size": 7168,
              "layer_ids": [1, 29, 57]}
    if fmt is not None:
        config["format"] = fmt
    (out / DATA_CONFIG).write_text(json.dumps(config))
    (out / SAMPLE_LENGTHS).write_text(json.dumps({str(i): tokens for i in range(n)}))
    for i in range(n):
        path = sample_path(out, i)
        path.parent.mkdir(parents=True, exist_ok=True)
        header = json.dumps({"input_ids": {"dtype": "I64", "shape": [tokens], "data_offsets": [0, 8 * tokens]}})
        header += " " * (-len(header) % 8)
        path.write_bytes(len(header).to_bytes(8, "little") + header.encode() + b"\0" * 8 * tokens)


def test_a_run_into_an_output_of_another_format_is_refused_before_it_starts(kimi):  # noqa: F811
    prepare_summary(kimi)
    kimi.record_finished_run("prepare", {}, status="succeeded")
    _output(kimi, "fp8")
    proc = kimi.call("run", "extract", "--ignore-disk", "--set", "format=int4", check=3)
    assert "data_config.json: the output holds format 'fp8', this run would write 'int4'" in proc.stdout + proc.stderr
    assert "a run keeps one format" in proc.stdout + proc.stderr
    assert kimi.latest("extract") is None


def test_status_json_names_the_format_and_the_bytes_a_token(kimi):  # noqa: F811
    _output(kimi, "fp8")
    snap = json.loads(kimi.call("status", "--json", "--no-gpus").stdout)
    shards = next(s for s in snap["stages"] if s["name"] == "extract")["shards"]
    assert shards["format"] == "fp8"
    written = sum(p.stat().st_size for p in (kimi.root / "data" / "hidden_states").rglob("*") if p.is_file())
    assert shards["bytes_per_token"] == written / 10


def test_an_output_without_a_format_holds_bf16(kimi):  # noqa: F811
    _output(kimi, None)
    snap = json.loads(kimi.call("status", "--json", "--no-gpus").stdout)
    assert next(s for s in snap["stages"] if s["name"] == "extract")["shards"]["format"] == "bf16"


def test_the_progress_pane_names_the_format_and_the_bytes_a_token():
    from eagle3_console.kernel.model import ShardProgress, StageStatus
    from eagle3_console.tui.panes.progress import summary

    st = StageStatus(name="extract", op="extract", status="running")
    st.shards = ShardProgress(root="/data/hs", layout="eagle3", samples_done=972, samples_expected=1000,
                              tokens_done=488_000, format="fp8", bytes_per_token=28_688.0)
    text = summary(st, 0.0).plain
    assert "format fp8" in text and "28.0K/token" in text


def test_int4_on_a_hidden_size_it_cannot_group_is_a_lint_error(ws):
    from tests.conftest import extract_pipeline

    ws.write(extract_pipeline(', format = "int4"', extra='depends_on = []\n'))
    proc = ws.call("run", "extract", "--ignore-disk", check=3)
    assert "stages.extract.params.format: int4 needs a hidden_size divisible by 32, the target's is 16" in \
        proc.stdout + proc.stderr
    assert ws.latest("extract") is None
