"""Spec of the bench stage: speculative decoding with the exported drafter vs plain greedy.

Output: <output>/bench.json (acceptance length, acceptance per draft position,
speed-up, whether outputs matched greedy); the log's `bench:` line is the
summary the console shows next to the stage.
"""

from __future__ import annotations

from ops.spec import REQUIRED, OpSpec

def result_line(r: dict) -> str | None:
    """bench.json in a line: what the whole pipeline was for."""
    if "acceptance_length" not in r:
        return None
    per_pos = ", ".join(f"{a:.2f}" for a in r.get("accept_rate_per_position") or [])
    match = "speculative output == greedy" if r.get("outputs_match") else "OUTPUT DIFFERS FROM GREEDY"
    speed = f", speed-up {r['speedup']:.2f}x" if isinstance(r.get("speedup"), (int, float)) else ""
    return (f"acceptance length {r['acceptance_length']:.2f} (K={r.get('draft_tokens', '?')}; "
            f"per position {per_pos}){speed}; {match}")


SPEC = OpSpec(
    name="bench",
    summary="reference EAGLE-3 speculative decoding (chain, top-1) vs greedy: acceptance length, speed-up",
    params={
        "drafter": REQUIRED,        # export's output directory
        "output": REQUIRED,
        "data": None,
        "prompts_file": None,
        "num_prompts": 8,
        "max_new_tokens": 64,
        "draft_tokens": 5,
        "device": "auto",
        "dtype": "auto",
    },
    output_params=("output",),
    uses_target=True,
    uses_gpu=True,
    progress="log",
    estimate_bytes=lambda ctx: 64 * 1024,
    result_file="bench.json",
    result_line=result_line,
)
