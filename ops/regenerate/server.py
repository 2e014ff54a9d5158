"""regenerate through an SGLang server: OpenAI-compatible `/v1/chat/completions`.

What the server answers, read from sglang 0.5.23
(python/sglang/srt/entrypoints/openai/):
- protocol.py ChatCompletionRequest: `messages`, `model` (default "default"),
  `temperature` / `top_p` (None: the model's generation defaults, so both are
  always sent), `max_tokens`, `seed`, `stream`; ChatCompletionResponse:
  `choices[0].message.content`, `choices[0].finish_reason` ("stop", "length",
  "abort", ...), `usage.prompt_tokens` / `completion_tokens`;
- serving_base.py handle_request: a ValueError becomes HTTP 400 with an
  ErrorResponse `{"object": "error", "message", "type": "BadRequest", "code"}`,
  any other exception HTTP 500 ("Internal server error: ...");
- managers/tokenizer_manager.py _validate_one_request: a prompt at or over the
  context length is "The input (N tokens) is longer than the model's context
  length (C tokens).", prompt + max_tokens over it "Requested token count
  exceeds the model's maximum context length of C tokens. You requested a
  total of T tokens: N tokens from the input messages and M tokens for the
  completion. ..." (both 400; validate_total_tokens is on by default). The
  second is asked again once with max_tokens C - N: a late turn of a long
  conversation gets the room that is left rather than failing the row.
timeout_s bounds a whole request (connect, send, the answer's last byte): a
watchdog shuts the socket down at the deadline, so a server that trickles its
answer a byte at a time fails the row as timeout, as one that says nothing does
(a socket timeout alone bounds each read, not the request). An answer over
MAX_ANSWER_BYTES, or holding a lone surrogate, fails the row as server_error.
Standard library only (http.client), as bench's client.
"""

from __future__ import annotations

import http.client
import json
import re
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

from ops.conversations import lone_surrogate
from ops.regenerate.engine import Answer, ConnectionLost, RowFailed
from ops.readiness import HEALTH_ANSWER_S, HEALTH_SLEEP_S, Readiness

CHAT = "/v1/chat/completions"
CONTEXT_WORDS = ("context length", "context_length")
PROBE_TIMEOUT_S = 10.0
READY_POLL_S = 2.0
TOTAL_OVER = re.compile(r"maximum context length of (\d+) tokens\. You requested a total of \d+ tokens: "
                        r"(\d+) tokens from the input")
MAX_ANSWER_BYTES = 64 << 20     # a chat answer of max_tokens is far smaller; more is not an answer
READ_BYTES = 1 << 16
MAX_INFO_BYTES = 1 << 20        # /server_info is a few kB of resolved args


def decode_graph_note(info: object, concurrency: int) -> str | None:
    """Why `concurrency` requests in flight outrun the server's decode CUDA graphs, from /server_info's
    resolved cuda_graph_config.decode (SGLang 0.5.23 model_executor/cuda_graph_config.py PhaseConfig:
    backend, max_bs): a decode step of more requests than max_bs runs eagerly, launching every kernel of
    every layer from Python, which a small target's step is mostly made of (arg_groups/memory_hook.py
    sizes max_bs by the GPU's memory: 256 on an 80-160 GB card with tp < 4). None within it, or when
    the server does not say."""
    graphs = info.get("cuda_graph_config") if isinstance(info, dict) else None
    decode = graphs.get("decode") if isinstance(graphs, dict) else None
    if not isinstance(decode, dict):
        return None
    backend, max_bs = decode.get("backend"), decode.get("max_bs")
    if backend == "disabled":
        return (f"the server's decode CUDA graphs are off (server_info cuda_graph_config.decode.backend "
                f"'disabled'): every decode step runs eagerly")
    if isinstance(max_bs, int) and not isinstance(max_bs, bool) and 0 < max_bs < concurrency:
        return (f"concurrency {concurrency} is above the server's decode CUDA-graph batch size {max_bs} "
                f"(server_info cuda_graph_config.decode.max_bs): decode steps of more than {max_bs} requests "
                f"run without graphs; use concurrency {max_bs}, or give the server --cuda-graph-max-bs "
                f"{concurrency} (serve's extra_args)")
    return None


