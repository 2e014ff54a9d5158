"""bench.json for the console: the TUI's view of it (OpSpec.result_view:
the progress pane's head, per-position bars and details, the stages pane's
result cell) and the exporter's gauges (OpSpec.gauges). What matters first is
the acceptance length and speed-up, then whether the speculative output
equals greedy decoding. No torch, no rich: roles, not colours (ops/spec.py's ResultView).
"""

from __future__ import annotations

from ops.bench.kinds import words as kind_words
from ops.spec import Gauge, ResultView


def _num(v) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def result_view(r: dict) -> ResultView | None:
    al = _num(r.get("acceptance_length"))
    if al is None:
        return None
    head: list[tuple[str, str]] = []
    if r.get("url"):
        # Where it was measured, when that was a server; the reference engine's is said under
        # the bars, so that a 5-row pane (80x24) keeps every draft position's bar.
        head.append((f"engine {r['engine']} {r['url']}\n", "strong"))
    head += [("acceptance length ", "label"), (f"{al:.2f}", "headline")]
    k = r.get("draft_tokens")
    if isinstance(k, int):
        head.append((f" (K={k}, max {k + 1})", "label"))
    head.append(("\n", ""))
    # Two lines before the bars: a 46-column side pane shows all of K=3's.
    speed = _num(r.get("speedup"))
    if speed is not None:
        head += [("speed-up ", "label"), (f"{speed:.2f}x", "strong"), (" · ", "label")]
    match = r.get("outputs_match")
    drift = r.get("drift") if isinstance(r.get("drift"), dict) else None
    numerics = match is False and drift is not None and drift.get("verdict") == "numerics"
    if match is True:
        head.append(("output == greedy", "ok"))
    elif numerics:
        # bf16 near-ties: the figures stay in view, the stage passed (ops/bench/figures.py judge_drift).
        head.append((f"output != greedy on {drift.get('differing')}/{drift.get('prompts')} prompts: numerics", "warn"))
    elif match is False:
        head.append((f"OUTPUT DIFFERS FROM GREEDY on {len(r.get('mismatches') or [])} prompts", "alarm"))
    else:
        head.append(("output vs greedy not reported", "warn"))
    rates = r.get("accept_rate_per_position")
    # Conditional rates: draft k accepted given drafts 1..k-1 were.
    bars = tuple((f"accept @{i + 1}", _num(a)) for i, a in enumerate(rates)) if isinstance(rates, list) else ()
    if match is False and not numerics:
        cell = (f"AL {al:.2f} !=greedy", "alarm")
    else:
        cell = (f"AL {al:.2f}{' sglang' if r.get('engine') == 'sglang' else ''}", "ok")
    return ResultView(head=tuple(head), bars=bars, details=tuple(details(r)), cell=cell)


def details(r: dict) -> list[str]:
    """The rest of bench.json, under the bars: throughputs, forwards, drafter."""
    lines = [f"engine {r['engine']}"] if r.get("engine") and not r.get("url") else []
    plain, spec = _num(r.get("tok_s_plain")), _num(r.get("tok_s_speculative"))
    if plain is not None and spec is not None:
        lines.append(f"{spec:.1f} tok/s speculative vs {plain:.1f} plain")
    done, steps = r.get("completion_tokens"), r.get("verify_forwards")
    if isinstance(done, int) and isinstance(steps, int):
        # What the AL is, in its own numbers (SGLang's: completion tokens / verify steps).
        lines.append(f"AL = {done} completion tokens / {steps} verify steps")
    fwd_plain, fwd_spec = r.get("target_forwards_plain"), r.get("target_forwards_speculative")
    if fwd_plain is not None and fwd_spec is not None:
        lines.append(f"target forwards {fwd_spec} vs {fwd_plain} plain")
    prompts = r.get("prompts")
    n_prompts = len(prompts) if isinstance(prompts, list) else prompts
    if n_prompts is not None:
        lines.append(f"{n_prompts} prompts" + (f", {r['tokens']} tokens" if r.get("tokens") is not None else ""))
    if isinstance(r.get("accept_rate_per_position"), list):
        lines.append("accept @k: share of draft k accepted when drafts 1..k-1 were")
    if r.get("drafter"):
        lines.append(f"drafter {r['drafter']}" + (f" ({r['format']})" if r.get("format") else ""))
    cycle = cycle_words(r.get("cycle"))
    if cycle:
        c = r["cycle"]
        lines.append(f"batch 1: {cycle}" + (f" ({_fmt(c.get('cycle_over_plain_step'))} plain steps)"
                                             if _num(c.get("cycle_over_plain_step")) is not None else "")
                     + f" [{c.get('source')}]")
    if kind_words(r.get("by_kind")):
        lines.append(f"by kind: {kind_words(r['by_kind'])}")
    if isinstance(r.get("drift"), dict) and r.get("outputs_match") is False:
        lines.append(drift_words(r["drift"]))
        lines.append(f"  {r['drift'].get('reason')}")
    lines += table_lines(r)
    return lines


