"""Is an SGLang server ready? The same answer across SGLang versions, standard library only.

Used by the console's serve monitor (eagle3_console/monitor/serve.py, where a
refresh waits a fraction of a second at most), by the serve stage (its
ready_timeout_s default), by bench with engine sglang (ops/bench/sglang.py,
which waits for its servers before the first probe) and by regenerate's
server (ops/regenerate/server.py): below the stages, so none borrows it from
another.

What the endpoints answer, read from python/sglang/srt/entrypoints/http_server.py:
- 0.5.23 (installed, pinned): `/ready` answers at once, 200 when
  tokenizer_manager.is_ready() (status Up, not shutting down, not paused:
  managers/tokenizer_manager.py), else 503.
- 0.5.17 (https://github.com/sgl-project/sglang/blob/v0.5.17/python/sglang/srt/
  entrypoints/http_server.py, read from the sglang-0.5.17 wheel on PyPI): no
  `/ready` route at all, so FastAPI answers 404 `{"detail":"Not Found"}`.
- both: `/health_generate` (and `/health`, the same handler) answers 503 at once
  while the status is Starting or the server shuts down; past that it sends a
  one-token generation and answers only after `await asyncio.sleep(1)` saw the
  scheduler reply: 200, or 503 after SGLANG_HEALTH_CHECK_TIMEOUT (20 s).
- both: `/model_info` (`/get_model_info` is its deprecated alias, the only name
  in older releases) answers 200 as soon as the HTTP server runs, warming up or
  not: it says the server answers, not that it is ready.
- both, the start-up: the port opens once the weights are loaded; then
  `_execute_server_warmup` polls `/model_info` until 200, sends one warm-up
  `/generate` (the first forward: JIT kernels compile, 1-2 minutes on a first
  start), sets the status Up, and `_wait_and_warmup` logs "The server is fired
  up and ready to roll!". Warming up is that window: port open, not Up.

So a server's readiness endpoint is the first of CHAIN that does not answer 404,
learned once per server and kept. A limit where it is /health_generate and the
wait is shorter than its one-second sleep (the console's refresh): a server
whose last check failed (status UnHealthy, which 0.5.23's /ready reports) still
reads ready while its HTTP loop answers; bench waits out the check instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

READY, HEALTH, MODEL_INFO, MODEL_INFO_OLD = "/ready", "/health_generate", "/model_info", "/get_model_info"
CHAIN = (READY, HEALTH, MODEL_INFO, MODEL_INFO_OLD)
# /health_generate sleeps this long before it can answer 200 (asyncio.sleep(1) above).
HEALTH_SLEEP_S = 1.0
# SGLang's HEALTH_CHECK_TIMEOUT default, plus the margin of one loop turn: the
# longest a healthy or failing /health_generate takes to answer.
HEALTH_ANSWER_S = 22.0
# How long a serve stage may take to become ready (load + warm-up) before the
# console says CRITICAL; the default of serve's ready_timeout_s. A large MoE
# target's load alone can take tens of minutes, its first warm-up minutes more.
SERVE_READY_TIMEOUT_S = 3600.0


@dataclass
class Answer:
    """One readiness probe. state: ready | not_ready (the endpoint says so) | answering
    (only /model_info exists: the HTTP server runs, readiness unknown) | no_answer."""
    state: str
    endpoint: str
    reason: str


class Readiness:
    """The readiness of one server. `get(path, timeout)` returns the HTTP status and
    raises OSError when nothing answers in time (refused, reset, timed out)."""

    def __init__(self, get: Callable[[str, float], int], timeout: float, health_timeout: float | None = None):
        self.get = get
        self.timeout = timeout
        self.health_timeout = timeout if health_timeout is None else health_timeout
        self.endpoint = READY           # READY | HEALTH | MODEL_INFO: the first not seen to answer 404
        self.info_path = MODEL_INFO     # or its older name, once /model_info answered 404

    def probe(self, health: bool = True) -> Answer:
        """The server's readiness by its endpoint. `health=False` asks /model_info instead
        of /health_generate (each /health_generate makes the server generate a token)."""
        if self.endpoint == READY:
            try:
                code = self.get(READY, self.timeout)
            except OSError as exc:
                return Answer("no_answer", READY, no_answer(READY, self.timeout, exc))
            if code != 404:
                return Answer("ready" if code == 200 else "not_ready", READY, f"{READY} answered {code}")
            self.endpoint = HEALTH
        if self.endpoint == HEALTH and health:
            try:
                code = self.get(HEALTH, self.health_timeout)
            except OSError as exc:
                if self.health_timeout < HEALTH_SLEEP_S and isinstance(exc, TimeoutError):
                    return self._health_pending(exc)
                return Answer("no_answer", HEALTH, no_answer(HEALTH, self.health_timeout, exc))
            if code != 404:
                return Answer("ready" if code == 200 else "not_ready", HEALTH,
                              f"{HEALTH} answered {code} (this server has no /ready)")
            self.endpoint = MODEL_INFO
        info = self._model_info_answer()
        if self.endpoint == MODEL_INFO and info.state == "answering":
            info.reason += " (this server has neither /ready nor /health_generate)"
        return info

    def _health_pending(self, exc: OSError) -> Answer:
        # A wait shorter than its one-second sleep: while Starting it would have answered
        # 503 at once, so no answer yet means the status is past Starting (what 0.5.23's
        # /ready reports); /model_info then says whether the HTTP server answers at all.
        info = self._model_info_answer()
        if info.state != "answering":
            return Answer("no_answer", HEALTH, f"{no_answer(HEALTH, self.health_timeout, exc)}; {info.reason}")
        return Answer("ready", HEALTH, f"{HEALTH} past Starting (no 503 within {self.health_timeout:.3g} s: it "
                                       f"runs its one-token check), {info.reason} (this server has no /ready)")

    def _model_info_answer(self) -> Answer:
        for path in (MODEL_INFO, MODEL_INFO_OLD) if self.info_path == MODEL_INFO else (MODEL_INFO_OLD,):
            try:
                code = self.get(path, self.timeout)
            except OSError as exc:
                return Answer("no_answer", path, no_answer(path, self.timeout, exc))
            if code != 404:
                return Answer("answering" if code == 200 else "not_ready", path, f"{path} answered {code}")
            self.info_path = MODEL_INFO_OLD
        return Answer("not_ready", MODEL_INFO_OLD, "no readiness endpoint: " + ", ".join(CHAIN) +
                      " all answered 404 (not an SGLang server?)")


def no_answer(path: str, timeout: float, exc: OSError) -> str:
    if isinstance(exc, ConnectionRefusedError):
        return f"{path}: connection refused (nothing listens on the port yet)"
    return f"{path}: no answer within {timeout:.3g} s ({exc})"
