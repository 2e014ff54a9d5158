"""The regenerate op: the target answers the user turns of a prompts file, through
SGLang's chat API (the HTTP double of tests/sglang_chat_double.py, a real server
in this process) or HF generate (the real SmolLM2 on CPU); resumable after a real
SIGKILL; failures counted and named; a dead server a clear failure."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ops.conversations import read_conversations
from tests.conftest import ROOT, WS, wait_for
from tests.sglang_chat_double import ChatDouble, answer_words


def regenerate(*args, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ops.regenerate", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=str(ROOT))


def popen(*args) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "ops.regenerate", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=str(ROOT))


def write_rows(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def double():
    d = ChatDouble().start()
    yield d
    d.stop()


def read_out(out: Path) -> list[dict]:
    return [json.loads(ln) for ln in (out / "conversations.jsonl").read_text().splitlines()]


def test_each_user_turn_is_answered_with_the_generated_history_and_old_answers_dropped(double, tmp_path):
    src = write_rows(tmp_path / "in.jsonl", [
        {"id": "sg-1", "conversations": [{"from": "human", "value": "first question"},
                                         {"from": "gpt", "value": "OLD ANSWER ONE"},
                                         {"from": "human", "value": "and a follow-up"},
                                         {"from": "gpt", "value": "OLD ANSWER TWO"}]},
        {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "why is the sky blue"}]},
        {"prompt": "name three rivers"},
    ])
    out = tmp_path / "out"
    proc = regenerate("--url", double.url, "--input", str(src), "--output", str(out), "--max-tokens", "8")
    assert proc.returncode == 0, proc.stderr
    rows = read_out(out)
    a1 = " ".join(answer_words([{"role": "user", "content": "first question"}], 8)[0])
    h2 = [{"role": "user", "content": "first question"}, {"role": "assistant", "content": a1},
          {"role": "user", "content": "and a follow-up"}]
    assert rows[0] == {"id": "sg-1", "messages": h2 + [{"role": "assistant",
                                                        "content": " ".join(answer_words(h2, 8)[0])}]}
    assert rows[1]["messages"][0] == {"role": "system", "content": "be brief"}
    assert [m["role"] for m in rows[1]["messages"]] == ["system", "user", "assistant"]
    assert [m["role"] for m in rows[2]["messages"]] == ["user", "assistant"]
    assert "OLD ANSWER" not in (out / "conversations.jsonl").read_text()
    # The second turn was asked with the generated answer, not the old one; greedy by default.
    assert any(c["messages"] == h2 for c in double.chats)
    assert {(c["temperature"], c["top_p"], c["max_tokens"], c["model"]) for c in double.chats} == {(0.0, 1.0, 8, "default")}
    # prepare takes the output as its input, every row with an assistant turn.
    convs = read_conversations(out / "conversations.jsonl")
    assert len(convs) == 3 and all(c.drop is None for c in convs)
    result = json.loads((out / "regenerate.json").read_text())
    assert (result["status"], result["rows"], result["answered"], result["turns"], result["failed"]) == \
        ("complete", 3, 3, 4, {})
    assert "progress: items 3/3" in proc.stdout


def test_failed_rows_are_counted_and_named_never_dropped_silently(tmp_path):
    d = ChatDouble(context_len=40, slow_s=5).start()
    try:
        src = write_rows(tmp_path / "in.jsonl", [
            {"prompt": "a fine question"},
            {"prompt": "say nothing [empty]"},
            {"prompt": "break the server [500]"},
            {"prompt": " ".join(["long"] * 60)},
            {"prompt": "take your time [slow]"},
            {"messages": [{"role": "assistant", "content": "an answer without a question"}]},
        ])
        out = tmp_path / "out"
        proc = regenerate("--url", d.url, "--input", str(src), "--output", str(out), "--timeout-s", "0.5",
                          "--concurrency", "3")
    finally:
        d.stop()
    assert proc.returncode == 1, proc.stderr          # 5 of 6 failed: over max_failed_fraction 0.1
    result = json.loads((out / "regenerate.json").read_text())
    assert result["failed"] == {"context_overflow": 1, "empty": 1, "no_user_turn": 1, "server_error": 1,
                                "timeout": 1}
    assert [(f["row"], f["kind"]) for f in result["failed_rows"]] == [
        (1, "empty"), (2, "server_error"), (3, "context_overflow"), (4, "timeout"), (5, "no_user_turn")]
    assert "longer than the model's context length (40 tokens)" in result["failed_rows"][2]["detail"]
    assert "HTTP 500" in result["failed_rows"][1]["detail"]
    assert [r["messages"][0]["content"] for r in read_out(out)] == ["a fine question"]
    summary = "5 failed (context_overflow 1, empty 1, no_user_turn 1, server_error 1, timeout 1; rows 1, 2, 3, 4, 5)"
    assert summary in proc.stdout
    assert "more than max_failed_fraction 0.1" in proc.stderr and "Traceback" not in proc.stderr


def index_rows(out: Path) -> set[int]:
    text = (out / "journal.idx").read_text() if (out / "journal.idx").exists() else ""
    return {int(ln.split()[0]) for ln in text.splitlines() if len(ln.split()) == 3}


def test_a_sigkilled_run_resumes_without_asking_again_and_ends_with_the_same_file(tmp_path):
    rows = [{"id": f"r{i}", "conversations": [{"from": "human", "value": f"question {i}"},
                                              {"from": "gpt", "value": "old"},
                                              {"from": "human", "value": f"more about {i}"}]} for i in range(40)]
    src = write_rows(tmp_path / "in.jsonl", rows)
    d = ChatDouble(chat_s=0.03).start()
    try:
        whole = tmp_path / "whole"
        proc = regenerate("--url", d.url, "--input", str(src), "--output", str(whole), "--concurrency", "4")
        assert proc.returncode == 0, proc.stderr
        d.chats.clear()
        out = tmp_path / "out"
        p = popen("--url", d.url, "--input", str(src), "--output", str(out), "--concurrency", "4")
        wait_for(lambda: len(index_rows(out)) >= 10, timeout=60, poll=0.01)
        os.kill(p.pid, signal.SIGKILL)
        p.wait(timeout=10)
        answered = index_rows(out)
        assert 10 <= len(answered) < 40
        # A power cut's torn tail on both files: cut off, not trusted.
        with open(out / "journal.jsonl", "ab") as fh:
            fh.write(b'{"row": 39, "id": "r39", "messa')
        with open(out / "journal.idx", "ab") as fh:
            fh.write(b"39 99")
        d.chats.clear()
        proc = regenerate("--url", d.url, "--input", str(src), "--output", str(out), "--concurrency", "4")
        assert proc.returncode == 0, proc.stderr
    finally:
        d.stop()
    asked_again = {int(c["messages"][0]["content"].split()[-1]) for c in d.chats}
    assert not asked_again & answered
    assert asked_again == set(range(40)) - answered
    assert (out / "conversations.jsonl").read_bytes() == (whole / "conversations.jsonl").read_bytes()
    result = json.loads((out / "regenerate.json").read_text())
    assert (result["answered"], result["answered_before"]) == (40, len(answered))
    assert f"({len(answered)} answered before, resumed)" in proc.stdout


def test_a_server_that_dies_mid_run_is_a_clear_failure_not_a_hang(tmp_path):
    src = write_rows(tmp_path / "in.jsonl", [{"prompt": f"question {i}"} for i in range(200)])
    d = ChatDouble(chat_s=0.02).start()
    out = tmp_path / "out"
    p = popen("--url", d.url, "--input", str(src), "--output", str(out), "--concurrency", "4", "--timeout-s", "5")
    wait_for(lambda: len(index_rows(out)) >= 5, timeout=60, poll=0.01)
    d.stop()
    _stdout, stderr = p.communicate(timeout=60)
    assert p.returncode == 1, stderr
    line = next(ln for ln in stderr.splitlines() if ln.startswith("regenerate: error:"))
    assert "the server stopped answering" in line and "connection refused" in line.lower()
    assert "run again to resume" in line and "Traceback" not in stderr
    assert len(index_rows(out)) >= 5


def test_a_server_that_stops_answering_chats_ends_the_run_after_a_streak_of_timeouts(tmp_path):
    src = write_rows(tmp_path / "in.jsonl", [{"prompt": f"question {i} [slow]"} for i in range(40)])
    d = ChatDouble(slow_s=30).start()
    try:
        proc = regenerate("--url", d.url, "--input", str(src), "--output", str(tmp_path / "out"),
                          "--concurrency", "2", "--timeout-s", "0.3", timeout=90)
    finally:
        d.stop()
    assert proc.returncode == 1, proc.stderr
    line = next(ln for ln in proc.stderr.splitlines() if ln.startswith("regenerate: error:"))
    assert "the last 8 rows all failed (timeout: no whole answer within timeout_s 0.3 s)" in line
    assert "the server answers probes but not chats" in line
    assert len(index_rows(tmp_path / "out")) == 8


def test_a_server_that_never_gets_ready_is_a_failure_within_ready_timeout_s(tmp_path):
    src = write_rows(tmp_path / "in.jsonl", [{"prompt": "question"}])
    d = ChatDouble().start()
    d.hang = True
    try:
        proc = regenerate("--url", d.url, "--input", str(src), "--output", str(tmp_path / "out"),
                          "--ready-timeout-s", "1", timeout=90)
    finally:
        d.hang = False
        d.stop()
    assert proc.returncode == 1
    assert "not ready within ready_timeout_s 1 s" in proc.stderr and "Traceback" not in proc.stderr


def test_answers_made_with_other_settings_are_not_mixed_in(double, tmp_path):
    src = write_rows(tmp_path / "in.jsonl", [{"prompt": "hello"}])
    out = tmp_path / "out"
    assert regenerate("--url", double.url, "--input", str(src), "--output", str(out)).returncode == 0
    proc = regenerate("--url", double.url, "--input", str(src), "--output", str(out), "--temperature", "0.7")
    assert proc.returncode == 2
    assert f"output {out} holds answers made with temperature = 0.0; this run has 0.7" in proc.stderr


def test_hf_generate_on_the_real_target_answers_paris(smollm2_dir, tmp_path):
    src = write_rows(tmp_path / "in.jsonl", [{"prompt": "What is the capital of France?"}])
    out = tmp_path / "out"
    proc = regenerate("--target", str(smollm2_dir), "--input", str(src), "--output", str(out),
                      "--max-tokens", "16", "--device", "cpu", timeout=300)
    assert proc.returncode == 0, proc.stderr
    [row] = read_out(out)
    assert row["messages"][0] == {"role": "user", "content": "What is the capital of France?"}
    assert "Paris" in row["messages"][1]["content"], row
    assert "engine hf" in proc.stdout


def test_a_pipeline_regenerate_waits_for_its_target_server_like_bench(ws: WS):
    ws.write("""
    [target]
    path = "models/target"

    [stages.serve]
    op = "serve"
    params = { port = 39123, mode = "target" }

    [stages.spec]
    op = "serve"
    params = { port = 39124, mode = "speculative", drafter = "runs/export" }

    [stages.regenerate]
    op = "regenerate"
    depends_on = ["serve"]
    params = { input = "prompts.jsonl", output = "data/regenerated", server = "serve" }

    [stages.wrong]
    op = "regenerate"
    params = { input = "prompts.jsonl", output = "data/wrong", server = "spec" }
    """)
    proc = ws.cli("run", "regenerate", check=2)
    assert "depends on serve stage 'serve', which never ran" in proc.stderr
    proc = ws.cli("run", "wrong", check=3)
    assert "stages.wrong.params.server: serve stage 'spec' has mode 'speculative'; server needs a 'target' server" \
        in proc.stderr


def test_the_console_shows_a_regenerate_runs_progress_and_result(ws: WS, double):
    write_rows(ws.root / "prompts.jsonl", [{"prompt": f"question {i}"} for i in range(30)])
    ws.write(f"""
    [target]
    path = "models/target"

    [stages.regenerate]
    op = "regenerate"
    params = {{ input = "prompts.jsonl", output = "data/regenerated", url = "{double.url}", concurrency = 2 }}

    [stages.prepare]
    op = "prepare"
    depends_on = ["regenerate"]
    params = {{ input = "data/regenerated/conversations.jsonl", output = "data/prepared" }}
    """)
    proc = ws.cli("run", "regenerate", check=0)
    assert "disk: estimate" in proc.stdout and "regenerate's rule" in proc.stdout
    ws.wait_status("regenerate", ("succeeded",), timeout=60)
    snap = json.loads(ws.cli("status", "--json", "--no-gpus").stdout)
    st = next(s for s in snap["stages"] if s["name"] == "regenerate")
    assert (st["log"]["progress_done"], st["log"]["progress_total"], st["log"]["rate_unit"]) == (30, 30, "rows/s")
    assert st["result"]["answered"] == 30
    assert "30 of 30 rows answered (30 turns," in ws.cli("status", "--no-gpus").stdout
