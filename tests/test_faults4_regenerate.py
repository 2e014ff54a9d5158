"""The fourth fault battery's regenerate defects (issue 37; /work/shared/faults4/defects.tsv):
each against a real HTTP server on 127.0.0.1 (tests/sglang_chat_double.py, SGLang's
/v1/chat/completions), the op as a real subprocess, a real full tmpfs for ENOSPC."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, WS
from tests.sglang_chat_double import ChatDouble

PY = sys.executable


def regenerate(*args, timeout: float = 120) -> subprocess.CompletedProcess:
    # timeout: a bound that ends the child if the defect comes back (a hang), not a window the test waits
    return subprocess.run([PY, "-m", "ops.regenerate", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=str(ROOT))


def index_rows(out: Path) -> set[int]:
    text = (out / "journal.idx").read_text() if (out / "journal.idx").exists() else ""
    return {int(ln.split()[0]) for ln in text.splitlines() if len(ln.split()) == 3}


def errors(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if ln.startswith("regenerate:")]


# ---- Q12: a lone surrogate in the prompts file ---------------------------------------------

def test_q12_a_lone_surrogate_in_the_prompts_file_is_one_line_naming_file_line_and_key(tmp_path):
    """Before: UnicodeEncodeError traceback from journal.append, the good row lost with it, every
    resume the same. Now: refused before anything is asked, naming the line and the key."""
    src = tmp_path / "in.jsonl"
    src.write_text('{"prompt": "fine"}\n'
                   '{"id": "c2", "messages": [{"role": "user", "content": "bad \\ud800 x"}]}\n')
    d = ChatDouble().start()
    try:
        out = tmp_path / "out"
        proc = regenerate("--url", d.url, "--input", str(src), "--output", str(out))
    finally:
        d.stop()
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert errors(proc.stderr) == [f"regenerate: error: {src}:2: messages[0].content holds a lone surrogate "
                                   f"'\\ud800' at character 4 (an escape that is no character; UTF-8 cannot "
                                   f"hold it): fix or drop that row"]
    assert d.chats == []


def test_q12_the_prepare_reader_names_the_same_line(tmp_path):
    from ops.common import BadInput
    from ops.conversations import read_conversations

    src = tmp_path / "conv.jsonl"
    src.write_text('{"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "\\udfff"}]}\n')
    with pytest.raises(BadInput, match=r"conv.jsonl:1: conversations\[1\].value holds a lone surrogate '\\udfff'"):
        read_conversations(src)


# ---- Q13: a lone surrogate in the server's answer ------------------------------------------

def test_q13_a_lone_surrogate_in_the_answer_fails_that_row_named_and_the_others_are_kept(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in
                           ["one", "two [surrogate]", "three", "four"]))
    d = ChatDouble().start()
    try:
        out = tmp_path / "out"
        proc = regenerate("--url", d.url, "--input", str(src), "--output", str(out), "--concurrency", "2",
                          "--max-failed-fraction", "0.5")
    finally:
        d.stop()
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    result = json.loads((out / "regenerate.json").read_text())
    assert result["failed"] == {"server_error": 1}
    [failed] = result["failed_rows"]
    assert failed["row"] == 1 and "lone surrogate '\\ud800' at character 3" in failed["detail"]
    rows = [json.loads(ln) for ln in (out / "conversations.jsonl").read_text().splitlines()]
    assert [r["messages"][0]["content"] for r in rows] == ["one", "three", "four"]
    (out / "conversations.jsonl").read_bytes().decode("utf-8")     # whole UTF-8


# ---- Q20: an answer that trickles ----------------------------------------------------------

def test_q20_timeout_s_bounds_the_whole_request_not_each_read(tmp_path):
    """The double sends its headers, then one byte every 0.05 s without end: every
    socket read is answered well within timeout_s. Before: the run never ended."""
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"prompt": f"question {i} [drip]"}) + "\n" for i in range(3)))
    d = ChatDouble(drip_s=0.05).start()
    try:
        out = tmp_path / "out"
        proc = regenerate("--url", d.url, "--input", str(src), "--output", str(out), "--concurrency", "3",
                          "--timeout-s", "0.5", timeout=60)
    finally:
        d.stop()
    assert proc.returncode == 1, proc.stderr        # 3 of 3 failed: over max_failed_fraction
    assert "Traceback" not in proc.stderr
    result = json.loads((out / "regenerate.json").read_text())
    assert result["failed"] == {"timeout": 3}
    assert {f["detail"] for f in result["failed_rows"]} == {"no whole answer within timeout_s 0.5 s"}
    assert "progress: items 0/3 tokens 0 errors 3 " in proc.stdout      # progress: the rows kept


# ---- Q02: progress when a dead server ends the run -----------------------------------------

def test_q02_a_run_ended_by_a_dead_server_says_the_rows_done_and_kept_last(tmp_path):
    """Before: the forced last progress line was skipped, so the log's last said
    `items 1/300` (0.3 %) while the journal held 124 rows."""
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"prompt": f"question {i}"}) + "\n" for i in range(300)))
    d = ChatDouble(die_after=60).start()
    try:
        out = tmp_path / "out"
        proc = regenerate("--url", d.url, "--input", str(src), "--output", str(out), "--concurrency", "4",
                          "--timeout-s", "5")
    finally:
        d.stop()
    assert proc.returncode == 1, proc.stderr
    assert "the server stopped answering" in proc.stderr and "Traceback" not in proc.stderr
    kept = index_rows(out)
    last = [ln for ln in proc.stdout.splitlines() if ln.startswith("progress:")][-1]
    assert last.startswith(f"progress: items {len(kept)}/300 "), (last, len(kept))
    # Every answer the server sent before it died is kept, those in flight included.
    answered = sum(1 for ln in (out / "journal.jsonl").read_text().splitlines() if '"messages"' in ln)
    assert answered == len(kept) == 60


def test_q02_the_console_shows_the_rows_done_and_kept(ws: WS, tmp_path):
    (ws.root / "prompts.jsonl").write_text("".join(json.dumps({"prompt": f"q {i}"}) + "\n" for i in range(300)))
    d = ChatDouble(die_after=40).start()
    try:
        ws.write(f"""
        [stages.regenerate]
        op = "regenerate"
        params = {{ input = "prompts.jsonl", output = "out/regen", url = "{d.url}", concurrency = 4, timeout_s = 5 }}
        """)
        ws.cli("run", "regenerate", check=0)
        ws.wait_status("regenerate", ("failed",), timeout=90)
    finally:
        d.stop()
    kept = len(index_rows(ws.root / "out/regen"))
    snap = json.loads(ws.cli("status", "--json", "--no-gpus").stdout)
    st = next(s for s in snap["stages"] if s["name"] == "regenerate")
    assert (st["log"]["progress_done"], st["log"]["progress_total"]) == (kept, 300)


# ---- Q23: the url checked before anything starts -------------------------------------------

@pytest.mark.parametrize("url, why", [
    ("ftp://x", "'ftp://x': not an http:// or https:// URL (expected http://host:port)"),
    ("http://127.0.0.1:99999", "'http://127.0.0.1:99999': port 99999 out of range 1-65535"),
    ("http://:8000", "'http://:8000': no host (expected http://host:port)"),
])
def test_q23_a_bad_url_is_refused_at_once_naming_the_key(ws: WS, tmp_path, url, why):
    src = tmp_path / "in.jsonl"
    src.write_text('{"prompt": "hello"}\n')
    proc = regenerate("--url", url, "--input", str(src), "--output", str(tmp_path / "out"),
                      "--ready-timeout-s", "600", timeout=30)
    assert proc.returncode == 2 and errors(proc.stderr) == [f"regenerate: error: --url {why}"]
    assert not (tmp_path / "out").exists()
    ws.write(f"""
    [stages.regenerate]
    op = "regenerate"
    params = {{ input = "{src}", output = "out/regen", url = "http://127.0.0.1:8000", ready_timeout_s = 5 }}
    """)
    proc = ws.cli("run", "regenerate", "--set", f"url={url}", check=3)
    assert f"stages.regenerate.params.url {why}" in proc.stderr
    assert ws.latest("regenerate") is None


# ---- Q26: a full disk ----------------------------------------------------------------------

def _can_mount_tmpfs() -> bool:
    if not shutil.which("unshare"):
        return False
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt"],
                           capture_output=True)
    return probe.returncode == 0


@pytest.mark.skipif(not _can_mount_tmpfs(), reason="needs `unshare -rm` to mount a small tmpfs")
def test_q26_a_full_disk_is_one_line_naming_the_file_and_enospc_and_the_rows_stay(tmp_path):
    """A real full filesystem: the op runs in a user+mount namespace with its output on a
    64 KiB tmpfs; then the tmpfs grows (remount) and the same output resumes to the file an
    uninterrupted run writes."""
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"prompt": f"question {i} " + "words " * 80}) + "\n" for i in range(300)))
    d = ChatDouble().start()
    try:
        whole = tmp_path / "whole"
        assert regenerate("--url", d.url, "--input", str(src), "--output", str(whole)).returncode == 0
        assert json.loads((whole / "regenerate.json").read_text())["failed"] == {}
        assert (whole / "journal.jsonl").stat().st_size > 2 * 64 * 1024       # cannot fit
        mnt, keep = tmp_path / "mnt", tmp_path / "kept"
        mnt.mkdir()
        keep.mkdir()
        argv = f"-m ops.regenerate --url {d.url} --input {src} --output {mnt}/out --concurrency 4"
        script = (f"mount -t tmpfs -o size=64k tmpfs {mnt} || exit 99; "
                  f"{PY} {argv} >{keep}/stdout1 2>{keep}/stderr1; echo $? >{keep}/rc1; "
                  f"cp -r {mnt}/out {keep}/full; "
                  f"mount -o remount,size=8m {mnt} || exit 98; "
                  f"{PY} {argv} >{keep}/stdout2 2>{keep}/stderr2; echo $? >{keep}/rc2; "
                  f"cp -r {mnt}/out {keep}/resumed")
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        proc = subprocess.run(["unshare", "-rm", "sh", "-c", script], cwd=ROOT, env=env, timeout=300)
    finally:
        d.stop()
    assert proc.returncode == 0, proc.returncode
    stderr = (keep / "stderr1").read_text()
    assert (keep / "rc1").read_text().strip() == "1", stderr
    assert "Traceback" not in stderr
    [line] = errors(stderr)
    kept = index_rows(keep / "full")
    assert 0 < len(kept) < 300
    assert line.startswith(f"regenerate: error: {mnt}/out/journal.") and "No space left on device (ENOSPC)" in line
    assert line.endswith(f"; {len(kept)} of 300 rows done and kept in {mnt}/out/journal.jsonl: free space and run "
                         f"again to resume"), line
    assert (keep / "rc2").read_text().strip() == "0", (keep / "stderr2").read_text()
    assert f"({len(kept)} answered before, resumed)" in (keep / "stdout2").read_text()
    assert (keep / "resumed" / "conversations.jsonl").read_bytes() == (whole / "conversations.jsonl").read_bytes()
