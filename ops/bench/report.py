"""bench.json's table and comparisons, added to an engine's result (ops/bench/__main__.py).

`table`: a row per (setting, concurrency) (ops/bench/table.py); `completions`:
the tokens of the first setting at concurrency 1, by prompt, so that another
run on the same prompts can be compared with this one (`--compare`: a
bench.json of the other engine): how many completions differ and their token
counts, beside both acceptance lengths. Rows at a concurrency above 1 say how
many completions differ from the same setting's at 1 (batched kernels can
break greedy ties otherwise). Rows at concurrency 1 give the verify cycle
(speculative) or the plain target step (baseline) at batch 1.

With engine sglang and a baseline, `drift` (ops/bench/figures.py judge_drift):
the prompts whose speculative answer differs from the baseline's (the main pass,
both at concurrency 1), where each parts first, beside the baseline's own
drift between concurrency 1 and the table's highest concurrency (or
FLOOR_CONCURRENCY, in a pass of its own when the table has none above 1), and
the verdict: numerics, or a broken drafter (the stage fails).
"""

from __future__ import annotations

import json
from pathlib import Path

from ops.bench.figures import (FLOOR_CONCURRENCY, Setting, compare_completions, degenerate, first_differences,
                               judge_drift, parse_concurrency, parse_settings, rates_from_histogram)
from ops.bench.table import Decoded, row, run_row


def _settings(args) -> list[Setting]:
    if args.settings:
        return parse_settings(args.settings)
    return [Setting(args.draft_tokens, 1, args.draft_tokens + 1)]


def reference_table(result: dict, args, prompts, decoded, seconds: float, decode_at, log=print) -> None:
    """The reference engine's rows: the main pass is the first setting at concurrency 1."""
    try:
        settings, levels = _settings(args), parse_concurrency(args.concurrency)
    except ValueError as exc:
        from ops.common import BadInput
        raise BadInput(str(exc)) from None
    main = Setting(args.draft_tokens, 1, args.draft_tokens + 1)
    rows, first = [], {}
    for setting in settings:
        for c in levels:
            if setting == main and c == 1:
                r, tokens = row(setting, 1, prompts, decoded, seconds), \
                    {idx: d.tokens for (idx, _), d in zip(prompts, decoded)}
            else:
                r, tokens = run_row(decode_at(setting.steps), prompts, setting, c)
            _against_first(r, tokens, first.setdefault(setting, tokens))
            rows.append(r)
            log(f"bench: {r['label']} x{c}: acceptance length {r['acceptance_length']:.2f}, "
                f"{r['tok_s']:.1f} tok/s, degenerate {r['degenerate']['count']}/{r['degenerate']['judged']}")
    finish(result, rows, {idx: d.tokens for (idx, _), d in zip(prompts, decoded)}, args.compare)


