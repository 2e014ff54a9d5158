"""Faults in the ops (issue 8, items 6 and 10): what a hostile operator or a
full disk did to extract, verify and train, played on real tiny models and
real files. Each test failed on main before its fix (see each docstring)."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from safetensors.torch import load_file, save_file  # noqa: E402
from tests.conftest import EXTRACTION_SAMPLES  # noqa: E402
from tests.test_op_extract import REPO, extract_argv  # noqa: E402

from ops.common import run_main  # noqa: E402
from ops.extract.__main__ import main as extract_main  # noqa: E402
from ops.formats import DATA_CONFIG, sample_path  # noqa: E402
from ops.verify.__main__ import main as verify_main  # noqa: E402

N = EXTRACTION_SAMPLES


@pytest.fixture
def extracted(extraction):
    """An uninterrupted extraction of N samples: the reference bytes (tests/conftest.py
    extraction, made once a run; read only here, copied by `out`)."""
    return extraction


@pytest.fixture
def out(extracted, tmp_path):
    copy = tmp_path / "out"
    shutil.copytree(extracted[2], copy)
    return copy


# ---- item 6: resume checks what is on disk ------------------------------------

def test_resume_rewrites_truncated_and_garbled_samples_byte_identical(extracted, out, capsys):
    """Before: a sample truncated to part of its size survived the resume
    ("N samples were already on disk", nothing extracted, the file stayed cut)."""
    target, prepared, ref = extracted
    cut, garbled = sample_path(out, 5), sample_path(out, 17)
    cut.write_bytes(cut.read_bytes()[:3000])
    garbled.write_bytes(struct.pack("<Q", 12) + b"not json {{!")
    capsys.readouterr()
    assert run_main(extract_main, extract_argv(target, prepared, out, "--token-budget", "150")) == 0
    log = capsys.readouterr().out
    assert "extract: resume: rewriting 2 sample file(s) on disk that fail verify's header check: " in log
    assert f"data_5.safetensors: truncated (3000 of {sample_path(ref, 5).stat().st_size} bytes)" in log
    assert "data_17.safetensors: header is not JSON" in log
    assert f"({N - 2} samples were already on disk.)" in log
    assert json.loads((out / DATA_CONFIG).read_text())["status"] == "complete"
    for idx in range(N):
        assert sample_path(out, idx).read_bytes() == sample_path(ref, idx).read_bytes(), idx


# ---- item 10a: a full disk ------------------------------------------------------

def _can_mount_tmpfs() -> bool:
    if not shutil.which("unshare"):
        return False
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt"],
                           capture_output=True)
    return probe.returncode == 0


@pytest.mark.skipif(not _can_mount_tmpfs(), reason="needs `unshare -rm` to mount a small tmpfs")
def test_disk_full_marks_the_output_incomplete_and_ends_with_one_line(extracted, tmp_path):
    """A real full filesystem, not an injected error: the extraction runs in a
    user+mount namespace with its output on a 96 KiB tmpfs, so the kernel
    answers ENOSPC. Before: data_config.json stayed "running" and the run
    ended in a traceback."""
    target, prepared, ref = extracted
    total = sum(sample_path(ref, i).stat().st_size for i in range(N))
    assert total > 3 * 96 * 1024        # the output cannot fit
    mnt, keep = tmp_path / "mnt", tmp_path / "kept"
    mnt.mkdir()
    keep.mkdir()
    argv = extract_argv(target, prepared, mnt / "out", "--token-budget", "150", "--force")
    # Inside the namespace: mount, extract, copy out what is left (the tmpfs dies with it).
    script = (f"mount -t tmpfs -o size=96k tmpfs {mnt} || exit 99; "
              f"{sys.executable} -m ops.extract {' '.join(argv)} >{keep}/stdout 2>{keep}/stderr; rc=$?; "
              f"cp -r {mnt}/out {keep}/out; exit $rc")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    proc = subprocess.run(["unshare", "-rm", "sh", "-c", script], cwd=REPO, env=env, timeout=120)
    stderr = (keep / "stderr").read_text()
    assert proc.returncode == 1, (proc.returncode, stderr)
    assert "Traceback" not in stderr, stderr
    # (transformers' weight-loading bar is on stderr too: the op's own lines start with its name)
    lines = [ln for ln in stderr.splitlines() if ln.startswith("extract")]
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"extract: error: {mnt / 'out'}")
    config = json.loads((keep / "out" / DATA_CONFIG).read_text())
    written = list((keep / "out").glob("rows_*/*.safetensors"))
    assert lines[0].endswith(f": No space left on device (ENOSPC); {len(written)} of {N} samples on disk; "
                             f"free space and run again to resume")
    assert config["status"] == "incomplete"
    assert config["incomplete_reason"].startswith(f"disk full: {mnt / 'out'}") and "ENOSPC" in config["incomplete_reason"]
    assert 0 < len(written) < N and config["missing_samples"] == N - len(written)
    assert not list((keep / "out").glob("rows_*/*.tmp"))      # half-written temp files are removed
    for path in written:                                       # what was written is whole
        assert path.read_bytes() == (ref / path.parent.name / path.name).read_bytes()


# ---- item 10b: verify's counts add up ----------------------------------------

def _verify(out: Path, report: Path, *extra: str) -> dict:
    code = run_main(verify_main, ["--input", str(out), "--report", str(report), *extra])
    data = json.loads(report.read_text())
    assert code == (0 if data["ok"] else 1)
    return data


def test_verify_buckets_add_up_to_the_total(out, tmp_path, capsys):
    """Before: a sample --deep found bad stayed counted good too, and temp or
    misplaced files counted as bad samples, so good + bad + missing exceeded
    the total (the trial's "396 good + 6 bad of 398")."""
    nan = sample_path(out, 2)
    data = load_file(str(nan))
    data["final_hidden_states"][0, 0] = float("nan")
    save_file(data, str(nan))                                  # header fine: only --deep finds it
    cut = sample_path(out, 3)
    cut.write_bytes(cut.read_bytes()[:-5])                     # bad by header
    sample_path(out, 4).unlink()                               # missing
    moved = out / "rows_2000-4000" / "data_6.safetensors"      # misplaced: 6 is missing where it belongs
    moved.parent.mkdir()
    sample_path(out, 6).rename(moved)
    (sample_path(out, 7).with_name("data_7.safetensors.tmp")).write_bytes(b"half")   # leftover temp
    capsys.readouterr()
    report = _verify(out, tmp_path / "r.json", "--deep", str(N))
    text = capsys.readouterr().out
    assert (report["good"], report["bad_samples"], report["missing_count"]) == (N - 4, 2, 2)
    assert report["good"] + report["bad_samples"] + report["missing_count"] == report["total_samples"] == N
    assert report["other_bad_files"] == 2
    by_path = {b["path"]: b for b in report["bad_files"]}
    assert len(by_path) == len(report["bad_files"]) == 4        # each file once
    assert by_path[str(nan)]["sample"] == 2 and "NaN" in by_path[str(nan)]["reason"]
    assert by_path[str(moved)]["sample"] is None
    tokens = json.loads((out / "sample_lengths.json").read_text())
    assert report["tokens"] == sum(v for k, v in tokens.items() if int(k) not in (2, 3, 4, 6))
    assert f"verify: FAILED: {N} samples: {N - 4} good (" in text and "), 2 bad, 2 missing; 2 other bad files" in text


def test_reported_bad_files_lists_what_verify_found_and_still_stands(out, tmp_path):
    """For `clean`: the report's bad files that still exist unchanged inside the output."""
    from ops.verify.reported import ReportError, reported_bad_files

    cut = sample_path(out, 1)
    cut.write_bytes(cut.read_bytes()[:-5])
    tmp = sample_path(out, 8).with_name("data_8.safetensors.tmp")
    tmp.write_bytes(b"half")
    rewritten = sample_path(out, 9)
    rewritten.write_bytes(rewritten.read_bytes()[:-5])
    report_path = tmp_path / "runs" / "verify.json"
    _verify(out, report_path)
    rewritten.write_bytes(b"changed since verify")            # e.g. a resume rewrote it
    # A forged entry pointing outside the output is never offered.
    forged = json.loads(report_path.read_text())
    outside = tmp_path / "precious.txt"
    outside.write_text("keep me")
    forged["bad_files"].append({"path": str(out / ".." / "precious.txt"), "reason": "forged", "sample": None})
    report_path.write_text(json.dumps(forged))

    found = {b.path: b for b in reported_bad_files(report_path, out)}
    assert set(found) == {cut.resolve(), tmp.resolve()}
    assert found[cut.resolve()].sample == 1 and "truncated" in found[cut.resolve()].reason
    assert found[tmp.resolve()].sample is None and found[tmp.resolve()].size == 4

    with pytest.raises(ReportError, match="reports on"):
        reported_bad_files(report_path, tmp_path)
    with pytest.raises(ReportError, match="no verify report there"):
        reported_bad_files(tmp_path / "nope.json")
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ReportError, match="not a verify report"):
        reported_bad_files(tmp_path / "bad.json")


