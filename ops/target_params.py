"""The params of "the target, run here": declared once, taken by every op that
runs the target's forward to get its states (extract, and train in online
mode), so the two can never read the same key two ways.

Where it sits: below the stages (ops/<op>/spec.py import it); cheap to import.
"""

from __future__ import annotations

from dataclasses import replace

from ops.params import Param

LAYER_IDS = Param("layer_ids", "auto", "canonical aux layers (0-indexed layer whose OUTPUT is captured), e.g. "
                  "2,30,58; auto = [1, N//2-1, N-4]")
DTYPE = Param("dtype", "auto", "auto (the checkpoint's), bfloat16, float16, float32")
DEVICE = Param("device", "auto", "auto, cpu, cuda, cuda:N, balanced (device_map=auto)")


def named(param: Param, name: str, help_prefix: str = "") -> Param:
    """The same declaration under another key (train's `target_dtype`: its own
    `device` and numerics are the drafter's)."""
    return replace(param, name=name, help=help_prefix + param.help)