def sglang_table(result: dict, urls: list[str], baseline_url: str | None, prompts, max_new_tokens: int,
                 timeout: float, args, log=print) -> None:
    """SGLang's rows: each speculative server (one per setting, its /server_info says
    which) and the baseline at each concurrency, the radix cache flushed before each."""
    from ops.bench import sglang

    try:
        levels = parse_concurrency(args.concurrency)
    except ValueError as exc:
        from ops.common import BadInput
        raise BadInput(str(exc)) from None

    def decode_on(url: str, setting: Setting | None):
        def decode(ids: list[int]) -> Decoded:
            a = sglang.generate(url, ids, max_new_tokens, timeout)
            if a.histogram is None or setting is None:
                return Decoded(a.output_ids, a.verify_ct or 0, decode_s=a.decode_s)
            _, accepted, examined = rates_from_histogram(a.histogram, setting.steps)
            return Decoded(a.output_ids, a.verify_ct or 0, accepted, examined, a.decode_s)
        return decode

    probe = min(timeout, sglang.PROBE_TIMEOUT_S)
    rows, first, completions = [], {}, None
    base_tok_s: dict[int, float] = {}
    base_tokens: dict[int, dict] = {}       # the baseline's completions by concurrency
    servers = [(u, None) for u in ([baseline_url] if baseline_url else [])] + [(u, "spec") for u in urls]
    for url, kind in servers:
        info = sglang.server_info(url, min(timeout, sglang.PROBE_TIMEOUT_S))
        setting = None if kind is None else Setting(int(info.get("speculative_num_steps") or 0),
                                                    int(info.get("speculative_eagle_topk") or 1),
                                                    int(info.get("speculative_num_draft_tokens") or 0))
        for c in levels:
            sglang.flush_cache(url, probe)
            before = sglang.forward_seconds(url, probe) if c == 1 else None
            r, tokens = run_row(decode_on(url, setting), prompts, setting, c)
            r["url"] = url
            if before is not None and setting is not None and r["verify_steps"]:
                # The device timer's split of this setting's cycle (SGLANG_ENABLE_METRICS_DEVICE_TIMER=1).
                from ops.bench.figures import forward_split, host_time
                r.update(forward_split(sglang.forward_delta(before, sglang.forward_seconds(url, probe)),
                                       r["verify_steps"], setting.steps))
                if "draft_step_s" in r:
                    r["host_s"] = host_time(r.get("cycle_s"), r.get("time_source", ""), r.get("verify_s"),
                                            r["draft_step_s"] * setting.steps)
            _against_first(r, tokens, first.setdefault(url, tokens))
            if setting is None:
                base_tok_s[c] = r["tok_s"]
                base_tokens[c] = tokens
            else:
                if c in base_tok_s:
                    r["speedup"] = r["tok_s"] / max(base_tok_s[c], 1e-9)
                if c in base_tokens:
                    r["differing_from_baseline"] = len(first_differences(tokens, base_tokens[c]))
            if completions is None and setting is not None:
                completions = tokens
            rows.append(r)
            al = r["acceptance_length"]
            log(f"bench: {r['label']} x{c} {url}: " + (f"acceptance length {al:.2f}, " if al else "")
                + f"{r['tok_s']:.1f} tok/s, degenerate {r['degenerate']['count']}/{r['degenerate']['judged']}")
    if baseline_url:
        def batched_baseline(c: int) -> dict:
            sglang.flush_cache(baseline_url, probe)
            return run_row(decode_on(baseline_url, None), prompts, None, c)[1]
        result["drift"] = drift(result, prompts, base_tokens, levels, batched_baseline, log)
    finish(result, rows, completions or {}, args.compare)


def drift(result: dict, prompts, base_tokens: dict[int, dict], levels: list[int], decode_base, log=print) -> dict:
    """The drift record: the main pass's speculative vs baseline answers (run_bench's
    mismatches), beside the baseline's own answers at concurrency 1 vs its highest
    (a pass at FLOOR_CONCURRENCY when the table has none above 1)."""
    c = max(levels)
    if c > 1:
        batched = base_tokens[c]
    else:
        c = FLOOR_CONCURRENCY
        batched = decode_base(c)
    main = result.get("baseline_completions") or {}
    ones = {idx: main[str(idx)] for idx, _ in prompts if str(idx) in main} or base_tokens.get(1, {})
    floor = {"concurrency": c, "differing": len(first_differences(batched, ones)), "prompts": len(ones)}
    first = {m["prompt"]: m["first_diff"] for m in result.get("mismatches") or []}
    out = judge_drift(first, len(prompts), floor)
    log(f"bench: drift: {out['reason']}")
    return out


def _against_first(r: dict, tokens: dict, first: dict) -> None:
    if tokens is not first:
        r["differing_from_concurrency_1"] = compare_completions(tokens, first)["differing_completions"]


def finish(result: dict, rows: list[dict], completions: dict, compare: str | None) -> None:
    """Add the table, the completions, their degenerate share and the comparison to `result`."""
    result["table"] = rows
    result["completions"] = {str(k): list(v) for k, v in completions.items()}
    result["degenerate"] = degenerate(completions)
    if compare:
        result["compared"] = compared(result, Path(compare))


def compared(result: dict, other_path: Path) -> dict:
    from ops.common import BadInput

    try:
        other = json.loads(other_path.read_text())
        theirs = other["completions"]
        if not isinstance(theirs, dict):
            raise TypeError("not an object")
    except (OSError, ValueError) as exc:
        raise BadInput(f"compare {other_path}: not a readable bench.json ({exc})") from None
    except (KeyError, TypeError) as exc:
        raise BadInput(f"compare {other_path}: key 'completions': expected an object of prompt -> tokens, "
                       f"as bench writes ({exc})") from None
    out = compare_completions(result["completions"], theirs)
    out.update({"with": str(other_path), "engine_other": other.get("engine"),
                "acceptance_length": result.get("acceptance_length"),
                "acceptance_length_other": other.get("acceptance_length")})
    return out
