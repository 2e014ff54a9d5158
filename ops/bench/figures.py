"""The figures users compare drafters by, computed alike for both engines.

Sits between the decoders (ops/bench/speculative.py, ops/bench/sglang.py) and
bench.json / the console (ops/bench/view.py). No torch.

- Per-position acceptance, conditional: draft i accepted given drafts 1..i-1
  were. The reference decoder counts it itself; SGLang 0.5.23 returns per
  request `meta_info.spec_correct_drafts_histogram` (tokenizer_manager.py,
  _calculate_spec_decoding_metrics; filled by schedule_batch.py's
  Req.update_spec_correct_drafts_histogram): entry m = verify steps that
  accepted m drafts, the bonus token excluded. Draft i was accepted in the
  steps with m >= i and examined in those with m >= i - 1.
- Degenerate completions: a repetition loop is easy to draft, so it inflates
  acceptance; a completion whose distinct-bigram ratio (distinct bigrams /
  bigrams) is below DEGENERATE_BELOW is flagged, and the share is reported.
"""

from __future__ import annotations

from dataclasses import dataclass

DEGENERATE_BELOW = 0.5
# A completion this short has too few bigrams to judge.
MIN_BIGRAMS = 8


@dataclass(frozen=True)
class Setting:
    """SGLang's speculative knobs: --speculative-num-steps, -eagle-topk, -num-draft-tokens."""

    steps: int
    topk: int
    draft_tokens: int

    def label(self) -> str:
        return f"({self.steps},{self.topk},{self.draft_tokens})"

    def as_json(self) -> dict:
        return {"steps": self.steps, "topk": self.topk, "draft_tokens": self.draft_tokens}


def parse_settings(text: str) -> list[Setting]:
    """"3/1/4,5/1/6" -> the settings; the reference decoder drafts a chain: topk 1,
    draft tokens = steps + 1 (the verified token and the drafts)."""
    out = []
    for word in str(text).split(","):
        parts = word.strip().split("/")
        try:
            steps, topk, draft = (int(p) for p in parts)
        except ValueError:
            raise ValueError(f"expected steps/topk/draft_tokens triples such as 3/1/4,5/1/6, got {word.strip()!r}") \
                from None
        if steps < 1 or topk != 1 or draft != steps + 1:
            raise ValueError(f"setting {word.strip()}: the reference decoder drafts a chain (topk 1, "
                             f"draft_tokens = steps + 1)")
        out.append(Setting(steps, topk, draft))
    return out


def parse_concurrency(text: str) -> list[int]:
    """"1,8" -> [1, 8]: requests in flight at once."""
    try:
        out = [int(w) for w in str(text).split(",")]
    except ValueError:
        raise ValueError("expected comma-separated whole numbers such as 1,8") from None
    if not out or min(out) < 1:
        raise ValueError("expected comma-separated whole numbers >= 1 such as 1,8")
    return out


def distinct_bigram_ratio(tokens: list[int]) -> float | None:
    bigrams = list(zip(tokens, tokens[1:]))
    if len(bigrams) < MIN_BIGRAMS:
        return None
    return len(set(bigrams)) / len(bigrams)


def degenerate(completions: dict) -> dict:
    """{"threshold", "judged", "count", "share", "prompts"} over {prompt: tokens}."""
    ratios = {p: distinct_bigram_ratio(list(t)) for p, t in completions.items()}
    judged = {p: r for p, r in ratios.items() if r is not None}
    low = sorted(p for p, r in judged.items() if r < DEGENERATE_BELOW)
    return {"threshold": DEGENERATE_BELOW, "judged": len(judged), "count": len(low),
            "share": len(low) / len(judged) if judged else None, "prompts": low}


def rates_from_histogram(hist: list[int], drafts: int) -> tuple[list[float | None], list[int], list[int]]:
    """(conditional acceptance of draft 1..drafts, accepted counts, examined counts) from
    SGLang's correct-drafts histogram (summed over requests)."""
    h = list(hist) + [0] * max(0, drafts + 1 - len(hist))
    accepted = [sum(h[i:]) for i in range(1, drafts + 1)]
    examined = [sum(h[i - 1:]) for i in range(1, drafts + 1)]
    return [a / e if e else None for a, e in zip(accepted, examined)], accepted, examined


def add_histograms(hists: list[list[int]]) -> list[int]:
    out: list[int] = []
    for h in hists:
        out += [0] * max(0, len(h) - len(out))
        for i, v in enumerate(h):
            out[i] += int(v)
    return out


