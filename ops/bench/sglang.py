"""bench with engine = "sglang": acceptance where the drafter will be served.

Against a running SGLang server (a speculative `serve` stage's URL): the
held-out prompts go one at a time through the native `/generate` API with
greedy sampling (temperature 0), after `/flush_cache` (so no prompt's prefill
is served from an earlier one's radix cache). Acceptance length is SGLang's own
definition: total completion tokens / total `spec_verify_ct` of the responses'
`meta_info` (python/sglang/srt/managers/tokenizer_manager.py,
_calculate_spec_decoding_metrics: accept_length = completion_tokens /
verify_ct, the bonus token included), per prompt and overall. With a
baseline URL (a server without speculation) the same prompts are timed there
and the speed-up is the ratio of output tokens/s; whether both servers gave
the same greedy tokens is reported too.

The verify cycle at batch 1 (the main pass sends one prompt at a time): SGLang's own
timings where the server has --enable-metrics (the serve op's default): meta_info's
`e2e_latency` and `first_token_latency` (observability/req_time_stats.py,
APIServerReqTimeStats.convert_to_output_meta_info), so a request's decode time is
e2e - first token latency, spent in its `spec_verify_ct` verify cycles (the prefill gave
the first token: completion tokens = 1 + the tokens of the verify steps); cycle = decode
time / verify steps, a plain target step = decode time / (completion tokens - 1) on the
baseline. Without them: the request's wall time / verify steps, and / completion tokens.
Where /metrics has `sglang:forward_execution_seconds_total{category}` (the server ran with
SGLANG_ENABLE_METRICS_DEVICE_TIMER=1; utils/device_timer.py), its growth over the pass
splits a cycle into the target's verify forward (`target_verify`) and the drafter's
(`eagle_draft_extend`: one forward over the accepted tokens, `eagle_draft`: the other
num_steps - 1): a draft step = drafter time / verify steps / num_steps.

Before its first probe the bench waits for each server to be ready
(ops/readiness.py: `/ready`, or on a release without it `/health_generate`,
else `/model_info`), at most ready_timeout_s from its start: a server started
beside it loads and compiles its kernels for minutes first.

Standard library only (urllib): the bench host needs no SGLang client.
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

from ops.readiness import HEALTH_ANSWER_S, HEALTH_SLEEP_S, Readiness

# /server_info and /flush_cache answer at once on a live server; the bench's timeout
# is sized for one generation, and a hung server would hold the bench that long.
PROBE_TIMEOUT_S = 10.0
READY_POLL_S = 2.0          # between readiness probes while a server warms up
READY_SAY_EVERY_S = 10.0    # a "waiting" line at most this often


# /server_info's fields kept in bench.json: what was served, and the settings that make a
# verify cycle (server_args.resolved_dict: the values after SGLang's own resolution).
SERVER_KEYS = ("version", "model_path", "speculative_algorithm", "speculative_draft_model_path",
               "speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens", "tp_size",
               "dp_size", "attention_backend", "speculative_draft_attention_backend", "speculative_attention_mode",
               "disable_overlap_schedule", "cuda_graph_config")


class ServerError(RuntimeError):
    """The server did not answer as SGLang does; the message says what and where."""


@dataclass
class Answer:
    output_ids: list[int]
    completion_tokens: int
    verify_ct: int | None
    seconds: float
    # meta_info.spec_correct_drafts_histogram: entry m = verify steps that accepted m drafts
    histogram: list[int] | None = None
    # meta_info's e2e_latency - first_token_latency: the decode phase, by the server's clock
    decode_s: float | None = None


def _http(url: str, path: str, body: dict | None, timeout: float) -> tuple[int, bytes]:
    """(status, body); OSError (refused, timed out, a broken answer) when no answer comes."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url.rstrip("/") + path, data=data, method="POST" if data else "GET",
                                 headers={"Content-Type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except urllib.error.URLError as exc:
        raise exc.reason if isinstance(exc.reason, OSError) else OSError(str(exc.reason)) from None
    except http.client.HTTPException as exc:
        raise OSError(f"bad HTTP answer: {exc!r}") from None


def _request(url: str, path: str, body: dict | None, timeout: float) -> tuple[int, bytes]:
    try:
        return _http(url, path, body, timeout)
    except OSError as exc:
        raise ServerError(f"{url}{path}: no answer ({exc})") from None


def wait_ready(url: str, ready_timeout_s: float, log=print, t0: float | None = None) -> str:
    """Return (why it is ready) once the server at `url` is ready; ServerError when
    ready_timeout_s passed since t0 (time.monotonic(), default now). Refused
    connections are waited through: the port opens only once the weights loaded."""
    t0 = time.monotonic() if t0 is None else t0
    deadline = t0 + ready_timeout_s
    ready = Readiness(lambda path, t: _http(url, path, None, t)[0], PROBE_TIMEOUT_S)
    said = None
    while True:
        left = deadline - time.monotonic()
        ready.timeout = max(0.1, min(PROBE_TIMEOUT_S, left))
        # Long enough for /health_generate's answer (>= 1 s), its whole check at most.
        ready.health_timeout = max(HEALTH_SLEEP_S + 1.0, min(HEALTH_ANSWER_S, left))
        ans = ready.probe()
        now = time.monotonic()
        if ans.state in ("ready", "answering"):     # answering: /model_info, all such a server has
            if said is not None:
                log(f"bench: {url} ready after {now - t0:.0f} s ({ans.reason})")
            return ans.reason
        if now >= deadline:
            raise ServerError(f"{url}: not ready within ready_timeout_s {ready_timeout_s:g} s: {ans.reason}")
        if said is None or now - said >= READY_SAY_EVERY_S:
            log(f"bench: waiting for {url} to be ready: {ans.reason} ({now - t0:.0f} s of {ready_timeout_s:g} s)")
            said = now
        time.sleep(min(READY_POLL_S, max(0.0, deadline - now)))


def server_info(url: str, timeout: float) -> dict:
    code, body = _request(url, "/server_info", None, timeout)
    if code == 404:     # before /get_server_info was deprecated for /server_info
        code, body = _request(url, "/get_server_info", None, timeout)
    if code != 200:
        raise ServerError(f"{url}/server_info: HTTP {code}")
    try:
        return json.loads(body)
    except ValueError:
        raise ServerError(f"{url}/server_info: not JSON") from None


def flush_cache(url: str, timeout: float) -> None:
    code, body = _request(url, "/flush_cache", {}, timeout)
    if code != 200:
        raise ServerError(f"{url}/flush_cache: HTTP {code}: {body.decode('utf-8', 'replace').strip()} "
                          f"(SGLang flushes only when no request runs or waits)")


def generate(url: str, input_ids: list[int], max_new_tokens: int, timeout: float) -> Answer:
    body = {"input_ids": input_ids,
            "sampling_params": {"temperature": 0.0, "max_new_tokens": max_new_tokens}}
    t0 = time.perf_counter()
    code, raw = _request(url, "/generate", body, timeout)
    seconds = time.perf_counter() - t0
    if code != 200:
        raise ServerError(f"{url}/generate: HTTP {code}: {raw[:300].decode('utf-8', 'replace')}")
    try:
        out = json.loads(raw)
        meta = out["meta_info"]
        ids = out.get("output_ids") or []
        completion = int(meta["completion_tokens"])
    except (ValueError, KeyError, TypeError) as exc:
        raise ServerError(f"{url}/generate: not SGLang's answer (meta_info.completion_tokens: {exc})") from None
    verify = meta.get("spec_verify_ct")
    hist = meta.get("spec_correct_drafts_histogram")
    hist = [int(v) for v in hist] if isinstance(hist, list) and all(isinstance(v, int) for v in hist) else None
    e2e, first = meta.get("e2e_latency"), meta.get("first_token_latency")
    decode_s = float(e2e) - float(first) if _is_num(e2e) and _is_num(first) and e2e >= first > 0 else None
    return Answer(list(ids), completion, int(verify) if verify is not None else None, seconds, hist, decode_s)


def _is_num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


FORWARD_SECONDS = "sglang:forward_execution_seconds_total"


def forward_seconds(url: str, timeout: float) -> dict[str, float] | None:
    """/metrics' `sglang:forward_execution_seconds_total` by category (the largest over the
    ranks' label sets: TP ranks run the same forwards); None when the server has no such
    counter (no --enable-metrics, or SGLANG_ENABLE_METRICS_DEVICE_TIMER off)."""
    try:
        code, body = _http(url, "/metrics", None, timeout)
    except OSError:
        return None
    if code != 200:
        return None
    out: dict[str, float] = {}
    for line in body.decode("utf-8", "replace").splitlines():
        if not line.startswith(FORWARD_SECONDS + "{"):
            continue
        labels, _, value = line[len(FORWARD_SECONDS) + 1:].rpartition("} ")
        cat = next((kv.split("=", 1)[1].strip('"') for kv in labels.split(",") if kv.startswith("category=")), None)
        try:
            v = float(value)
        except ValueError:
            continue
        if cat is not None:
            out[cat] = max(out.get(cat, 0.0), v)
    return out or None


def forward_delta(before: dict | None, after: dict | None) -> dict[str, float] | None:
    if before is None or after is None:
        return None
    return {c: after[c] - before.get(c, 0.0) for c in after}


def cycle_record(spec: list[Answer], base: list[Answer] | None, num_steps: int | None,
                 spec_fwd: dict | None, base_fwd: dict | None) -> dict:
    """The verify cycle at batch 1 against a plain target step (the module's docstring)."""
    from ops.bench.figures import cycle_figures

    return cycle_figures([(a.decode_s, a.verify_ct or 0, a.completion_tokens, a.seconds) for a in spec],
                         [(a.decode_s, 0, a.completion_tokens, a.seconds) for a in base] if base else None,
                         num_steps, spec_fwd, base_fwd)


def run_bench(url: str, prompts: list[tuple[int, list[int]]], max_new_tokens: int,
              baseline_url: str | None = None, timeout: float = 600.0, log=print,
              ready_timeout_s: float = 600.0, more_urls: tuple[str, ...] = ()) -> dict:
    """The bench on live servers; raises ServerError with the reason when a server fails.
    `more_urls`: speculative servers of the other settings, for the table only."""
    t0 = time.monotonic()
    for u in [url, *more_urls] + ([baseline_url] if baseline_url else []):
        wait_ready(u, ready_timeout_s, log, t0)       # one deadline for all
    probe = min(timeout, PROBE_TIMEOUT_S)
    info = server_info(url, probe)
    if not info.get("speculative_algorithm"):
        raise ServerError(f"{url}: not a speculative server (server_info.speculative_algorithm is "
                          f"{info.get('speculative_algorithm')!r}); serve it with mode = \"speculative\"")
    if baseline_url:
        # Before the speculative pass: a baseline that is down would waste it.
        base_info = server_info(baseline_url, probe)
        if base_info.get("speculative_algorithm"):
            raise ServerError(f"{baseline_url}: the baseline is a speculative server (server_info."
                              f"speculative_algorithm is {base_info.get('speculative_algorithm')!r}); "
                              f"serve it with mode = \"target\"")
    total = len(prompts) * (2 if baseline_url else 1)
    results, fwd = {}, {}
    results["spec"], fwd["spec"] = _pass(url, prompts, max_new_tokens, timeout, log, 0, total)
    if baseline_url:
        results["base"], fwd["base"] = _pass(baseline_url, prompts, max_new_tokens, timeout, log, len(prompts), total)
    spec = results["spec"]
    missing = [idx for (idx, _p), a in zip(prompts, spec) if not a.verify_ct]
    if missing:
        raise ServerError(f"{url}/generate: no meta_info.spec_verify_ct for prompts {missing}: the server did "
                          f"not decode them speculatively")
    tokens = sum(a.completion_tokens for a in spec)
    verify = sum(a.verify_ct or 0 for a in spec)
    seconds = sum(a.seconds for a in spec)
    ndt = info.get("speculative_num_draft_tokens")
    per_prompt = [{"prompt": idx, "prompt_tokens": len(p), "completion_tokens": a.completion_tokens,
                   "spec_verify_ct": a.verify_ct, "acceptance_length": a.completion_tokens / a.verify_ct,
                   "seconds": a.seconds, "tok_s": a.completion_tokens / max(a.seconds, 1e-9)}
                  for (idx, p), a in zip(prompts, spec)]
    result = {
        "engine": "sglang", "url": url, "baseline_url": baseline_url,
        "server": {k: info.get(k) for k in SERVER_KEYS},
        "prompts": [idx for idx, _ in prompts], "max_new_tokens": max_new_tokens,
        # Drafts a verify step checks (chain): the most a step yields is this + 1.
        "draft_tokens": int(ndt) - 1 if isinstance(ndt, int) else None,
        "acceptance_length": tokens / verify, "tokens": tokens, "spec_verify_ct": verify,
        "time_speculative_s": seconds, "tok_s_speculative": tokens / max(seconds, 1e-9),
        "per_prompt": per_prompt, "speedup": None, "outputs_match": None, "mismatches": [],
    }
    if all(a.histogram is not None for a in spec):
        from ops.bench.figures import add_histograms, rates_from_histogram
        hist = add_histograms([a.histogram for a in spec])
        drafts = result["draft_tokens"] if result["draft_tokens"] is not None else len(hist) - 1
        result["spec_correct_drafts_histogram"] = hist
        result["accept_rate_per_position"] = rates_from_histogram(hist, drafts)[0]
    steps = info.get("speculative_num_steps")
    result["cycle"] = cycle_record(spec, results.get("base"), steps if isinstance(steps, int) else None,
                                   fwd["spec"], fwd.get("base"))
    if baseline_url:
        from ops.bench.figures import first_difference

        base = results["base"]
        b_tokens, b_seconds = sum(a.completion_tokens for a in base), sum(a.seconds for a in base)
        result.update({"tokens_plain": b_tokens, "time_plain_s": b_seconds,
                       "tok_s_plain": b_tokens / max(b_seconds, 1e-9)})
        result["speedup"] = result["tok_s_speculative"] / max(result["tok_s_plain"], 1e-9)
        for p, b in zip(per_prompt, base):
            p["completion_tokens_plain"], p["seconds_plain"] = b.completion_tokens, b.seconds
        mism = [{"prompt": idx, "first_diff": first_difference(a.output_ids, b.output_ids)}
                for (idx, _p), a, b in zip(prompts, spec, base) if a.output_ids != b.output_ids]
        result["outputs_match"], result["mismatches"] = not mism, mism
        # The plain server's answers at concurrency 1: the drift floor compares its batched ones with them.
        result["baseline_completions"] = {str(idx): list(b.output_ids) for (idx, _p), b in zip(prompts, base)}
    return result


def _pass(url: str, prompts, max_new_tokens: int, timeout: float, log, offset: int,
          total: int) -> tuple[list[Answer], dict | None]:
    """The answers, one prompt at a time, and the growth of the server's forward seconds
    by category over them (None where /metrics has none)."""
    flush_cache(url, min(timeout, PROBE_TIMEOUT_S))
    generate(url, prompts[0][1], 4, timeout)       # warm-up: first-request costs stay out of the timing
    flush_cache(url, min(timeout, PROBE_TIMEOUT_S))
    before = forward_seconds(url, min(timeout, PROBE_TIMEOUT_S))
    out = []
    for i, (_idx, ids) in enumerate(prompts):
        a = generate(url, ids, max_new_tokens, timeout)
        out.append(a)
        if offset == 0:
            acc = sum(x.completion_tokens for x in out) / max(1, sum(x.verify_ct or 0 for x in out))
            log(f"progress: prompt {offset + i + 1}/{total} accept length {acc:.2f}")
        else:
            log(f"progress: prompt {offset + i + 1}/{total} baseline")
    after = forward_seconds(url, min(timeout, PROBE_TIMEOUT_S)) if before is not None else None
    return out, forward_delta(before, after)
