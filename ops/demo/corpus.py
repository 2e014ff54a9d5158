"""The demo's synthetic conversation corpus (the input of the demo's prepare).

Generated from a seed with structure a small model can learn: every answer
follows from its question by a fixed rule (arithmetic, counting, reversing a
list, repeating a word, fixed facts, the next letter), so a briefly trained
target predicts the assistant's next tokens well and a drafter has something
real to learn. Rows mix the ShareGPT form (`conversations: [{from, value}]`)
and the OpenAI form (`messages: [{role, content}]`), like operators' data;
a few rows have no assistant turn, so prepare's drop counts show something.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from ops.common import TMP_SUFFIX

NUMBER_WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight",
                "nine", "ten", "eleven", "twelve"]
COLORS = ["red", "blue", "green", "yellow", "black", "white", "orange", "purple"]
FRUITS = ["apple", "banana", "cherry", "grape", "lemon", "mango", "peach", "plum"]
FACTS = {
    "the sky": "blue", "grass": "green", "snow": "white", "a lemon": "yellow",
    "coal": "black", "a cherry": "red", "an orange": "orange", "a plum": "purple",
}
SYSTEM_PROMPTS = ["You are a helpful assistant.", "You answer briefly and exactly."]
LETTERS = "abcdefghijklmnopqrstuvwxyz"


def _arithmetic(rng: random.Random) -> tuple[str, str]:
    a, b = rng.randint(0, 20), rng.randint(0, 20)
    if rng.random() < 0.5:
        return f"What is {a} plus {b}?", f"{a} plus {b} is {a + b}."
    a, b = max(a, b), min(a, b)
    return f"What is {a} minus {b}?", f"{a} minus {b} is {a - b}."


def _counting(rng: random.Random, long: bool = False) -> tuple[str, str]:
    start = rng.randint(1, 30)
    end = start + (rng.randint(60, 120) if long else rng.randint(3, 12))
    return (f"Count from {start} to {end}.",
            ", ".join(str(i) for i in range(start, end + 1)) + ".")


def _reverse(rng: random.Random) -> tuple[str, str]:
    items = rng.sample(COLORS + FRUITS, rng.randint(3, 6))
    return (f"Reverse the list: {', '.join(items)}.",
            f"The reversed list is: {', '.join(reversed(items))}.")


def _repeat(rng: random.Random) -> tuple[str, str]:
    word, n = rng.choice(FRUITS), rng.randint(2, 6)
    return f"Say {word} {NUMBER_WORDS[n]} times.", " ".join([word] * n) + "."


def _fact(rng: random.Random) -> tuple[str, str]:
    thing = rng.choice(sorted(FACTS))
    return f"What color is {thing}?", f"{thing[0].upper()}{thing[1:]} is {FACTS[thing]}."


def _next_letter(rng: random.Random) -> tuple[str, str]:
    i = rng.randrange(len(LETTERS) - 1)
    return (f"Which letter comes after {LETTERS[i]}?",
            f"The letter after {LETTERS[i]} is {LETTERS[i + 1]}.")


TASKS = (_arithmetic, _counting, _reverse, _repeat, _fact, _next_letter)


def _exchange(rng: random.Random, long: bool) -> tuple[str, str]:
    if long:
        return _counting(rng, long=True)
    return rng.choice(TASKS)(rng)


def generate_rows(seed: int = 0, n: int = 400, long_every: int = 25,
                  no_assistant_every: int = 150) -> list[dict]:
    """`n` conversation rows, deterministic for `seed`.

    Every `long_every`-th row counts far (hundreds of tokens) so a demo
    max_seq_len truncates it; every `no_assistant_every`-th row has only a
    user turn (prepare drops and counts it).
    """
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        turns: list[tuple[str, str]] = []
        system = rng.choice(SYSTEM_PROMPTS) if rng.random() < 0.3 else None
        for t in range(rng.choice((1, 1, 2, 3))):
            turns.append(_exchange(rng, long=(long_every and i % long_every == long_every - 1 and t == 0)))
        user_only = bool(no_assistant_every) and i % no_assistant_every == no_assistant_every - 1
        if i % 2 == 0:
            conv = [{"from": "system", "value": system}] if system else []
            for q, a in turns:
                conv.append({"from": rng.choice(("human", "human", "user")), "value": q})
                if not user_only:
                    conv.append({"from": rng.choice(("gpt", "gpt", "assistant")), "value": a})
            rows.append({"id": f"demo-{seed}-{i}", "conversations": conv})
        else:
            msgs = [{"role": "system", "content": system}] if system else []
            for q, a in turns:
                msgs.append({"role": "user", "content": q})
                if not user_only:
                    msgs.append({"role": "assistant", "content": a})
            rows.append({"id": f"demo-{seed}-{i}", "messages": msgs})
    return rows


def row_texts(row: dict) -> list[str]:
    """The turn texts of a row in either form (for training the tokenizer)."""
    if "conversations" in row:
        return [t["value"] for t in row["conversations"]]
    return [m["content"] for m in row["messages"]]


def write_corpus(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + TMP_SUFFIX)
    with open(tmp, "w") as fh:
        for row in rows:
            fh.write(json.dumps(row) + "\n")
    tmp.replace(path)
