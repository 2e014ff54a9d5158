"""bench.json's `by_kind`: code prompts and chat prompts apart (issue 36 item 7).

A held-out prompt counts as `code` when its text or the target's own answer to it holds a fenced
code block (```), the form chat-tuned models answer code in; else `chat`. The answer is the
baseline's greedy one at concurrency 1 (else the speculative one): the same for every setting, so
a prompt's kind does not depend on the drafter. Reading the text needs the target's tokenizer
(bench's --target); without one bench.json has no split. A keyword list would be a second guess
at what the model itself says by writing a fence.

Per kind, from the main pass at batch 1: prompts, acceptance length (completion tokens / verify
steps), speculative and plain tok/s and their ratio.

Data flow: sglang.run_bench's result (per_prompt, the completions) + the prompts' ids + a
tokenizer -> (this) -> bench.json `by_kind`, bench's line, the console's details.
"""

from __future__ import annotations

FENCE = "```"
KINDS = ("code", "chat")
RULE = "code: a fenced code block (```) in the prompt or in the target's own answer; chat: the rest"


def prompt_kind(prompt_text: str, answer_text: str) -> str:
    return "code" if FENCE in prompt_text or FENCE in answer_text else "chat"


def kinds_of(result: dict, prompts: list[tuple[int, list[int]]], decode) -> dict[int, str]:
    """{prompt: kind} of the prompts whose answer bench.json keeps; `decode` ids -> text."""
    answers = result.get("baseline_completions") or result.get("completions") or {}
    return {idx: prompt_kind(decode(ids), decode(answers[str(idx)]))
            for idx, ids in prompts if str(idx) in answers}


def split(per_prompt: list[dict], kinds: dict[int, str]) -> dict:
    """{"rule", "kinds": {kind: figures}} over the main pass's per-prompt figures."""
    out: dict = {"rule": RULE, "kinds": {}}
    for kind in KINDS:
        rows = [p for p in per_prompt if kinds.get(p["prompt"]) == kind]
        if not rows:
            continue
        tokens = sum(p["completion_tokens"] for p in rows)
        steps = sum(p.get("spec_verify_ct") or 0 for p in rows)
        seconds = sum(p["seconds"] for p in rows)
        fig = {"prompts": len(rows), "completion_tokens": tokens, "verify_steps": steps,
               "acceptance_length": tokens / steps if steps else None,
               "tok_s_speculative": tokens / max(seconds, 1e-9), "tok_s_plain": None, "speedup": None}
        if all(isinstance(p.get("seconds_plain"), (int, float)) for p in rows):
            plain = sum(p["completion_tokens_plain"] for p in rows) / max(sum(p["seconds_plain"] for p in rows), 1e-9)
            fig["tok_s_plain"], fig["speedup"] = plain, fig["tok_s_speculative"] / max(plain, 1e-9)
        out["kinds"][kind] = fig
    return out


def words(by_kind) -> str:
    """`code 16: AL 1.75, 0.91x; chat 16: AL 1.61, 0.81x`, where bench.json has the split."""
    if not isinstance(by_kind, dict) or not isinstance(by_kind.get("kinds"), dict):
        return ""
    parts = []
    for kind, f in by_kind["kinds"].items():
        if not isinstance(f, dict) or not isinstance(f.get("acceptance_length"), (int, float)):
            continue
        speed = f", {f['speedup']:.2f}x" if isinstance(f.get("speedup"), (int, float)) else ""
        parts.append(f"{kind} {f.get('prompts')}: AL {f['acceptance_length']:.2f}{speed}")
    return "; ".join(parts)
