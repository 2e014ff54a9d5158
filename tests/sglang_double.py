"""A test double of SGLang's HTTP server: the endpoints the console and `bench` use, answered
as sglang 0.5.23's source defines them. SGLang cannot run here (no GPU kernels); this is
the boundary the readiness monitor and the SGLang bench are tested against.

Mirrored from the installed sglang 0.5.23:
- python/sglang/srt/entrypoints/http_server.py:
  `/ready` 200 when the tokenizer manager's status is Up, else 503 (empty body);
  `/health` (= `/health_generate`) 503 while Starting; when Up it sends a
  one-token generation and `await asyncio.sleep(1)` before it answers 200
  (SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION defaults on, environ.py);
  `/server_info` (and its deprecated alias `/get_server_info`): the resolved
  server args, `launch_command`, the scheduler info, `startup_time`,
  `internal_states` (a list, one dict per DP rank), `version`, `frontend`;
  `/generate` (POST): `{"text", "output_ids", "meta_info"}`, a list of them for
  a batch; `/flush_cache` (GET/POST): 200 "Cache flushed.\\nPlease check backend
  logs ..." or 400 "Flush cache failed.\\n" while requests run.
  `/model_info` (and its deprecated alias `/get_model_info`): 200 with the model
  path, `is_generation`, ... as soon as the HTTP server runs, warming up or not.
- the same file of sglang 0.5.17 (ready_route=False, version="0.5.17";
  https://github.com/sgl-project/sglang/blob/v0.5.17/python/sglang/srt/entrypoints/http_server.py,
  read from the sglang-0.5.17 wheel): no `/ready` route (404 `{"detail":"Not Found"}`);
  `/health_generate`, `/model_info`, `/server_info` as above.
- the warm-up of both (http_server.py _execute_server_warmup): the first
  `/generate` is the server's own warm-up request, whose forward compiles the
  JIT kernels (`first_forward_s`); the scheduler answers nothing else meanwhile,
  so `/server_info` (tokenizer_manager.get_internal_state, a scheduler round
  trip) waits for it, as the issue's 0.5.17 run saw (its 10 s probe timed out).
- python/sglang/srt/managers/tokenizer_manager.py (meta_info): `id`,
  `finish_reason` ({"type": "length", "length": n} when max_new_tokens ends it),
  `prompt_tokens`, `weight_version`, `num_retractions`, `reasoning_tokens`,
  `completion_tokens`, `cached_tokens`, `e2e_latency`; speculative
  (_calculate_spec_decoding_metrics): `spec_accept_rate` = correct drafts /
  (verify_ct x (num_draft_tokens - 1)), `spec_accept_length` =
  completion_tokens / spec_verify_ct, `spec_num_correct_drafts`,
  `spec_num_proposed_drafts`, `spec_verify_ct`, and `spec_correct_drafts_histogram`
  (entry m = verify steps that accepted m drafts, the bonus excluded;
  schedule_batch.py Req.update_spec_correct_drafts_histogram, one call a verify step).
- python/sglang/srt/managers/scheduler_components/internal_state.py: each
  internal state has `last_gen_throughput`, and `avg_spec_accept_length` when
  speculative.
- python/sglang/srt/observability/metrics_collector.py: Prometheus gauges
  `sglang:num_running_reqs`, `sglang:num_queue_reqs`, `sglang:gen_throughput`,
  `sglang:token_usage`, `sglang:cache_hit_rate`, `sglang:spec_accept_length`,
  labels model_name, engine_type, tp_rank, pp_rank, moe_ep_rank; with
  SGLANG_ENABLE_METRICS_DEVICE_TIMER=1 (environ.py, off by default;
  managers/scheduler_components/metrics_reporter.py) the counter
  `sglang:forward_execution_seconds_total{category}`: GPU time of the forwards by
  utils/device_timer.py's category (`target_verify`, `eagle_draft` (the draft graph's
  num_steps - 1 drafter forwards, speculative/eagle_draft_cuda_graph_runner.py),
  `eagle_draft_extend` (one drafter forward over the accepted tokens), `decode`, `extend`).
- with --enable-metrics, meta_info's timings (observability/req_time_stats.py,
  APIServerReqTimeStats.convert_to_output_meta_info): `request_received_ts`,
  `first_token_latency` (first token - request received), `request_finished_ts`,
  `decode_throughput` (1 / ((e2e - first token latency) / (completion_tokens - 1))).
- /server_info's resolved args (server_args.resolved_dict) include `attention_backend`,
  `speculative_draft_attention_backend`, `speculative_attention_mode`,
  `disable_overlap_schedule`, `cuda_graph_config` ({"decode": {"backend"...}, "prefill": ...}).

What is modelled, not mirrored: generation itself. Greedy output ids are a
fixed function of the prompt (the same with and without speculation, as greedy
speculative decoding must be); a speculative server accepts `accept_length`
tokens per verify step; each step (or token, without speculation) takes
`step_s`, so the speed-up is measurable. The first token comes from the prefill (one
`step_s`), the rest from the decode steps; a speculative server's drafter takes
`draft_step_s` a draft step (num_steps a cycle). `diverge` {first prompt id: position}:
those prompts' answers take another path from that position on (a near-tie a bf16
target's verify kernels flipped, or a broken drafter at position 0).
"""

