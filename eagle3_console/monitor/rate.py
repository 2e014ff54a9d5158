"""Samples/s and tokens/s of a growing output over a sliding window.

Where it sits: monitor/shards.py keeps one RateWindow per ShardMonitor and
feeds it each refresh's counts; the rate (and from it the ETA) goes onto the
stage's ShardProgress. The window's observations are saved in monitors.json
(observations()/set_observations()) so that the next one-shot `status`
continues the same window.

With no earlier observation inside the window (a first refresh, a one-shot
status long after the previous one), the rate comes from the mtimes of the
sample files finished inside the window (from_mtimes), so it is still a rate
of the last `window_s` seconds.
"""

from __future__ import annotations

from collections import deque
from typing import Callable, Iterable

Rate = tuple[float | None, float | None]


class RateWindow:
    def __init__(self, window_s: float = 60.0) -> None:
        self.window_s = window_s
        self._obs: deque[tuple[float, int, int | None]] = deque()

    def observe(self, now: float, done: int, tokens: int | None) -> Rate | None:
        """Record this refresh's counts; the rate since the oldest observation
        inside the window, or None when there is none to compare with."""
        if self._obs and (done < self._obs[-1][1] or now < self._obs[-1][0]):
            self._obs.clear()       # samples removed (clean, restart) or the clock went back
        start = now - self.window_s
        while self._obs and self._obs[0][0] < start:
            self._obs.popleft()
        self._obs.append((now, done, tokens))
        # Nothing done yet (a model's load): only the last such pass marks the start,
        # or the load's minutes count as slow work (an ETA of 85 s, 13 s from the end).
        while len(self._obs) >= 3 and self._obs[0][1] == 0 and self._obs[1][1] == 0:
            self._obs.popleft()
        if len(self._obs) >= 2 and now > self._obs[0][0]:
            t0, d0, _k0 = self._obs[0]
            dt = now - t0
            return (done - d0) / dt, self._tokens_rate(now, tokens)
        return None

    def _tokens_rate(self, now: float, tokens: int | None) -> float | None:
        """Tokens/s since the oldest observation that knew its tokens: one of no
        sample at all had 0 (an empty output has no token source yet, and the
        first window of a run was a null tok/s next to a log's 692.9)."""
        if tokens is None:
            return None
        for t0, d0, k0 in self._obs:
            if k0 is None and d0 == 0:
                k0 = 0
            if k0 is not None:
                return (tokens - k0) / (now - t0) if now > t0 else None
        return None

    def drop_before(self, start: float) -> None:
        """Forget the observations made before `start` (a run's start: another run's
        counts, and the gap between the two, are no rate of this one)."""
        while self._obs and self._obs[0][0] < start:
            self._obs.popleft()

    def observations(self) -> list:
        """The window's (time, samples, tokens) observations, for the next process."""
        return list(self._obs)

    def set_observations(self, obs: Iterable) -> None:
        """Raises TypeError or ValueError for anything but observations()'s list."""
        self._obs = deque((float(t), int(d), None if k is None else int(k)) for t, d, k in obs)


def from_mtimes(recent: list[tuple[int, str]], tokens_of: Callable[[str], int | None],
                token_source: bool) -> Rate:
    """The rate of the sample files finished inside the window: `recent` is
    their (mtime_ns, relpath); tokens_of(relpath) their token counts."""
    if not recent:
        return 0.0, 0.0 if token_source else None
    recent = sorted(recent)
    span = (recent[-1][0] - recent[0][0]) / 1e9
    if len(recent) < 2 or span <= 0:
        return None, None
    # The first file marks the start of the span; the others finished inside it.
    sps = (len(recent) - 1) / span
    toks = [tokens_of(rel) for _t, rel in recent[1:]]
    tps = sum(toks) / span if all(t is not None for t in toks) else None
    return sps, tps
