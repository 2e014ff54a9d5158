"""What an engine of regenerate answers, and one row answered turn by turn.

An engine (server.ChatServer through SGLang, hf.HFGenerator here) has
`chat(messages) -> Answer`; a row's failure is RowFailed with its kind (one of
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


def answer_row(engine, row: PromptRow) -> dict:
    """The row's journal record: each user turn answered in turn with the history
    generated so far (the row's old assistant turns are dropped), or its failure.
    ConnectionLost passes through."""
    users = row.users
    base = {"row": row.index, "id": row.id}
    if not users:
        return {**base, "failed": "no_user_turn", "detail": "the row has no user turn", "turn": 0}
    history = [dict(row.system)] if row.system else []
    tokens = 0
    for turn, text in enumerate(users):
        history.append({"role": "user", "content": text})
        try:
            answer = engine.chat(list(history))
        except RowFailed as exc:
            return {**base, "failed": exc.kind, "detail": exc.detail, "turn": turn}
        history.append({"role": "assistant", "content": answer.text})
        tokens += answer.completion_tokens
    return {**base, "messages": history, "turns": len(users), "completion_tokens": tokens}