def table_lines(r: dict) -> list[str]:
    """bench.json's table, a row per (setting, concurrency); the degenerate share and the comparison."""
    rows = [x for x in r.get("table") or [] if isinstance(x, dict)]
    out = []
    if rows:
        # Narrow enough for the side pane (about 58 columns): rates in percent, "/"-joined.
        out.append("setting  conc    AL   tok/s  speed degen accept@1..k %")
        for x in rows:
            ms = _cycle_cell(x)
            al, tok_s, speed = _num(x.get("acceptance_length")), _num(x.get("tok_s")), _num(x.get("speedup"))
            rates = "/".join("-" if _num(a) is None else f"{100 * a:.0f}" for a in x.get("accept_rate_per_position") or [])
            d = x.get("degenerate") or {}
            out.append(f"{str(x.get('label')):<8} x{x.get('concurrency')!s:<3} "
                       f"{'-' if al is None else f'{al:.2f}':>5} {'-' if tok_s is None else f'{tok_s:.1f}':>7} "
                       f"{'-' if speed is None else f'{speed:.2f}x':>6} {str(d.get('count', '-')) + '/' + str(d.get('judged', '-')):>5} "
                       f"{rates}" + (f" {ms}" if ms else ""))
    line = degenerate_line(r)
    if line:
        out.append(line)
    c = r.get("compared")
    if isinstance(c, dict):
        out.append(f"vs {c.get('engine_other')} ({c.get('with')}): {c.get('differing_completions')} of "
                   f"{c.get('prompts')} completions differ, {c.get('tokens')} vs {c.get('tokens_other')} tokens, "
                   f"AL {_fmt(c.get('acceptance_length'))} vs {_fmt(c.get('acceptance_length_other'))}")
    return out


def _cycle_cell(x: dict) -> str:
    """A row at concurrency 1: its verify cycle (or the baseline's plain step) in ms."""
    cycle, step, draft = _num(x.get("cycle_s")), _num(x.get("step_s")), _num(x.get("draft_step_s"))
    host = _num(x.get("host_s"))
    if cycle is not None:
        return (f"cycle {1e3 * cycle:.2f}ms" + (f" draft {1e3 * draft:.2f}ms" if draft is not None else "")
                + (f" host {1e3 * host:.2f}ms" if host is not None else ""))
    return f"step {1e3 * step:.2f}ms" if step is not None else ""


def degenerate_line(r: dict) -> str | None:
    d = r.get("degenerate")
    if not isinstance(d, dict) or not d.get("count"):
        return None
    return (f"degenerate completions {d['count']}/{d.get('judged')} (distinct bigrams < {d.get('threshold')}): "
            f"repetition inflates acceptance")


def _fmt(v) -> str:
    n = _num(v)
    return "-" if n is None else f"{n:.2f}"


