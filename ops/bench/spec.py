"""Spec of the bench stage: speculative decoding with the exported drafter vs plain greedy.

Output: <output>/bench.json (acceptance length, acceptance per draft position,
speed-up, whether outputs matched greedy); the log's `bench:` line is the
summary the console shows next to the stage.

engine = "sglang" (ops/bench/sglang.py) measures a live SGLang server at
`url` instead (a speculative serve stage; `server` names one of the pipeline's
and the console binds its host:port), against `baseline_url` / `baseline_server`;
its bench.json says "engine": "sglang" and its line is labelled so. There,
`drift` says how many prompts' speculative answers differ from the baseline's,
where each parts first, beside the baseline's own drift between concurrency 1
and 8; the stage fails only when numerics cannot explain it
(ops/bench/figures.py judge_drift). `cycle`: the verify cycle at batch 1 against
a plain target step (and, with SGLang's device timer, a draft step and the
verify forward).
"""

from __future__ import annotations

from ops.bench.figures import parse_concurrency, parse_settings
from ops.bench.view import cycle_words, drift_words, gauges, result_view  # noqa: F401 - the words live with the view
from ops.spec import EstimateContext, Lint, OpSpec, Param, ServerParam

ENGINES = ("reference", "sglang")

def result_line(r: dict) -> str | None:
    """bench.json in a line: what the whole pipeline was for."""
    if "acceptance_length" not in r:
        return None
    if r.get("engine") == "sglang":
        return sglang_line(r)
    per_pos = ", ".join(f"{a:.2f}" for a in r.get("accept_rate_per_position") or [])
    match = "speculative output == greedy" if r.get("outputs_match") else "OUTPUT DIFFERS FROM GREEDY"
    speed = f", speed-up {r['speedup']:.2f}x" if isinstance(r.get("speedup"), (int, float)) else ""
    cycle = cycle_words(r.get("cycle"))
    speed += f", {cycle}" if cycle else ""
    # Said as computed: completion tokens / verify steps (SGLang's), the bonus token included.
    ratio = (f"{r['completion_tokens']} completion tokens / {r['verify_forwards']} verify steps; "
             if isinstance(r.get("completion_tokens"), int) and isinstance(r.get("verify_forwards"), int) else "")
    return (f"acceptance length {r['acceptance_length']:.2f} ({ratio}K={r.get('draft_tokens', '?')}; "
            f"per position {per_pos}){speed}; {match}{_extras(r)}")


def _extras(r: dict) -> str:
    """The degenerate share and the comparison with the other engine, where bench.json has them."""
    out = ""
    d = r.get("degenerate")
    if isinstance(d, dict) and d.get("count"):
        out += f"; DEGENERATE {d['count']}/{d.get('judged')} completions"
    c = r.get("compared")
    if isinstance(c, dict) and isinstance(c.get("differing_completions"), int):
        out += f"; {c['differing_completions']}/{c.get('prompts')} completions differ from {c.get('engine_other')}'s"
    return out


def sglang_line(r: dict) -> str:
    """The SGLang engine's record, labelled as such: acceptance where the drafter is served."""
    k = f" (K={r['draft_tokens']})" if isinstance(r.get("draft_tokens"), int) else ""
    tok_s = r.get("tok_s_speculative")
    out = f"engine sglang: acceptance length {r['acceptance_length']:.2f}{k}"
    if isinstance(tok_s, (int, float)):
        out += f", {tok_s:.1f} tok/s"
    if isinstance(r.get("speedup"), (int, float)):
        out += f", speed-up {r['speedup']:.2f}x vs baseline"
    cycle = cycle_words(r.get("cycle"))
    if cycle:
        out += f", {cycle}"
    drift = r.get("drift")
    if r.get("outputs_match") is False and isinstance(drift, dict):
        out += "; " + drift_words(drift)
    elif r.get("outputs_match") is False:
        out += "; OUTPUT DIFFERS FROM BASELINE GREEDY"
    elif r.get("outputs_match") is None:
        out += "; no baseline"
    return out + _extras(r)


