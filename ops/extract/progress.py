"""Progress lines of extract, the ones the console's log monitor parses.

Sits between the writers (which count a sample once its file is renamed) and
the run's log. Two kinds of line on stdout:
- tqdm's `N/M [elapsed<eta, X sample/s]` (ops.common.progress), rank 0 only;
- every `interval` seconds and at the end:
  `progress: samples DONE/TOTAL tokens TOKENS errors N tok/s X`
  (with ` rank R/W` appended under torchrun: each rank reports its share).
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Callable


class Progress:
    def __init__(self, total: int, done: int, tokens: int, *, interval: float = 5.0,
                 rank: int = 0, world: int = 1, bar: bool = True,
                 errors: Callable[[], int] = lambda: 0) -> None:
        self.total, self.done, self.tokens = total, done, tokens
        self.new_samples = 0
        self.new_tokens = 0
        self.rank, self.world = rank, world
        self._errors = errors
        self._lock = threading.Lock()
        self._start = time.monotonic()
        self._stop = threading.Event()
        self._bar = None
        if bar:
            from ops.common import progress as make_bar
            self._bar = make_bar(total=total, desc="extract", unit="sample")
            if done:
                self._bar.update(done)
        self._ticker = threading.Thread(target=self._tick, args=(interval,), daemon=True,
                                        name="extract-progress")
        self._ticker.start()

    def add(self, samples: int, tokens: int) -> None:
        with self._lock:
            self.done += samples
            self.tokens += tokens
            self.new_samples += samples
            self.new_tokens += tokens
            if self._bar is not None:
                self._bar.update(samples)

    def elapsed(self) -> float:
        return time.monotonic() - self._start

    def tok_per_s(self) -> float:
        return self.new_tokens / max(self.elapsed(), 1e-9)

    def line(self) -> str:
        with self._lock:
            text = (f"progress: samples {self.done}/{self.total} tokens {self.tokens} "
                    f"errors {self._errors()} tok/s {self.tok_per_s():.1f}")
        if self.world > 1:
            text += f" rank {self.rank}/{self.world}"
        return text

    def emit(self) -> None:
        print(self.line(), file=sys.stdout, flush=True)

    def _tick(self, interval: float) -> None:
        while not self._stop.wait(interval):
            self.emit()

    def close(self) -> None:
        self._stop.set()
        self._ticker.join()
        if self._bar is not None:
            self._bar.close()
        self.emit()