def compare_completions(ours: dict, theirs: dict) -> dict:
    """Where two runs on the same prompts gave different tokens: the count and the token totals."""
    common = sorted(set(ours) & set(theirs), key=str)
    differ = [p for p in common if list(ours[p]) != list(theirs[p])]
    return {"prompts": len(common), "differing_completions": len(differ), "differing_prompts": differ[:50],
            "tokens": sum(len(ours[p]) for p in common), "tokens_other": sum(len(theirs[p]) for p in common)}


# --- speculative vs plain greedy output: numerics or a broken drafter ---------------------
#
# On a real bf16 target greedy output is not bit-reproducible: a verify step scores K+1
# tokens in one forward, plain decoding one, and batching changes the kernels' reduction
# order, so a near-tie between two tokens can flip and the rest of the answer follows
# another path (Qwen2.5-Coder-1.5B on an H100, SGLang 0.5.23: 11 of 48 prompts differed,
# first at token 0 to 241, while the plain server's own answers differed between
# concurrency 1 and 8 on 8 of 48). What numerics cannot explain:
# - most prompts differing within their first tokens: more than MOST_SHARE of the prompts
#   differ before token EARLY_TOKENS (a near-tie is rare, it does not hit most prompts at once);
# - far more drift than the target's own: more prompts differ than DRIFT_FACTOR x the prompts
#   on which the plain server's answers at concurrency 1 and FLOOR_CONCURRENCY differ, with
#   at least ALLOWANCE_SHARE of the prompts allowed (a target that drifted on none still has
#   near-ties that the verify kernels can flip).
EARLY_TOKENS = 8
MOST_SHARE = 0.5
DRIFT_FACTOR = 3
ALLOWANCE_SHARE = 0.125
FLOOR_CONCURRENCY = 8


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first position where two completions differ (the shorter one's length when one
    is a prefix of the other); None when they are equal."""
    if list(a) == list(b):
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def first_differences(ours: dict, theirs: dict) -> dict:
    """{prompt: first differing position} over the prompts both have that differ."""
    out = {}
    for p in sorted(set(ours) & set(theirs), key=str):
        pos = first_difference(list(ours[p]), list(theirs[p]))
        if pos is not None:
            out[p] = pos
    return out


def allowed_drift(prompts: int, floor_differing: int | None) -> int:
    """The most differing prompts numerics explain, given the target's own drift."""
    import math

    return max(DRIFT_FACTOR * (floor_differing or 0), math.ceil(ALLOWANCE_SHARE * prompts))


def judge_drift(first_diff: dict, prompts: int, floor: dict | None) -> dict:
    """The drift record of bench.json: `first_diff` {prompt: position} of the prompts whose
    speculative output differs from the plain server's (both at concurrency 1), `prompts`
    compared, `floor` {"concurrency", "differing", "prompts"}: the plain server's own answers
    at concurrency 1 vs `concurrency` (None: not measured). verdict "match" (no prompt
    differs), "numerics" (within the rule above) or "broken" (outside it: the stage fails)."""
    n = int(prompts)
    d = len(first_diff)
    early = sorted((p for p, pos in first_diff.items() if pos < EARLY_TOKENS), key=str)
    f = floor.get("differing") if isinstance(floor, dict) else None
    allowed = allowed_drift(n, f)
    positions = sorted(first_diff.values())
    out = {"prompts": n, "differing": d, "share": d / n if n else None,
           "first_diff": {str(p): int(pos) for p, pos in first_diff.items()},
           "first_diff_min": positions[0] if positions else None,
           "first_diff_max": positions[-1] if positions else None,
           "early": len(early), "early_tokens": EARLY_TOKENS, "floor": floor, "allowed": allowed,
           "rule": {"early_tokens": EARLY_TOKENS, "most_share": MOST_SHARE, "drift_factor": DRIFT_FACTOR,
                    "allowance_share": ALLOWANCE_SHARE}}
    own = (f"the target's own drift {f}/{floor.get('prompts', n)} between concurrency 1 and "
           f"{floor.get('concurrency')}" if f is not None else "the target's own drift not measured")
    if d == 0:
        out.update(verdict="match", reason="speculative output == the baseline's greedy output on every prompt")
    elif len(early) > MOST_SHARE * n:
        out.update(verdict="broken", reason=f"{len(early)} of {n} prompts differ within their first {EARLY_TOKENS} "
                                            f"tokens (more than {MOST_SHARE:.0%}): not numerics")
    elif d > allowed:
        out.update(verdict="broken", reason=f"{d} of {n} prompts differ, more than numerics explain: {allowed} "
                                            f"(max of {DRIFT_FACTOR} x {own}, and {ALLOWANCE_SHARE:.1%} of the "
                                            f"prompts)")
    else:
        out.update(verdict="numerics", reason=f"{d} of {n} prompts differ (first at token {positions[0]} to "
                                              f"{positions[-1]}), within numerics: at most {allowed} ({own})")
    return out