def gauges(r: dict) -> list[Gauge]:
    if "acceptance_length" not in r:
        return []
    out = [Gauge("eagle3_bench_acceptance_length", "Completion tokens / verify steps, bonus token included.",
                 r.get("acceptance_length")),
           Gauge("eagle3_bench_draft_tokens", "Draft tokens a verify (K).", r.get("draft_tokens")),
           Gauge("eagle3_bench_speedup_ratio", "Plain decoding time / speculative decoding time.", r.get("speedup"))]
    match = r.get("outputs_match")
    if isinstance(match, bool):
        out.append(Gauge("eagle3_bench_outputs_match", "1 when the speculative output equals greedy decoding.",
                         1 if match else 0))
    rates = r.get("accept_rate_per_position")
    if isinstance(rates, list):
        out += [Gauge("eagle3_bench_accept_rate_ratio", "Share of draft k accepted when drafts 1..k-1 were.", v,
                      (("position", str(k)),)) for k, v in enumerate(rates, 1)]
    c = r.get("cycle") if isinstance(r.get("cycle"), dict) else {}
    for key, name, doc in (("cycle_s", "eagle3_bench_cycle_seconds", "A verify cycle (drafts + verify) at batch 1."),
                           ("plain_step_s", "eagle3_bench_plain_step_seconds", "A plain target decode step at batch 1."),
                           ("draft_step_s", "eagle3_bench_draft_step_seconds", "A drafter step at batch 1 (SGLang's "
                            "device timer)."),
                           ("host_s", "eagle3_bench_cycle_host_seconds", "A verify cycle's time outside its GPU "
                            "forwards at batch 1 (scheduling, sampling, launches).")):
        if _num(c.get(key)) is not None:
            out.append(Gauge(name, doc, _num(c.get(key))))
    dr = r.get("drift")
    if isinstance(dr, dict) and _num(dr.get("share")) is not None:
        out.append(Gauge("eagle3_bench_drift_ratio", "Share of prompts whose speculative output differs from the "
                         "baseline's greedy output.", _num(dr.get("share"))))
    d = r.get("degenerate")
    if isinstance(d, dict):
        out.append(Gauge("eagle3_bench_degenerate_ratio", "Share of completions whose distinct-bigram ratio is "
                         "below the threshold (repetition loops).", _num(d.get("share"))))
    for x in r.get("table") or []:
        if not isinstance(x, dict):
            continue
        labels = (("setting", str(x.get("label"))), ("concurrency", str(x.get("concurrency"))))
        out += [Gauge("eagle3_bench_table_acceptance_length", "Acceptance length of a (steps,topk,draft tokens) "
                      "setting at a concurrency.", _num(x.get("acceptance_length")), labels),
                Gauge("eagle3_bench_table_output_tokens_per_second", "Completion tokens / wall time of the row.",
                      _num(x.get("tok_s")), labels)]
    return out


def drift_words(d: dict) -> str:
    """bench.json's drift record in words: how many prompts differ, where they part first,
    the target's own drift beside it, and the verdict (ops/bench/figures.py judge_drift)."""
    floor = d.get("floor")
    own = (f"target's own {floor.get('differing')}/{floor.get('prompts')} at x{floor.get('concurrency')}"
           if isinstance(floor, dict) else "target's own drift not measured")
    where = f"first at token {d.get('first_diff_min')}-{d.get('first_diff_max')}; {own}"
    if d.get("verdict") == "broken":
        return f"OUTPUT DIFFERS FROM BASELINE GREEDY on {d.get('differing')}/{d.get('prompts')} prompts ({where}): NOT NUMERICS"
    return f"output differs from the baseline on {d.get('differing')}/{d.get('prompts')} prompts ({where}): numerics"


def cycle_words(c) -> str:
    """The verify cycle at batch 1 beside a plain target step, where bench.json has them."""
    if not isinstance(c, dict) or not isinstance(c.get("cycle_s"), (int, float)):
        return ""
    out = f"cycle {1e3 * c['cycle_s']:.2f} ms"
    if isinstance(c.get("draft_step_s"), (int, float)):
        out += f" (draft step {1e3 * c['draft_step_s']:.2f} ms"
        out += f", verify {1e3 * c['verify_s']:.2f} ms" if isinstance(c.get("verify_s"), (int, float)) else ""
        out += f", host {1e3 * c['host_s']:.2f} ms)" if isinstance(c.get("host_s"), (int, float)) else ")"
    if isinstance(c.get("plain_step_s"), (int, float)):
        out += f" vs plain step {1e3 * c['plain_step_s']:.2f} ms"
    return out