def test_reported_bad_files_imports_no_torch():
    code = ("import sys; import ops.verify.reported; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


# ---- item 10c: train on an out-of-vocabulary id ---------------------------------

def test_train_names_the_file_sample_and_id_outside_the_vocabulary(tmp_path, assets, capsys):
    """Before: a bare IndexError ("index out of range in self") from the embedding."""
    from ops.train.__main__ import main as train_main

    data = tmp_path / "hidden_states"
    shutil.copytree(assets["data"], data)
    vocab = json.loads((assets["target"] / "config.json").read_text())["vocab_size"]
    victim = sorted(data.glob("rows_*/data_*.safetensors"))[3]
    idx = int(victim.stem.split("_")[1])
    tensors = load_file(str(victim))
    tensors["input_ids"][2] = vocab + 5
    save_file(tensors, str(victim))
    capsys.readouterr()
    code = train_main(["--data", str(data), "--vocab", str(assets["vocab"]), "--target", str(assets["target"]),
                       "--output", str(tmp_path / "run"), "--workers", "0", "--token-budget", "256",
                       "--ttt-steps", "2", "--epochs", "1", "--save-every", "1000"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    [line] = [ln for ln in err.splitlines() if ln.strip()]
    assert line == (f"error: {victim}: sample {idx} holds token id {vocab + 5} at position 2, outside the "
                    f"target's vocabulary of {vocab} ids ({assets['target']}); the hidden states were "
                    f"extracted with another tokenizer or target")


def test_clean_offers_the_samples_verify_reported_under_a_succeeded_run(out, tmp_path):
    """Before: clean refused ("run N succeeded: its outputs are complete") and only a
    manual delete removed a sample verify had found truncated."""
    from tests.conftest import WS
    ws = WS(tmp_path)
    ws.write(f"""
[stages.extract]
op = "extract"
params = {{ input = "prep", output = "{out}" }}

[stages.verify]
op = "verify"
depends_on = ["extract"]
params = {{ input = "{out}", report = "runs/verify.json" }}
""")
    ws.record_finished_run("extract", {"input": "prep", "output": str(out)}, status="succeeded")
    cut = sample_path(out, 5)
    cut.write_bytes(cut.read_bytes()[:-7])
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and p != cut}
    assert ws.cli("clean", "extract").returncode == 2             # nothing reported yet: refused
    _verify(out, tmp_path / "runs" / "verify.json")
    plan = ws.cli("clean", "extract")
    assert plan.returncode == 0 and str(cut) in plan.stdout and "verify" in plan.stdout, plan.stdout
    ws.cli("clean", "extract", "--yes", check=0)
    assert not cut.exists()
    assert all(p.read_bytes() == b for p, b in before.items())    # nothing else touched
    assert len(list((tmp_path / ".eagle3" / "trash").rglob(cut.name))) == 1
