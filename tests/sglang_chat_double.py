"""SGLang's OpenAI-compatible chat endpoint on the test double (tests/sglang_double.py).

Mirrored from the installed sglang 0.5.23, python/sglang/srt/entrypoints/openai/:
- protocol.py: ChatCompletionRequest (`messages`, `model`, `temperature`,
  `top_p`, `max_tokens`, `seed`, `stream`) and ChatCompletionResponse
  `{"id", "object": "chat.completion", "created", "model", "choices": [{"index",
  "message": {"role": "assistant", "content", ...}, "finish_reason",
  "matched_stop"}], "usage": {"prompt_tokens", "total_tokens",
  "completion_tokens", ...}}`;
- serving_base.py create_error_response: ErrorResponse `{"object": "error",
  "message", "type", "param", "code"}`, 400 "BadRequest" for a ValueError
  (the context-length refusals of managers/tokenizer_manager.py
  _validate_one_request: "The input (N tokens) is longer than the model's
  context length (C tokens)."), 500 "InternalServerError" with "Internal
  server error: ..." for any other exception.

What is modelled, not mirrored: the answer. It is a fixed function of the
conversation so far (greedy is deterministic), one word a token, cut at
max_tokens ("length") or ended ("stop"); a prompt's tokens are its words.
Faults by a marker in the last user turn: `[empty]` an empty answer, `[500]`
an internal error, `[slow]` an answer after `slow_s`.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
import uuid

from tests.sglang_double import Double

WORDS = ("the", "answer", "is", "plain", "and", "short", "so", "it", "ends", "here", "with", "a", "word")


def answer_words(messages: list[dict], n_max: int) -> tuple[list[str], str]:
    """The double's greedy answer to `messages`: (words, finish_reason)."""
    seed = hashlib.sha256(json.dumps(messages, sort_keys=True).encode()).digest()
    length = 3 + seed[0] % 12
    words = [WORDS[b % len(WORDS)] for b in seed[1:1 + length]]
    return (words[:n_max], "length") if length > n_max else (words, "stop")


class ChatDouble(Double):
    def __init__(self, *a, context_len: int = 4096, chat_s: float = 0.0, slow_s: float = 30.0, **kw):
        super().__init__(*a, **kw)
        self.status = "Up"
        self.context_len, self.chat_s, self.slow_s = context_len, chat_s, slow_s
        self.chats: list[dict] = []         # every chat request's body, in arrival order
        self.chat_lock = threading.Lock()

    def handle(self, h, method: str) -> None:
        if h.path.split("?", 1)[0] != "/v1/chat/completions" or method != "POST" or self.hang:
            return super().handle(h, method)
        self.paths.append("/v1/chat/completions")
        length = int(h.headers.get("Content-Length") or 0)
        try:
            req = json.loads(h.rfile.read(length) or b"{}")
        except ValueError:
            return self._error(h, 400, "BadRequest", "invalid JSON")
        with self.chat_lock:
            self.chats.append(req)
        messages = req.get("messages") or []
        prompt_tokens = sum(len(str(m.get("content", "")).split()) + 4 for m in messages)
        if prompt_tokens >= self.context_len:
            return self._error(h, 400, "BadRequest", f"The input ({prompt_tokens} tokens) is longer than the "
                                                     f"model's context length ({self.context_len} tokens).")
        last = str(messages[-1].get("content", "")) if messages else ""
        if "[500]" in last:
            return self._error(h, 500, "InternalServerError", "Internal server error: scheduler exploded")
        if "[slow]" in last:
            time.sleep(self.slow_s)
        time.sleep(self.chat_s)
        words, finish = answer_words(messages, int(req.get("max_tokens") or 16))
        text = "" if "[empty]" in last else " ".join(words)
        body = {"id": uuid.uuid4().hex, "object": "chat.completion", "created": int(time.time()),
                "model": req.get("model", "default"),
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text, "reasoning_content": None,
                                                     "tool_calls": None},
                             "logprobs": None, "finish_reason": finish, "matched_stop": 2 if finish == "stop" else None}],
                "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + len(words),
                          "completion_tokens": len(words), "prompt_tokens_details": None, "reasoning_tokens": 0}}
        return self._send(h, 200, json.dumps(body).encode())

    def _error(self, h, code: int, kind: str, message: str) -> None:
        body = {"object": "error", "message": message, "type": kind, "param": None, "code": code}
        self._send(h, code, json.dumps(body).encode())
