"""prepare: the loss mask, both input forms, truncation counts, bad inputs, the spec.

Runs the real stage (in-process through run_main, and once as a subprocess)
with a byte-level BPE tokenizer trained here on the demo corpus generator.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ops.common import run_main
from ops.demo.corpus import generate_rows, row_texts
from ops.demo.tokenizer import build_tokenizer, save_tokenizer
from ops.prepare.__main__ import main as prepare_main
from ops.prepare.output import load_samples
from ops.prepare.spec import SPEC
from ops.spec import EstimateContext

REPO = Path(__file__).resolve().parents[1]

LLAMA3_STYLE = (
    "{{ bos_token }}{% for m in messages %}<|im_start|>{{ m['role'] }}\n\n"
    "{{ m['content'] | trim }}<|im_end|>{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n\n{% endif %}"
)


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory) -> Path:
    rows = generate_rows(seed=7, n=60)
    texts = [t for r in rows for t in row_texts(r)] + ["system\nuser\nassistant\n"] * 20
    d = tmp_path_factory.mktemp("tok")
    save_tokenizer(build_tokenizer(texts, vocab_size=400), d)
    return d


@pytest.fixture(scope="module")
def tokenizer(tok_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tok_dir))


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def run(args: list[str]) -> int:
    return run_main(prepare_main, [str(a) for a in args], prog="prepare")


def samples(out: Path) -> list[tuple[np.ndarray, np.ndarray]]:
    arr = load_samples(out)
    o = arr["offsets"]
    return [(arr["input_ids"][o[i]:o[i + 1]], arr["loss_mask"][o[i]:o[i + 1]]) for i in range(len(o) - 1)]


def masked_runs(ids: np.ndarray, mask: np.ndarray) -> list[np.ndarray]:
    """The contiguous masked stretches of one sample."""
    runs, start = [], None
    for i, m in enumerate(list(mask) + [0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            runs.append(ids[start:i])
            start = None
    return runs


CONV = [("system", "You answer briefly and exactly."),
        ("user", "What is 3 plus 4?"), ("assistant", "3 plus 4 is 7."),
        ("user", "Reverse the list: red, plum."), ("assistant", "The reversed list is: plum, red.")]
SHAREGPT_FROM = {"system": "system", "user": "human", "assistant": "gpt"}


def test_mask_decodes_to_exactly_the_assistant_turns_in_both_forms(tmp_path, tok_dir, tokenizer):
    rows = generate_rows(seed=3, n=30, long_every=0, no_assistant_every=0)
    rows.append({"conversations": [{"from": SHAREGPT_FROM[r], "value": c} for r, c in CONV]})
    rows.append({"messages": [{"role": r, "content": c} for r, c in CONV]})
    inp = write_jsonl(tmp_path / "in.jsonl", rows)
    assert run(["--input", inp, "--output", tmp_path / "out", "--tokenizer", tok_dir]) == 0
    got = samples(tmp_path / "out")
    assert len(got) == len(rows)
    for row, (ids, mask) in zip(rows, got):
        turns = row.get("conversations") or row.get("messages")
        expected = [t.get("value", t.get("content")) for t in turns
                    if t.get("from", t.get("role")) in ("gpt", "assistant")]
        decoded = [tokenizer.decode(r) for r in masked_runs(ids, mask)]
        assert decoded == [a + "<|im_end|>" for a in expected]
        assert ids[0] == tokenizer.bos_token_id and mask[0] == 0
    # the same conversation in the ShareGPT and the OpenAI form gives the same sample
    assert np.array_equal(got[-1][0], got[-2][0]) and np.array_equal(got[-1][1], got[-2][1])
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["status"] == "complete" and summary["samples"] == len(rows)
    assert summary["masked_tokens"] == int(sum(m.sum() for _, m in got))
    assert summary["total_tokens"] == int(sum(len(i) for i, _ in got))
    assert not list((tmp_path / "out").glob("*.tmp"))


def test_mask_with_another_template_end_of_turn_and_trimmed_content(tmp_path, tok_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tok_dir))
    tokenizer.chat_template = LLAMA3_STYLE
    tok2 = tmp_path / "tok2"
    tokenizer.save_pretrained(str(tok2))
    rows = [{"messages": [{"role": "user", "content": "Say assistant."},
                          {"role": "assistant", "content": "  assistant  "},
                          {"role": "user", "content": "Count from 1 to 3."},
                          {"role": "assistant", "content": "1, 2, 3."}]}]
    inp = write_jsonl(tmp_path / "in.jsonl", rows)
    assert run(["--input", inp, "--output", tmp_path / "out", "--tokenizer", tok2]) == 0
    (ids, mask), = samples(tmp_path / "out")
    # the content "assistant" also appears in the role header: only the turn is masked
    assert [tokenizer.decode(r) for r in masked_runs(ids, mask)] == ["assistant<|im_end|>", "1, 2, 3.<|im_end|>"]


def test_a_template_that_refuses_a_row_drops_it_with_the_reason(tmp_path, tok_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tok_dir))
    tokenizer.chat_template = (
        "{% if messages[0]['role'] == 'assistant' %}{{ raise_exception('Conversations must not start with the assistant') }}"
        "{% endif %}" + tokenizer.chat_template)
    strict = tmp_path / "strict"
    tokenizer.save_pretrained(str(strict))
    rows = generate_rows(seed=3, n=4, long_every=0, no_assistant_every=0)
    rows.insert(2, {"messages": [{"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Hi."},
                                 {"role": "assistant", "content": "Bye."}]})
    inp = write_jsonl(tmp_path / "in.jsonl", rows)
    assert run(["--input", inp, "--output", tmp_path / "out", "--tokenizer", strict]) == 0
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["samples"] == 4 and summary["dropped"]["reasons"] == {"template_error": 1}
    assert summary["first_template_error"].startswith("line 3: ")
    assert "Conversations must not start with the assistant" in summary["first_template_error"]


def test_truncation_counts_and_histograms(tmp_path, tok_dir):
    rows = generate_rows(seed=5, n=40, long_every=4, no_assistant_every=0)
    inp = write_jsonl(tmp_path / "in.jsonl", rows)
    assert run(["--input", inp, "--output", tmp_path / "full", "--tokenizer", tok_dir, "--max-seq-len", 100000]) == 0
    lengths = np.array([len(i) for i, _ in samples(tmp_path / "full")])
    cut_at = int(np.percentile(lengths, 80))
    assert run(["--input", inp, "--output", tmp_path / "cut", "--tokenizer", tok_dir, "--max-seq-len", cut_at]) == 0
    summary = json.loads((tmp_path / "cut" / "summary.json").read_text())
    over = lengths[lengths > cut_at]
    assert summary["truncated"] == len(over) > 0
    assert summary["tokens_cut"] == int((over - cut_at).sum())
    assert summary["total_tokens"] == int(np.minimum(lengths, cut_at).sum())
    assert summary["tokens_before_truncation"] == int(lengths.sum())
    kept = samples(tmp_path / "cut")
    assert max(len(i) for i, _ in kept) == cut_at
    # the kept prefix is the untruncated sample's prefix, mask included
    for (fi, fm), (ci, cm) in zip(samples(tmp_path / "full"), kept):
        assert np.array_equal(fi[:cut_at], ci) and np.array_equal(fm[:cut_at], cm)
    hist = summary["length_histogram"]
    assert cut_at in hist["edges"]
    assert sum(hist["before"]) == sum(hist["after"]) == len(rows)
    # after truncation nothing lies above max_seq_len
    assert sum(hist["after"][hist["edges"].index(cut_at) + 1:]) == 0
    assert sum(hist["before"][hist["edges"].index(cut_at) + 1:]) == len(over)


def test_drops_are_counted_and_all_dropped_is_bad_input(tmp_path, tok_dir, capsys):
    rows = generate_rows(seed=1, n=6, long_every=0, no_assistant_every=0)
    rows.append({"messages": [{"role": "user", "content": "Anyone there?"}]})
    rows.append({"conversations": []})
    inp = write_jsonl(tmp_path / "in.jsonl", rows)
    assert run(["--input", inp, "--output", tmp_path / "out", "--tokenizer", tok_dir]) == 0
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["samples"] == 6
    assert summary["dropped"] == {"count": 2, "reasons": {"empty": 1, "no_assistant_turn": 1}}
    assert load_samples(tmp_path / "out")["source_line"].tolist() == [1, 2, 3, 4, 5, 6]

    only_users = write_jsonl(tmp_path / "users.jsonl", rows[-2:])
    capsys.readouterr()
    assert run(["--input", only_users, "--output", tmp_path / "out2", "--tokenizer", tok_dir]) == 2
    err = capsys.readouterr().err
    assert "all 2 conversations were dropped" in err and "no_assistant_turn: 1" in err
    assert not (tmp_path / "out2" / "summary.json").exists()


@pytest.mark.parametrize("bad_line, message", [
    ('{"messages": [{"role": "user", "content": "hi"}', "in.jsonl:3: not valid JSON"),
    ('{"conversations": [{"from": "robot", "value": "hi"}]}', "in.jsonl:3: conversations[0]: unknown from 'robot'"),
    ('{"messages": [{"role": "user"}]}', "in.jsonl:3: messages[0]: missing 'content'"),
    ('{"text": "hello"}', "in.jsonl:3: expected a 'conversations' (ShareGPT) or 'messages' (OpenAI) list"),
])
def test_malformed_line_names_file_and_line(tmp_path, tok_dir, capsys, bad_line, message):
    good = json.dumps({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]})
    inp = write_jsonl(tmp_path / "in.jsonl", [good, good, bad_line, good])
    assert run(["--input", inp, "--output", tmp_path / "out", "--tokenizer", tok_dir]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_missing_tokenizer_and_input(tmp_path, tok_dir, capsys):
    inp = write_jsonl(tmp_path / "in.jsonl", generate_rows(seed=1, n=3))
    assert run(["--input", inp, "--output", tmp_path / "out", "--tokenizer", tmp_path / "nope"]) == 2
    assert f"tokenizer directory {tmp_path / 'nope'}: no such directory" in capsys.readouterr().err
    assert run(["--input", tmp_path / "missing.jsonl", "--output", tmp_path / "out", "--tokenizer", tok_dir]) == 2
    assert f"input {tmp_path / 'missing.jsonl'}: no such file" in capsys.readouterr().err
    # --target stands in for --tokenizer
    assert run(["--input", inp, "--output", tmp_path / "out", "--target", tok_dir]) == 0


@pytest.mark.slow  # two spawned workers each import transformers
def test_worker_processes_give_the_same_output(tmp_path, tok_dir):
    rows = generate_rows(seed=9, n=600)
    inp = write_jsonl(tmp_path / "in.jsonl", rows)
    assert run(["--input", inp, "--output", tmp_path / "one", "--tokenizer", tok_dir, "--workers", 1,
                "--max-seq-len", 200]) == 0
    assert run(["--input", inp, "--output", tmp_path / "two", "--tokenizer", tok_dir, "--workers", 2,
                "--max-seq-len", 200]) == 0
    assert (tmp_path / "one" / "samples.safetensors").read_bytes() == (tmp_path / "two" / "samples.safetensors").read_bytes()
    s1 = json.loads((tmp_path / "one" / "summary.json").read_text())
    s2 = json.loads((tmp_path / "two" / "summary.json").read_text())
    assert s2["workers"] == 2
    # the disk estimate (from the input's size) covers what was written
    ctx = EstimateContext(root=tmp_path, params={"input": "in.jsonl", "output": "one"}, target={})
    assert SPEC.estimate_bytes(ctx) >= (tmp_path / "one" / "samples.safetensors").stat().st_size
    for key in ("samples", "dropped", "truncated", "tokens_cut", "total_tokens", "masked_tokens", "length_histogram"):
        assert s1[key] == s2[key]


def test_as_a_program_through_the_spec_argv(tmp_path, tok_dir):
    inp = write_jsonl(tmp_path / "in.jsonl", generate_rows(seed=2, n=50))
    argv = SPEC.argv({"input": str(inp), "output": str(tmp_path / "out"), "limit": 20},
                     target_path=str(tok_dir), python=sys.executable)
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "20/20 [" in proc.stdout and "conv/s]" in proc.stdout
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["rows"] == 20 and summary["status"] == "complete"
    assert SPEC.partial_files(tmp_path / "out") == []
    ctx = EstimateContext(root=tmp_path, params={"input": "in.jsonl", "output": "out"}, target={})
    assert SPEC.expected_samples(ctx) == summary["samples"]
    # with --limit the estimate scales with the share of rows read
    limited = EstimateContext(root=tmp_path, params={"input": "in.jsonl", "output": "new", "limit": 20}, target={})
    assert SPEC.expected_samples(limited) == 20
    assert SPEC.estimate_bytes(limited) == pytest.approx(SPEC.estimate_bytes(ctx) * 20 / 50, rel=0.01)
    assert SPEC.estimate_bytes(limited) >= (tmp_path / "out" / "samples.safetensors").stat().st_size
    # an interrupted rerun: summary gone, samples left behind -> partial
    (tmp_path / "out" / "summary.json").unlink()
    (tmp_path / "out" / "samples.safetensors.tmp").write_bytes(b"x")
    assert sorted(p.name for p in SPEC.partial_files(tmp_path / "out")) == ["samples.safetensors", "samples.safetensors.tmp"]


def test_spec_imports_no_torch():
    code = "import sys, ops.prepare.spec; sys.exit(any(m in sys.modules for m in ('torch', 'transformers', 'tokenizers')))"
    assert subprocess.run([sys.executable, "-c", code], cwd=REPO).returncode == 0


SLOW_TOKENIZER_MODULE = '''
"""A slow tokenizer shipped with its model, as Kimi-K2's is: a Python
PreTrainedTokenizer around a BPE engine (tiktoken there, the tokenizers
library's BPE here), with no character offsets."""
import json

from tokenizers import Tokenizer
from transformers import PreTrainedTokenizer


class SlowBPETokenizer(PreTrainedTokenizer):
    vocab_files_names = {"vocab_file": "bpe.json"}
    model_input_names = ["input_ids", "attention_mask"]

    def __init__(self, vocab_file, **kwargs):
        self.bpe = Tokenizer.from_file(vocab_file)
        self.vocab = self.bpe.get_vocab(with_added_tokens=True)
        self.inverse = {i: t for t, i in self.vocab.items()}
        super().__init__(**kwargs)

    @property
    def vocab_size(self):
        return len(self.vocab)

    def get_vocab(self):
        return dict(self.vocab)

    def _tokenize(self, text, **kwargs):
        return self.bpe.encode(text, add_special_tokens=False).tokens

    def _convert_token_to_id(self, token):
        return self.vocab[token]

    def _convert_id_to_token(self, index):
        return self.inverse[index]

    def convert_tokens_to_string(self, tokens):
        return self.bpe.decoder.decode(tokens)
'''


def slow_copy(tok_dir: Path, dest: Path, chat_template: str | None = None) -> Path:
    """The same byte-level BPE behind a remote-code slow tokenizer:
    tokenization_slowbpe.py + its BPE file, no tokenizer.json (no offsets)."""
    spec = json.loads((tok_dir / "tokenizer.json").read_text())
    cfg = json.loads((tok_dir / "tokenizer_config.json").read_text())
    dest.mkdir()
    (dest / "bpe.json").write_text(json.dumps(spec))
    (dest / "tokenization_slowbpe.py").write_text(SLOW_TOKENIZER_MODULE)
    specials = [t["content"] for t in spec["added_tokens"]]
    named = (cfg["bos_token"], cfg["eos_token"], cfg["pad_token"])
    template = chat_template or cfg.get("chat_template")
    if template is None and (tok_dir / "chat_template.jinja").exists():
        template = (tok_dir / "chat_template.jinja").read_text()
    (dest / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "SlowBPETokenizer",
        "auto_map": {"AutoTokenizer": ["tokenization_slowbpe.SlowBPETokenizer", None]},
        "bos_token": cfg["bos_token"], "eos_token": cfg["eos_token"], "pad_token": cfg["pad_token"],
        "additional_special_tokens": [t for t in specials if t not in named],
        "clean_up_tokenization_spaces": False, "chat_template": template,
    }))
    return dest


def test_a_slow_remote_code_tokenizer_gives_the_fast_ones_samples(tmp_path, tok_dir):
    # Kimi-K2's tokenizer is slow (tiktoken, trust_remote_code): no offsets. The
    # pieces path must give exactly what the offsets path gives on the same BPE.
    from transformers import AutoTokenizer

    slow = slow_copy(tok_dir, tmp_path / "slow")
    loaded = AutoTokenizer.from_pretrained(str(slow), trust_remote_code=True)
    assert not loaded.is_fast
    rows = generate_rows(seed=5, n=40, long_every=0, no_assistant_every=0)
    rows.append({"messages": [{"role": r, "content": c} for r, c in CONV]})
    rows.append({"messages": [{"role": "user", "content": "Say nothing."}, {"role": "assistant", "content": ""}]})
    inp = write_jsonl(tmp_path / "in.jsonl", rows)
    assert run(["--input", inp, "--output", tmp_path / "fast", "--tokenizer", tok_dir]) == 0
    assert run(["--input", inp, "--output", tmp_path / "slow_out", "--tokenizer", slow, "--trust-remote-code"]) == 0
    fast_s, slow_s = samples(tmp_path / "fast"), samples(tmp_path / "slow_out")
    assert len(slow_s) == len(fast_s) == len(rows)      # the empty answer keeps its end-of-turn token
    for (fi, fm), (si, sm) in zip(fast_s, slow_s):
        assert np.array_equal(fi, si) and np.array_equal(fm, sm)
    # Without --trust-remote-code the directory's code is not run: a clear error.
    assert run(["--input", inp, "--output", tmp_path / "refused", "--tokenizer", slow]) == 2
    assert not (tmp_path / "refused").exists()


def test_a_slow_tokenizer_whose_pieces_do_not_line_up_drops_the_row_with_the_reason(tmp_path, tok_dir, capsys):
    # No special token between the header and the content: the content's first
    # word merges with the header's space, so a cut there would change the tokens.
    glued = ("{{ bos_token }}{% for m in messages %}<|im_start|>{{ m['role'] }} {{ m['content'] }}<|im_end|>"
             "{% endfor %}")
    slow = slow_copy(tok_dir, tmp_path / "slow", chat_template=glued)
    rows = [{"messages": [{"role": "user", "content": "Count."}, {"role": "assistant", "content": "plus 4"}]}]
    inp = write_jsonl(tmp_path / "in.jsonl", rows)     # " plus" is one token, "plus" two
    assert run(["--input", inp, "--output", tmp_path / "out", "--tokenizer", slow, "--trust-remote-code"]) == 2
    err = capsys.readouterr().err
    assert "all 1 conversations were dropped (mask_unaligned: 1)" in err, err
    assert "line 1: the tokens of the text cut at the assistant turns differ" in err