# --- the verify cycle at batch 1 ---------------------------------------------------------

def time_per(items, div) -> tuple[float | None, str]:
    """(sum of server-side decode seconds, else of wall seconds) / div, and which it was."""
    if not items or not div:
        return None, "none"
    if all(d is not None for d, *_ in items):
        return sum(d for d, *_ in items) / div, "meta_info"
    return sum(w for *_, w in items) / div, "wall"


def plain_step(base: list[tuple]) -> tuple[float | None, str]:
    """A plain target step at batch 1 from the baseline's requests [(decode_s, _, completion
    tokens, wall_s)]: decode seconds / (completion tokens - 1) (the prefill gave the first
    token), else wall seconds / completion tokens."""
    if base and all(d is not None for d, *_ in base):
        return time_per(base, sum(max(0, c - 1) for _, _, c, _ in base))
    return time_per(base, sum(c for _, _, c, _ in base))


def cycle_figures(spec: list[tuple], base: list[tuple] | None, num_steps: int | None,
                  spec_fwd: dict | None, base_fwd: dict | None) -> dict:
    """bench.json's "cycle": `spec`/`base` the batch-1 requests [(decode_s or None, verify
    steps, completion tokens, wall_s)] of the speculative and plain servers; `*_fwd` the
    growth of their forward seconds by category (SGLang's device timer) over those requests.
    cycle_s = decode seconds / verify steps (source "meta_info": SGLang's e2e_latency -
    first_token_latency) or wall seconds / verify steps (source "wall"); verify_s, draft_s
    (a cycle's drafter forwards) and draft_step_s = draft_s / num_steps where the device
    timer ran; host_s (host_time) where both kinds of figure are the server's own."""
    steps = sum(v for _, v, _, _ in spec)
    cycle, source = time_per(spec, steps)
    out: dict = {"batch": 1, "verify_steps": steps, "cycle_s": cycle, "source": source,
                 "plain_step_s": None, "plain_source": None, "cycle_over_plain_step": None,
                 "verify_s": None, "draft_s": None, "draft_step_s": None, "plain_forward_s": None,
                 "device_timer": spec_fwd is not None}
    if base:
        out["plain_step_s"], out["plain_source"] = plain_step(base)
        if cycle is not None and out["plain_step_s"]:
            out["cycle_over_plain_step"] = cycle / out["plain_step_s"]
    split = forward_split(spec_fwd, steps, num_steps)
    out.update(split)
    if "draft_step_s" in split:
        out["draft_s"] = split["draft_step_s"] * num_steps
    out["host_s"] = host_time(cycle, source, out["verify_s"], out["draft_s"])
    if base_fwd is not None and base:
        decodes = sum(max(0, c - 1) for _, _, c, _ in base)
        if decodes:
            out["plain_forward_s"] = base_fwd.get("decode", 0.0) / decodes
    return out


def host_time(cycle_s: float | None, source: str, verify_s: float | None, draft_s: float | None) -> float | None:
    """The cycle's time outside the GPU forwards the device timer counts: the scheduler, sampling
    and launches that overlap scheduling did not hide. Where it exceeds the drafts, the drafter's
    quality cannot buy a speed-up (Qwen2.5-Coder-1.5B on an H100: 1.62 of a 4.38 ms cycle, RESULTS.md).
    Only from the server's own decode time (source "meta_info"): wall time would add the client's."""
    if source != "meta_info" or None in (cycle_s, verify_s, draft_s):
        return None
    return cycle_s - verify_s - draft_s


def forward_split(fwd: dict | None, steps: int, num_steps: int | None) -> dict:
    """{"verify_s", "draft_step_s"} of a cycle from the growth of SGLang's forward seconds by
    category over `steps` verify steps: `target_verify`, and the drafter's graphs
    (`eagle_draft`: num_steps - 1 forwards, `eagle_draft_extend`: one) / num_steps. Only the
    categories the server counted (the drafter's are named so when its CUDA graphs ran)."""
    out: dict = {}
    if not fwd or not steps:
        return out
    if "target_verify" in fwd:
        out["verify_s"] = fwd["target_verify"] / steps
    draft = [v for c, v in fwd.items() if "draft" in c]
    if draft and num_steps:
        out["draft_step_s"] = sum(draft) / steps / num_steps
    return out