def _status(url: str, path: str, timeout: float) -> int:
    try:
        with urllib.request.urlopen(url.rstrip("/") + path, timeout=timeout) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except urllib.error.URLError as exc:
        raise exc.reason if isinstance(exc.reason, OSError) else OSError(str(exc.reason)) from None
    except http.client.HTTPException as exc:
        raise OSError(f"bad HTTP answer: {exc!r}") from None


class ChatServer:
    """One SGLang server's chat endpoint; chat() is safe from many threads."""

    engine = "sglang"

    def __init__(self, url: str, model: str, temperature: float, top_p: float, max_tokens: int,
                 seed: int | None, timeout_s: float):
        self.url = url.rstrip("/")
        self.body = {"model": model, "temperature": temperature, "top_p": top_p, "max_tokens": max_tokens,
                     "stream": False}
        if seed is not None:
            self.body["seed"] = seed
        self.timeout_s = timeout_s

    def wait_ready(self, ready_timeout_s: float, log) -> str:
        """Why the server is ready; ConnectionLost when it is not within ready_timeout_s."""
        t0 = time.monotonic()
        ready = Readiness(lambda path, t: _status(self.url, path, t), PROBE_TIMEOUT_S)
        said = None
        while True:
            left = t0 + ready_timeout_s - time.monotonic()
            ready.timeout = max(0.1, min(PROBE_TIMEOUT_S, left))
            ready.health_timeout = max(HEALTH_SLEEP_S + 1.0, min(HEALTH_ANSWER_S, left))
            ans = ready.probe()
            if ans.state in ("ready", "answering"):
                return ans.reason
            now = time.monotonic()
            if now - t0 >= ready_timeout_s:
                raise ConnectionLost(f"{self.url}: not ready within ready_timeout_s {ready_timeout_s:g} s: "
                                     f"{ans.reason}")
            if said is None or now - said >= 10:
                log(f"regenerate: waiting for {self.url} to be ready: {ans.reason} ({now - t0:.0f} s of "
                    f"{ready_timeout_s:g} s)")
                said = now
            time.sleep(min(READY_POLL_S, max(0.0, t0 + ready_timeout_s - now)))

    def graph_note(self, concurrency: int) -> str | None:
        """decode_graph_note of this server's /server_info; None when it does not answer as SGLang does."""
        try:
            with urllib.request.urlopen(self.url + "/server_info", timeout=PROBE_TIMEOUT_S) as resp:
                raw = resp.read(MAX_INFO_BYTES + 1)
            info = json.loads(raw) if len(raw) <= MAX_INFO_BYTES else None
        except (OSError, ValueError, http.client.HTTPException):
            return None
        return decode_graph_note(info, concurrency)

    def alive(self) -> str | None:
        """None when the server answers at all, else why not (one short probe)."""
        ans = Readiness(lambda path, t: _status(self.url, path, t), PROBE_TIMEOUT_S).probe(health=False)
        return None if ans.state in ("ready", "answering", "not_ready") else ans.reason

    def chat(self, messages: list[dict], n: int = 1) -> list[Answer]:
        """n answers to `messages`: one request with `n` choices (protocol.py ChatCompletionRequest.n;
        serving_chat.py answers choice `index` 0..n-1), or, with a seed, n requests of seed, seed + 1,
        ... (one seed for all n choices of a request could draw the same answer n times)."""
        if n > 1 and "seed" in self.body:
            out: list[Answer] = []
            for k in range(n):
                out += self._ask({**self.body, "seed": self.body["seed"] + k, "messages": messages})
            return out
        return self._ask({**self.body, **({"n": n} if n > 1 else {}), "messages": messages})

    def _ask(self, body: dict) -> list[Answer]:
        try:
            return parse_answers(*self.post(json.dumps(body).encode()), self.url + CHAT)
        except RowFailed as exc:
            over = TOTAL_OVER.search(exc.detail) if exc.kind == "context_overflow" else None
            room = int(over[1]) - int(over[2]) if over else 0
            if room < 1 or room >= body["max_tokens"]:
                raise
            body = {**body, "max_tokens": room}     # what is left of the context after this prompt
            return parse_answers(*self.post(json.dumps(body).encode()), self.url + CHAT)

    def post(self, data: bytes) -> tuple[int, bytes]:
        """(HTTP status, body) of one chat request, all of it within timeout_s."""
        where = urllib.parse.urlsplit(self.url)
        kind = http.client.HTTPSConnection if where.scheme == "https" else http.client.HTTPConnection
        conn = kind(where.hostname, where.port, timeout=self.timeout_s)
        expired = threading.Event()
        held: list[socket.socket] = []     # the response keeps the socket after conn lets go of it

        def expire() -> None:
            expired.set()
            for sock in held:
                try:
                    sock.shutdown(socket.SHUT_RDWR)         # a blocked read returns at once
                except OSError:
                    pass

        watchdog = threading.Timer(self.timeout_s, expire)
        watchdog.daemon = True
        watchdog.start()
        try:
            conn.connect()
            held.append(conn.sock)
            if expired.is_set():
                raise TimeoutError
            conn.request("POST", where.path.rstrip("/") + CHAT, body=data,
                         headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            chunks, size = [], 0
            while True:
                chunk = resp.read(READ_BYTES)
                if not chunk:
                    break
                size += len(chunk)
                if size > MAX_ANSWER_BYTES:
                    raise RowFailed("server_error", f"{self.url}{CHAT}: an answer over {MAX_ANSWER_BYTES >> 20} MiB")
                chunks.append(chunk)
            if expired.is_set():
                raise TimeoutError
            return resp.status, b"".join(chunks)
        except (OSError, http.client.HTTPException) as exc:
            if expired.is_set() or isinstance(exc, (TimeoutError, socket.timeout)):
                raise RowFailed("timeout", f"no whole answer within timeout_s {self.timeout_s:g} s") from None
            if isinstance(exc, ConnectionRefusedError):
                raise ConnectionLost(f"{self.url}{CHAT}: connection refused") from None
            raise ConnectionLost(f"{self.url}{CHAT}: {exc!r}") from None
        finally:
            watchdog.cancel()
            conn.close()


def parse_answers(code: int, raw: bytes, where: str) -> list[Answer]:
    """The answers of a chat completion, in choice order. RowFailed for an error answer, or when
    no choice is usable (the first bad choice's reason); a bad choice among good ones is left out."""
    try:
        body = json.loads(raw)
    except ValueError:
        body = None
    if code != 200:
        message = body.get("message") if isinstance(body, dict) else None
        message = str(message if message is not None else raw[:300].decode("utf-8", "replace")).strip()
        if code == 400 and any(w in message for w in CONTEXT_WORDS):
            raise RowFailed("context_overflow", message)
        raise RowFailed("server_error", f"HTTP {code}: {message[:300]}")
    try:
        choices = sorted(body["choices"], key=lambda c: int(c.get("index") or 0))
        usage = body.get("usage") or {}
        completion = int(usage.get("completion_tokens") or 0)
        prompt = int(usage.get("prompt_tokens") or 0)
        if not choices:
            raise IndexError("no choices")
    except (TypeError, KeyError, IndexError, ValueError, AttributeError) as exc:
        raise RowFailed("server_error", f"{where}: not a chat completion ({exc!r})") from None
    good, first_bad = [], None
    for choice in choices:
        try:
            good.append(_choice(choice, completion // len(choices), prompt, where))
        except RowFailed as exc:
            first_bad = first_bad or exc
    if not good:
        raise first_bad
    return good


def _choice(choice, completion: int, prompt: int, where: str) -> Answer:
    try:
        text = choice["message"]["content"]
    except (TypeError, KeyError) as exc:
        raise RowFailed("server_error", f"{where}: not a chat completion ({exc!r})") from None
    if choice.get("finish_reason") == "abort":
        raise RowFailed("server_error", f"{where}: the server aborted the request")
    if not isinstance(text, str) or not text.strip():
        raise RowFailed("empty", f"empty answer (finish_reason {choice.get('finish_reason')!r}, "
                                 f"{completion} tokens)")
    bad = lone_surrogate(text)
    if bad:
        raise RowFailed("server_error", f"{where}: the answer holds a lone surrogate '{bad[1]}' at character "
                                        f"{bad[0]} (no UTF-8 text)")
    return Answer(text, completion, prompt, choice.get("finish_reason"))
