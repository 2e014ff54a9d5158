"""What an engine of regenerate answers, and one row answered turn by turn.

An engine (server.ChatServer through SGLang, hf.HFGenerator here) has
`chat(messages, n) -> [Answer]` (n sampled answers, at least one); a row's failure is RowFailed with its kind (one of
spec.FAILURE_KINDS); a connection that is gone is ConnectionLost, after which
the runner asks whether the server still answers at all.
"""

from __future__ import annotations

from dataclasses import dataclass

from ops.prompts import PromptRow


@dataclass(frozen=True)
class Answer:
    text: str
    completion_tokens: int
    prompt_tokens: int
    finish_reason: str | None


class RowFailed(Exception):
    def __init__(self, kind: str, detail: str):
        super().__init__(f"{kind}: {detail}")
        self.kind, self.detail = kind, detail


class ConnectionLost(Exception):
    """No HTTP answer at all (refused, reset): the server may be gone."""


def answer_row(engine, row: PromptRow, n: int = 1) -> dict:
    """The row's journal record: each user turn answered in turn in the context of the
    target's own earlier answers (turn 2 is asked with user 1, the answer made to it, user
    2; the row's old assistant turns are dropped), or its failure. ConnectionLost passes.

    n > 1: the first turn is asked for n sampled answers, and each becomes its own
    conversation whose later turns follow that answer: {"samples": [messages, ...]}. A
    sample whose later turn fails is left out (counted in "dropped_samples"); the row
    fails only when none is left. n = 1: {"messages": [...]}, as the journal always had."""
    users = row.users
    base = {"row": row.index, "id": row.id}
    if not users:
        return {**base, "failed": "no_user_turn", "detail": "the row has no user turn", "turn": 0}
    start = ([dict(row.system)] if row.system else []) + [{"role": "user", "content": users[0]}]
    try:
        firsts = engine.chat(list(start), n)
    except RowFailed as exc:
        return {**base, "failed": exc.kind, "detail": exc.detail, "turn": 0}
    samples, failure = [], None
    for first in firsts[:n]:
        history = start + [{"role": "assistant", "content": first.text}]
        tokens = first.completion_tokens
        try:
            for text in users[1:]:
                history.append({"role": "user", "content": text})
                [answer] = engine.chat(list(history), 1)[:1]
                history.append({"role": "assistant", "content": answer.text})
                tokens += answer.completion_tokens
        except RowFailed as exc:
            failure = failure or {"failed": exc.kind, "detail": exc.detail,
                                  "turn": sum(1 for m in history if m["role"] == "user") - 1}
            continue
        samples.append((history, tokens))
    if not samples:
        return {**base, **failure}
    if n == 1:
        [(history, tokens)] = samples
        return {**base, "messages": history, "turns": len(users), "completion_tokens": tokens}
    out = {**base, "samples": [h for h, _ in samples], "turns": len(users) * len(samples),
           "completion_tokens": sum(t for _, t in samples)}
    if len(samples) < n:
        out.update(dropped_samples=n - len(samples), dropped=failure)
    return out
