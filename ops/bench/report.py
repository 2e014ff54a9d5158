"""bench.json's table and comparisons, added to an engine's result (ops/bench/__main__.py).

`table`: a row per (setting, concurrency) (ops/bench/table.py); `completions`:
the tokens of the first setting at concurrency 1, by prompt, so that another
run on the same prompts can be compared with this one (`--compare`: a
bench.json of the other engine): how many completions differ and their token
counts, beside both acceptance lengths. Rows at a concurrency above 1 say how
many completions differ from the same setting's at 1 (batched kernels can
break greedy ties otherwise).
"""

from __future__ import annotations

import json
from pathlib import Path

from ops.bench.figures import (Setting, compare_completions, degenerate, parse_concurrency, parse_settings,
                               rates_from_histogram)
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
                return Decoded(a.output_ids, a.verify_ct or 0)
            _, accepted, examined = rates_from_histogram(a.histogram, setting.steps)
            return Decoded(a.output_ids, a.verify_ct or 0, accepted, examined)
        return decode

    rows, first, completions = [], {}, None
    base_tok_s: dict[int, float] = {}
    servers = [(u, None) for u in ([baseline_url] if baseline_url else [])] + [(u, "spec") for u in urls]
    for url, kind in servers:
        info = sglang.server_info(url, min(timeout, sglang.PROBE_TIMEOUT_S))
        setting = None if kind is None else Setting(int(info.get("speculative_num_steps") or 0),
                                                    int(info.get("speculative_eagle_topk") or 1),
                                                    int(info.get("speculative_num_draft_tokens") or 0))
        for c in levels:
            sglang.flush_cache(url, min(timeout, sglang.PROBE_TIMEOUT_S))
            r, tokens = run_row(decode_on(url, setting), prompts, setting, c)
            r["url"] = url
            _against_first(r, tokens, first.setdefault(url, tokens))
            if setting is None:
                base_tok_s[c] = r["tok_s"]
            elif c in base_tok_s:
                r["speedup"] = r["tok_s"] / max(base_tok_s[c], 1e-9)
            if completions is None and setting is not None:
                completions = tokens
            rows.append(r)
            al = r["acceptance_length"]
            log(f"bench: {r['label']} x{c} {url}: " + (f"acceptance length {al:.2f}, " if al else "")
                + f"{r['tok_s']:.1f} tok/s, degenerate {r['degenerate']['count']}/{r['degenerate']['judged']}")
    finish(result, rows, completions or {}, args.compare)


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
