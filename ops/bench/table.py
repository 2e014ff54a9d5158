"""bench's table: one row per (setting, concurrency), the same columns for both engines.

Sits between a decoder (a function that decodes one prompt at one setting)
and bench.json's "table". A row's requests run `concurrency` at a time
(threads: the reference decoder's torch forwards and urllib's waits both
release the GIL), so its output tok/s is what that many users in flight get
together: completion tokens over the wall time of the row.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from ops.bench.figures import Setting, degenerate, plain_step, time_per


@dataclass
class Decoded:
    """One prompt decoded speculatively at one setting."""

    tokens: list[int]
    verify_steps: int
    accepted: list[int] = field(default_factory=list)     # [drafts]: steps whose draft i was accepted
    examined: list[int] = field(default_factory=list)     # [drafts]: steps where draft i was examined
    decode_s: float | None = None       # the server's decode time (SGLang's meta_info), where it says


def run_row(decode: Callable[[list[int]], Decoded], prompts: list[tuple[int, list[int]]],
            setting: Setting | None, concurrency: int) -> tuple[dict, dict]:
    """(the row, {prompt: tokens}) of decoding every prompt at `setting`."""
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        done = list(pool.map(lambda p: decode(p[1]), prompts))
    seconds = time.perf_counter() - t0
    return row(setting, concurrency, prompts, done, seconds), {idx: d.tokens for (idx, _), d in zip(prompts, done)}


def row(setting: Setting | None, concurrency: int, prompts, done: list[Decoded], seconds: float) -> dict:
    """A row's figures; setting None: the baseline server (no speculation)."""
    drafts = setting.steps if setting is not None else 0
    accepted = [sum(d.accepted[i] for d in done if i < len(d.accepted)) for i in range(drafts)]
    examined = [sum(d.examined[i] for d in done if i < len(d.examined)) for i in range(drafts)]
    tokens = sum(len(d.tokens) for d in done)
    steps = sum(d.verify_steps for d in done)
    return {
        "setting": setting.as_json() if setting is not None else None,
        "label": setting.label() if setting is not None else "baseline", "concurrency": concurrency,
        "prompts": len(done), "completion_tokens": tokens, "verify_steps": steps,
        "acceptance_length": tokens / steps if steps and setting is not None else None,
        "seconds": seconds, "tok_s": tokens / max(seconds, 1e-9),
        "accept_rate_per_position": [a / e if e else None for a, e in zip(accepted, examined)],
        "accepted_per_position": accepted, "examined_per_position": examined,
        "degenerate": degenerate({idx: d.tokens for (idx, _), d in zip(prompts, done)}),
        **(_batch_1(setting, done, seconds) if concurrency == 1 else {}),
    }


def _batch_1(setting: Setting | None, done: list[Decoded], seconds: float) -> dict:
    """At concurrency 1: a speculative row's verify cycle (decode seconds / verify steps), a
    baseline row's plain step (decode seconds / (tokens - 1)); the server's decode seconds
    where every answer says them, else the row's wall time (ops/bench/figures.py)."""
    if all(d.decode_s is not None for d in done):
        items = [(d.decode_s, d.verify_steps, len(d.tokens), 0.0) for d in done]
    else:
        items = [(None, sum(d.verify_steps for d in done), sum(len(d.tokens) for d in done), seconds)]
    if setting is None:
        step, source = plain_step(items)
        return {"step_s": step, "time_source": source}
    cycle, source = time_per(items, sum(v for _, v, _, _ in items))
    return {"cycle_s": cycle, "time_source": source}