from __future__ import annotations

import json
import math
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

VERSION = "0.5.23"
MODEL_INFO = ("/model_info", "/get_model_info")
FLUSHED = ("Cache flushed.\nPlease check backend logs for more details. "
           "(When there are running or waiting requests, the operation will not be performed.)\n")


class _Server(ThreadingHTTPServer):
    def handle_error(self, request, client_address):
        # A client that gave up waiting (the monitor's 0.3 s against /health_generate's
        # one-second sleep): uvicorn drops the answer silently, so does the double.
        import sys
        if not isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            super().handle_error(request, client_address)


class Double:
    def __init__(self, host: str = "127.0.0.1", port: int = 0, speculative: bool = False,
                 accept_length: float = 3.0, num_steps: int = 3, num_draft_tokens: int = 4,
                 step_s: float = 0.001, vocab: int = 32000, tp: int = 1, dp: int = 1,
                 model_path: str = "/models/target", metrics: bool = True, health_sleep_s: float = 1.0,
                 version: str = VERSION, ready_route: bool = True, first_forward_s: float = 0.0,
                 health_route: bool = True, loop_after: int | None = None,
                 diverge: dict[int, int] | None = None, draft_step_s: float = 0.0, device_timer: bool = False,
                 decode_max_bs: int | None = None, decode_backend: str = "full"):
        self.speculative, self.accept_length = speculative, float(accept_length)
        self.num_steps, self.num_draft_tokens = num_steps, num_draft_tokens
        self.step_s, self.vocab, self.tp, self.dp = step_s, vocab, tp, dp
        self.model_path, self.metrics, self.health_sleep_s = model_path, metrics, health_sleep_s
        self.version, self.ready_route, self.first_forward_s = version, ready_route, first_forward_s
        self.health_route = health_route    # False: neither /ready nor /health_generate (only /model_info)
        # The decode CUDA graphs' resolved settings (arg_groups/memory_hook.py fills max_bs by the GPU's memory).
        self.decode_max_bs, self.decode_backend = decode_max_bs, decode_backend
        # Prompts whose first id is this repeat a two-token loop (a degenerate completion).
        self.loop_after = loop_after
        self.diverge, self.draft_step_s, self.device_timer = dict(diverge or {}), draft_step_s, device_timer
        self.forward_s: dict[str, float] = {}     # device timer's seconds by category
        self.paths: list[str] = []          # every request's path, in order
        self.forwarded = False              # whether the first forward (kernel compile) ran
        self.compiling = False              # the first forward is running: the scheduler answers nothing else
        self.status = "Starting"            # ServerStatus: Starting | Up | UnHealthy
        self.running = 0
        self.flushes = 0
        self.requests: list[dict] = []
        self.last_gen_throughput = 0.0
        self.startup_time = time.time()
        self.hang = False                   # accept connections, never answer
        self.hanging = 0                    # requests held unanswered now (hang)
        self.unhang = threading.Event()     # set at stop(): the held requests end
        self.lock = threading.Lock()
        double = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):      # quiet: the fake launcher prints SGLang's lines itself
                pass

            def do_GET(self):
                double.handle(self, "GET")

            def do_POST(self):
                double.handle(self, "POST")

            do_PUT = do_POST

        self.server = _Server((host, port), Handler)
        self.server.daemon_threads = True
        self.host, self.port = self.server.server_address[:2]
        self.thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> "Double":
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        return self

    def stop(self) -> None:
        self.unhang.set()
        self.server.shutdown()
        self.server.server_close()

    # ------------------------------------------------------------ responses
    def _send(self, h, code: int, body: bytes = b"", ctype: str = "application/json") -> None:
        h.send_response(code)
        if body:
            h.send_header("Content-Type", ctype)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    def handle(self, h, method: str) -> None:
        if self.hang:
            with self.lock:
                self.hanging += 1
            self.unhang.wait(30)
            with self.lock:
                self.hanging -= 1
            return
        path = h.path.split("?", 1)[0]
        self.paths.append(path)
        if path == "/ready" and self.ready_route:
            return self._send(h, 200 if self.status == "Up" else 503)
        if path in ("/health", "/health_generate") and self.health_route:
            if self.status == "Starting":
                return self._send(h, 503)
            time.sleep(self.health_sleep_s)
            return self._send(h, 200 if self.status == "Up" else 503)
        if path in MODEL_INFO and method == "GET":
            return self._send(h, 200, json.dumps({
                "model_path": self.model_path, "tokenizer_path": self.model_path, "is_generation": True,
                "preferred_sampling_params": None, "weight_version": "default",
                "has_image_understanding": False, "has_audio_understanding": False}).encode())
        if path in ("/server_info", "/get_server_info") and method == "GET":
            while self.compiling:       # a scheduler round trip: after the forward in flight
                time.sleep(0.02)
            return self._send(h, 200, json.dumps(self.server_info()).encode())
        if path == "/metrics" and method == "GET":
            if not self.metrics:
                return self._send(h, 404, b'{"detail":"Not Found"}')
            return self._send(h, 200, self.metrics_text().encode(), "text/plain; version=0.0.4; charset=utf-8")
        if path == "/flush_cache":
            if self.running:
                return self._send(h, 400, b"Flush cache failed.\n", "text/plain")
            self.flushes += 1
            return self._send(h, 200, FLUSHED.encode(), "text/plain")
        if path == "/generate" and method in ("POST", "PUT"):
            length = int(h.headers.get("Content-Length") or 0)
            try:
                req = json.loads(h.rfile.read(length) or b"{}")
            except ValueError:
                return self._send(h, 400, json.dumps({"error": "invalid JSON"}).encode())
            return self._send(h, 200, json.dumps(self.generate(req)).encode())
        return self._send(h, 404, b'{"detail":"Not Found"}')

    def server_info(self) -> dict:
        state = {"world_size": self.tp * self.dp, "startup_time": self.startup_time,
                 "effective_max_running_requests_per_dp": 256,
                 "last_gen_throughput": self.last_gen_throughput}
        if self.speculative:
            state["avg_spec_accept_length"] = self.accept_length
        return {
            "model_path": self.model_path, "tp_size": self.tp, "dp_size": self.dp, "port": self.port,
            "speculative_algorithm": "EAGLE3" if self.speculative else None,
            "speculative_num_steps": self.num_steps if self.speculative else None,
            "speculative_num_draft_tokens": self.num_draft_tokens if self.speculative else None,
            "speculative_eagle_topk": 1 if self.speculative else None,
            "attention_backend": "fa3", "speculative_draft_attention_backend": None,
            "speculative_attention_mode": "prefill", "disable_overlap_schedule": False,
            "cuda_graph_config": {"decode": {"backend": self.decode_backend, "max_bs": self.decode_max_bs, "bs": None},
                                  "prefill": {"backend": "breakable", "max_bs": None, "bs": None}},
            "launch_command": None, "max_total_num_tokens": 61440, "startup_time": self.startup_time,
            "internal_states": [dict(state) for _ in range(self.dp)],
            "version": self.version, "frontend": "python",
        }

    def metrics_text(self) -> str:
        labels = (f'engine_type="unified",model_name="{self.model_path}",moe_ep_rank="0",pp_rank="0",'
                  f'tp_rank="0"')
        lines = []
        gauges = [("num_running_reqs", "The number of running requests.", self.running),
                  ("num_queue_reqs", "The number of requests in the waiting queue.", 0),
                  ("gen_throughput", "The generation throughput (token/s).", self.last_gen_throughput),
                  ("cache_hit_rate", "The prefix cache hit rate.", 0.0),
                  ("token_usage", "The token usage.", 0.25 if self.running else 0.0)]
        if self.speculative:
            gauges.append(("spec_accept_length", "Mean acceptance length of speculative decoding "
                           "(accepted drafts + bonus token per forward).", self.accept_length))
        for name, doc, value in gauges:
            lines += [f"# HELP sglang:{name} {doc}", f"# TYPE sglang:{name} gauge",
                      f"sglang:{name}{{{labels}}} {float(value)}"]
        if self.device_timer:
            name = "sglang:forward_execution_seconds_total"
            lines += [f"# HELP {name} Total time that GPU is busy executing model forward passes. Refer to "
                      f"ForwardMode for category labels.", f"# TYPE {name} counter"]
            lines += [f'{name}{{category="{c}",{labels}}} {v}' for c, v in sorted(self.forward_s.items())]
        return "\n".join(lines) + "\n"

    def _one(self, ids: list[int], sp: dict) -> dict:
        n = int(sp.get("max_new_tokens", 128))
        out = [(sum(ids) + 7 * i) % self.vocab for i in range(n)]
        if self.loop_after is not None and ids and ids[0] == self.loop_after:
            out = [(sum(ids) + 7 * (i % 2)) % self.vocab for i in range(n)]
        if ids and ids[0] in self.diverge:
            at = self.diverge[ids[0]]
            out = out[:at] + [(t + 3) % self.vocab for t in out[at:]]
        t0, p0 = time.time(), time.perf_counter()      # latencies by perf_counter, as req_time_stats.py
        steps = math.ceil(n / self.accept_length) if self.speculative else n
        # after the prefill's token: verify cycles (speculative) or one decode step a token
        cycles = steps if self.speculative else max(0, n - 1)
        with self.lock:
            self.running += 1
            first, self.forwarded = not self.forwarded, True
        try:
            if first and self.first_forward_s > 0:
                self.compiling = True
                try:
                    time.sleep(self.first_forward_s)
                finally:
                    self.compiling = False
            time.sleep(self.step_s)                 # the prefill: the first token
            first_token = time.perf_counter() - p0
            per_cycle = self.step_s + (self.num_steps * self.draft_step_s if self.speculative else 0.0)
            time.sleep(cycles * per_cycle)
        finally:
            with self.lock:
                self.running -= 1
        e2e = time.perf_counter() - p0
        with self.lock:
            add = {"extend": self.step_s}
            if self.speculative:
                add.update({"target_verify": cycles * self.step_s,
                            "eagle_draft_extend": cycles * self.draft_step_s,
                            "eagle_draft": cycles * (self.num_steps - 1) * self.draft_step_s})
            else:
                add["decode"] = cycles * self.step_s
            for c, v in add.items():
                self.forward_s[c] = self.forward_s.get(c, 0.0) + v
        self.last_gen_throughput = n / e2e if e2e > 0 else 0.0
        meta = {"id": uuid.uuid4().hex, "finish_reason": {"type": "length", "length": n},
                "prompt_tokens": len(ids), "weight_version": "default", "num_retractions": 0,
                "reasoning_tokens": 0, "completion_tokens": n, "cached_tokens": 0, "e2e_latency": e2e}
        if self.metrics:
            meta.update({"request_received_ts": t0, "first_token_latency": first_token,
                         "request_finished_ts": t0 + e2e, "queue_time": 0.0})
            if n > 1 and e2e > first_token:
                meta["decode_throughput"] = (n - 1) / (e2e - first_token)
        if self.speculative and steps > 0:
            correct = n - steps         # every verify step yields one bonus token
            proposed = steps * (self.num_draft_tokens - 1)
            meta.update({"spec_accept_rate": correct / proposed, "spec_accept_length": n / steps,
                         "spec_num_correct_drafts": correct, "spec_num_proposed_drafts": proposed,
                         "spec_verify_ct": steps, "spec_correct_drafts_histogram": self.histogram(steps, correct)})
        return {"text": " ".join(f"t{t}" for t in out), "output_ids": out, "meta_info": meta}

    def histogram(self, steps: int, correct: int) -> list[int]:
        """`correct` accepted drafts spread over `steps` verify steps as evenly as they go
        (modelled: at most num_draft_tokens - 1 a step)."""
        hist = [0] * self.num_draft_tokens
        for i in range(steps):
            m = min(self.num_draft_tokens - 1, correct // steps + (1 if i < correct % steps else 0))
            hist[m] += 1
        while len(hist) > 1 and hist[-1] == 0:
            hist.pop()              # SGLang's list grows only as far as the largest count seen
        return hist

    def generate(self, req: dict):
        self.requests.append(req)
        sp = req.get("sampling_params") or {}
        ids = req.get("input_ids")
        if ids is None:
            text = req.get("text")
            batch = [text] if isinstance(text, str) else list(text or [])
            ids = [[ord(c) % self.vocab for c in t] for t in batch]
            single = isinstance(text, str)
        else:
            single = bool(ids) and isinstance(ids[0], int)
            ids = [ids] if single else ids
        outs = [self._one(list(i), sp) for i in ids]
        return outs[0] if single else outs
