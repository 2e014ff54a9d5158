"""SGLang's OpenAI-compatible chat endpoint on the test double (tests/sglang_double.py).

Mirrored from the installed sglang 0.5.23, python/sglang/srt/entrypoints/openai/:
- protocol.py: ChatCompletionRequest (`messages`, `model`, `temperature`,
  `top_p`, `max_tokens`, `n` (default 1), `seed`, `stream`) and
  ChatCompletionResponse `{"id", "object": "chat.completion", "created",
  "model", "choices": [{"index", "message": {"role": "assistant", "content",
  ...}, "finish_reason", "matched_stop"}], "usage": {"prompt_tokens",
  "total_tokens", "completion_tokens", ...}}`;
- serving_chat.py _build_chat_response: one choice per sample, `index` 0..n-1
  in order; usage_processor.py calculate_response_usage: `completion_tokens`
  summed over the n choices, `prompt_tokens` counted once per prompt;
- serving_base.py create_error_response: ErrorResponse `{"object": "error",
  "message", "type", "param", "code"}`, 400 "BadRequest" for a ValueError
  (the context-length refusals of managers/tokenizer_manager.py
  _validate_one_request: "The input (N tokens) is longer than the model's
  context length (C tokens)." and "Requested token count exceeds the model's
  maximum context length of C tokens. You requested a total of T tokens: N
  tokens from the input messages and M tokens for the completion. ..."),
  500 "InternalServerError" with "Internal server error: ..." for any other
  exception.

What is modelled, not mirrored: the answer. It is a fixed function of the
conversation so far (greedy is deterministic), one word a token, cut at
max_tokens ("length") or ended ("stop"); a prompt's tokens are its words.
Sampled (temperature > 0): a fixed function of the conversation, the
temperature, top_p, seed and the choice's index, so n choices differ.
Faults by a marker in the last user turn: `[empty]` an empty answer, `[500]`
an internal error, `[slow]` an answer after `slow_s`, `[surrogate]` an answer
holding a lone surrogate escape (`\\ud800`, what a byte-level detokenizer cut
mid-character can emit), `[drip]` a 200 whose body trickles one byte every
`drip_s` without end (a stalled proxy; SGLang itself sends a whole JSON body).
`die_after`: after that many chats the server answers nothing more and closes
(a crashed server: connections dropped, then refused).
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
import uuid

from tests.sglang_double import Double

WORDS = ("the", "answer", "is", "plain", "and", "short", "so", "it", "ends", "here", "with", "a", "word")


def answer_words(messages: list[dict], n_max: int, sample: tuple | None = None) -> tuple[list[str], str]:
    """The double's answer to `messages`: (words, finish_reason). `sample`: None for
    greedy, else (temperature, top_p, seed, choice index) of a sampled answer."""
    key = json.dumps(messages, sort_keys=True) + ("" if sample is None else json.dumps(list(sample)))
    seed = hashlib.sha256(key.encode()).digest()
    length = 3 + seed[0] % 12
    words = [WORDS[b % len(WORDS)] for b in seed[1:1 + length]]
    return (words[:n_max], "length") if length > n_max else (words, "stop")


class ChatDouble(Double):
    def __init__(self, *a, context_len: int = 4096, chat_s: float = 0.0, slow_s: float = 30.0,
                 drip_s: float = 0.05, die_after: int | None = None, **kw):
        super().__init__(*a, **kw)
        # uvicorn's backlog (2048), not socketserver's 5: a burst of `concurrency` connections
        # on a loaded machine must queue, not be reset.
        self.server.socket.listen(2048)
        self.status = "Up"
        self.context_len, self.chat_s, self.slow_s, self.drip_s = context_len, chat_s, slow_s, drip_s
        self.die_after = die_after
        self.dead = threading.Event()
        self.stopped = threading.Event()
        self.chats: list[dict] = []         # every chat request's body, in arrival order
        self.chat_lock = threading.Lock()

    def stop(self) -> None:
        self.stopped.set()
        super().stop()

    def _die(self) -> None:
        self.dead.set()
        threading.Thread(target=self.stop, daemon=True).start()

    def handle(self, h, method: str) -> None:
        if self.dead.is_set():
            h.close_connection = True       # no answer: the connection closes unanswered
            return None
        if h.path.split("?", 1)[0] != "/v1/chat/completions" or method != "POST" or self.hang:
            return super().handle(h, method)
        self.paths.append("/v1/chat/completions")
        length = int(h.headers.get("Content-Length") or 0)
        try:
            req = json.loads(h.rfile.read(length) or b"{}")
        except ValueError:
            return self._error(h, 400, "BadRequest", "invalid JSON")
        with self.chat_lock:
            if self.die_after is not None and len(self.chats) >= self.die_after:
                self._die()
                h.close_connection = True
                return None
            self.chats.append(req)
        messages = req.get("messages") or []
        prompt_tokens = sum(len(str(m.get("content", "")).split()) + 4 for m in messages)
        if prompt_tokens >= self.context_len:
            return self._error(h, 400, "BadRequest", f"The input ({prompt_tokens} tokens) is longer than the "
                                                     f"model's context length ({self.context_len} tokens).")
        max_tokens = int(req.get("max_tokens") or 16)
        if prompt_tokens + max_tokens > self.context_len:
            return self._error(h, 400, "BadRequest", (
                f"Requested token count exceeds the model's maximum context length of {self.context_len} tokens. "
                f"You requested a total of {prompt_tokens + max_tokens} tokens: {prompt_tokens} tokens from the "
                f"input messages and {max_tokens} tokens for the completion. Please reduce the number of tokens "
                f"in the input messages or the completion to fit within the limit."))
        last = str(messages[-1].get("content", "")) if messages else ""
        if "[500]" in last:
            return self._error(h, 500, "InternalServerError", "Internal server error: scheduler exploded")
        if "[drip]" in last:
            return self._drip(h)
        if "[slow]" in last:
            time.sleep(self.slow_s)
        time.sleep(self.chat_s)
        temperature = float(req.get("temperature") if req.get("temperature") is not None else 1.0)
        choices, completion = [], 0
        for i in range(int(req.get("n") or 1)):
            sample = None if temperature == 0 else (temperature, req.get("top_p"), req.get("seed"), i)
            words, finish = answer_words(messages, max_tokens, sample)
            text = "" if "[empty]" in last else ("ok \ud800 bad" if "[surrogate]" in last else " ".join(words))
            completion += len(words)
            choices.append({"index": i, "message": {"role": "assistant", "content": text, "reasoning_content": None,
                                                    "tool_calls": None},
                            "logprobs": None, "finish_reason": finish,
                            "matched_stop": 2 if finish == "stop" else None})
        body = {"id": uuid.uuid4().hex, "object": "chat.completion", "created": int(time.time()),
                "model": req.get("model", "default"), "choices": choices,
                "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + completion,
                          "completion_tokens": completion, "prompt_tokens_details": None, "reasoning_tokens": 0}}
        return self._send(h, 200, json.dumps(body).encode())

    def _drip(self, h) -> None:
        """Headers at once, then one byte every drip_s until the client leaves or the double stops."""
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(1 << 30))
        h.end_headers()
        try:
            h.wfile.write(b"{")
            while not self.stopped.wait(self.drip_s):
                h.wfile.write(b" ")
                h.wfile.flush()
        except OSError:
            pass                            # the client gave up: so does the double
        h.close_connection = True

    def _error(self, h, code: int, kind: str, message: str) -> None:
        body = {"object": "error", "message": message, "type": kind, "param": None, "code": code}
        self._send(h, code, json.dumps(body).encode())
