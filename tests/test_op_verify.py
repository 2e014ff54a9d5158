"""verify (ops/verify) over a real extract output of a tiny Llama target."""

from __future__ import annotations

import json
import shutil
import struct

import pytest

torch = pytest.importorskip("torch")

from safetensors.torch import load_file, save_file  # noqa: E402
from tests.test_op_extract import extract_argv, make_prepared, make_target  # noqa: E402

from ops.common import run_main  # noqa: E402
from ops.extract.__main__ import main as extract_main  # noqa: E402
from ops.formats import DATA_CONFIG, SAMPLE_LENGTHS, sample_path  # noqa: E402
from ops.verify.__main__ import main as verify_main  # noqa: E402

N = 12


@pytest.fixture(scope="module")
def extracted(tmp_path_factory):
    root = tmp_path_factory.mktemp("verify")
    target = make_target(root / "target")
    prepared = make_prepared(root / "prep", n=N, seed=3)
    assert run_main(extract_main, extract_argv(target, prepared, root / "out", "--token-budget", "120")) == 0
    return target, root / "out"


@pytest.fixture
def out(extracted, tmp_path):
    copy = tmp_path / "out"
    shutil.copytree(extracted[1], copy)
    return copy


def run_verify(capsys, *argv) -> tuple[int, dict, str]:
    report_path = None
    if "--report" in argv:
        report_path = argv[argv.index("--report") + 1]
    code = run_main(verify_main, list(argv))
    text = capsys.readouterr().out
    report = json.loads(open(report_path).read()) if report_path else None
    return code, report, text


def test_a_complete_output_passes(out, tmp_path, capsys):
    code, report, text = run_verify(capsys, "--input", str(out), "--report", str(tmp_path / "r.json"))
    assert code == 0, text
    assert report["ok"] and report["good"] == N and report["bad_files"] == []
    assert report["tokens"] == json.loads((out / DATA_CONFIG).read_text())["total_tokens"]
    assert f"progress: samples {N}/{N} tokens" in text


def test_catches_truncated_wrong_shape_missing_and_temp(out, tmp_path, capsys):
    truncated = sample_path(out, 1)
    truncated.write_bytes(truncated.read_bytes()[:-7])
    wrong = sample_path(out, 2)
    data = load_file(str(wrong))
    data["aux_hidden_states"] = data["aux_hidden_states"][:, :64].contiguous()   # 2 layers, not 3
    save_file(data, str(wrong))
    sample_path(out, 3).unlink()
    leftover = sample_path(out, 4).with_name("data_4.safetensors.tmp")
    leftover.write_bytes(b"half a file")
    garbage = sample_path(out, 5)
    garbage.write_bytes(struct.pack("<Q", 12) + b"not json {{!")

    code, report, text = run_verify(capsys, "--input", str(out), "--report", str(tmp_path / "r.json"))
    assert code == 1
    reasons = {b["path"]: b["reason"] for b in report["bad_files"]}
    assert set(reasons) == {str(truncated), str(wrong), str(leftover), str(garbage)}
    assert "truncated" in reasons[str(truncated)]
    assert reasons[str(wrong)].startswith("aux_hidden_states shape [")
    assert "expected [" in reasons[str(wrong)] and ", 96] (3 layers x hidden 32)" in reasons[str(wrong)]
    assert "leftover temp file" in reasons[str(leftover)]
    assert "header is not JSON" in reasons[str(garbage)]
    assert report["missing_indices"] == ["3"]
    assert f"verify: bad file: {truncated}" in text and "missing indices: 3" in text


def test_rebuilds_sample_lengths_when_missing(out, capsys):
    original = json.loads((out / SAMPLE_LENGTHS).read_text())
    (out / SAMPLE_LENGTHS).unlink()
    code, _, text = run_verify(capsys, "--input", str(out))
    assert code == 0, text
    assert json.loads((out / SAMPLE_LENGTHS).read_text()) == original
    assert "rebuilt from 12 good files" in text


def test_length_disagreeing_with_sample_lengths_and_running_status(out, tmp_path, capsys):
    lengths = json.loads((out / SAMPLE_LENGTHS).read_text())
    lengths["0"] += 1
    (out / SAMPLE_LENGTHS).write_text(json.dumps(lengths))
    config = json.loads((out / DATA_CONFIG).read_text())
    config["status"] = "running"
    (out / DATA_CONFIG).write_text(json.dumps(config))
    code, report, _ = run_verify(capsys, "--input", str(out), "--report", str(tmp_path / "r.json"))
    assert code == 1
    assert [(b["path"], b["reason"], b["sample"]) for b in report["bad_files"]] == [
        (str(sample_path(out, 0)), f"{lengths['0'] - 1} tokens, sample_lengths.json says {lengths['0']}", 0)]
    assert any("status 'running'" in p for p in report["problems"])


def test_deep_finds_nan(out, tmp_path, capsys):
    path = sample_path(out, 6)
    data = load_file(str(path))
    data["final_hidden_states"][0, 0] = float("nan")
    save_file(data, str(path))   # the header is still consistent: only loading finds it
    code, report, _ = run_verify(capsys, "--input", str(out), "--deep", str(N), "--report", str(tmp_path / "r.json"))
    assert code == 1
    assert [(b["path"], b["reason"]) for b in report["bad_files"]] == [(str(path), "final_hidden_states: 1 NaN/Inf values")]
    assert (report["good"], report["bad_samples"]) == (N - 1, 1)     # moved from good to bad, not both


def test_deep_recompute_catches_a_wrong_layer_record(extracted, out, tmp_path, capsys):
    target = extracted[0]
    code, report, text = run_verify(capsys, "--input", str(out), "--deep", "3", "--recompute", "2",
                                    "--target", str(target), "--report", str(tmp_path / "ok.json"))
    assert code == 0, text
    assert len(report["deep"]["recomputed"]) == 2

    # The classic bug: states captured at layers [1, 3, 4] but recorded as the
    # HF indices [2, 4, 5] (an off-by-one in the writer's convention).
    config = json.loads((out / DATA_CONFIG).read_text())
    config["layer_ids"] = [2, 4, 5]
    (out / DATA_CONFIG).write_text(json.dumps(config))
    code, report, _ = run_verify(capsys, "--input", str(out), "--deep", "3", "--recompute", "1",
                                 "--target", str(target), "--report", str(tmp_path / "bad.json"))
    assert code == 1
    [bad] = report["bad_files"]
    assert "aux block 0 (layer_ids[0]=2): rows' RMS relative error" in bad["reason"]
    assert "aux block 0 (layer_ids[0]=2): it matches layer 1 best (hidden_states[2])" in bad["reason"]


def test_spec_argv_is_what_the_program_parses():
    from ops.verify.__main__ import build_parser
    from ops.verify.spec import SPEC

    args = build_parser().parse_args(SPEC.argv({"input": "out", "deep": 5}, target_path="t")[3:])
    assert (args.input, args.deep, args.target, args.recompute) == ("out", 5, "t", SPEC.params["recompute"])


def test_header_pass_never_imports_torch(out):
    """What keeps 10,000 samples to about a second: no torch, no tensor data."""
    import subprocess
    import sys

    from tests.test_op_extract import REPO

    code = ("import sys; from ops.verify.__main__ import main; rc = main(['--input', sys.argv[1]]); "
            "assert 'torch' not in sys.modules, 'torch imported'; sys.exit(rc)")
    proc = subprocess.run([sys.executable, "-c", code, str(out)], cwd=REPO, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