class Bench(OpSpec):
    name = "bench"
    summary = "reference EAGLE-3 speculative decoding (chain, top-1) vs greedy: acceptance length, speed-up"
    params = (
        Param("engine", "reference", "reference: decode here with HF transformers; sglang: measure a live "
              "SGLang server at --url", choices=ENGINES),
        Param("drafter", None, "export's output directory (or its sglang/ or speculators/); engine reference "
              "needs it", type=str),
        Param("url", None, "engine sglang: the speculative server (a serve stage's URL)", type=str),
        Param("baseline_url", None, "engine sglang: the same target served without speculation", type=str),
        Param("server", None, "engine sglang: the serve stage (mode speculative) whose host:port the console "
              "made --url (recorded in bench.json)", type=str),
        Param("baseline_server", None, "engine sglang: the serve stage (mode target) behind --baseline-url",
              type=str),
        Param("timeout_s", 600.0, "engine sglang: seconds a request may take"),
        Param("ready_timeout_s", 600.0, "engine sglang: seconds to wait for the servers to be ready before the "
              "first probe", low=0, low_open=True),
        Param("output", help="output directory (bench.json)"),
        Param("data", None, "hidden-state data for prompts (default: the export's)", type=str),
        Param("prompts_file", None, 'JSONL prompts (instead of --data): "input_ids" rows, or conversations, '
              '"messages" or {"prompt": text} rows (the first user turn in the target\'s chat template)', type=str),
        Param("num_prompts", 8, "held-out prompts decoded", low=1),
        Param("max_new_tokens", 64, "tokens generated a prompt", low=1),
        Param("draft_tokens", 5, "K: drafts per verify step", low=1),
        Param("settings", None, "engine reference: more (steps/topk/draft_tokens) settings measured for the "
              "table, e.g. 3/1/4,5/1/6,7/1/8 (a chain: topk 1, draft_tokens = steps + 1); engine sglang: one "
              "speculative server per setting (its /server_info says which)", type=str,
              convert=lambda t: (parse_settings(t), t)[1]),
        Param("concurrency", "1", "requests in flight at once for each row of the table, e.g. 1,8",
              convert=lambda t: (parse_concurrency(t), t)[1]),
        Param("compare", None, "another bench.json on the same prompts (the other engine's): how many "
              "completions differ, their token counts and both acceptance lengths", type=str),
        Param("device", "auto", "auto | cpu | cuda"),
        Param("dtype", "auto", "auto (the target's), bfloat16, float16, float32"),
    )
    output_params = ("output",)
    uses_target = True
    result_file = "bench.json"
    # The console's bind_servers (eagle3_console/runs/params.py): a serve stage named there gives the url param its URL.
    server_params = (ServerParam("server", "url", "speculative"),
                     ServerParam("baseline_server", "baseline_url", "target"))

    def estimate_bytes(self, ctx: EstimateContext) -> int | None:
        return 64 * 1024

    # bench.json's words: its line above, its view and gauges in ops/bench/view.py.
    result_line = staticmethod(result_line)
    result_view = staticmethod(result_view)
    gauges = staticmethod(gauges)

    def lint(self, ctx: EstimateContext, gpus: list[int] | None) -> list[Lint]:
        """What each engine needs, said before the launch (argparse would say it only in the log)."""
        # engine's choices and ready_timeout_s > 0 are the Params' (checked before the lint runs).
        p = ctx.params
        engine = p.get("engine") or self.params["engine"]
        if engine == "reference" and not p.get("drafter"):
            return [Lint("error", "engine reference needs params.drafter (export's output directory)")]
        if engine == "sglang" and not p.get("url"):
            return [Lint("error", "engine sglang needs params.server (a speculative serve stage of this pipeline) "
                                  "or params.url (e.g. http://127.0.0.1:30000)")]
        if engine == "sglang" and not (p.get("data") or p.get("prompts_file") or p.get("drafter")):
            return [Lint("error", "engine sglang needs held-out prompts: params.data, prompts_file or drafter "
                                  "(whose export_info.json names the data)")]
        return []


SPEC = Bench()
