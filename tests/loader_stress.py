"""`python -m tests.loader_stress PASSES`: ops.drafter.data.batch_loader iterated pass after
pass in a second thread (as ops/train/prefetch.py iterates it) while the main thread trains a
small model, as ops.train's step does. Prints `ok N passes; workers forked by this process: B`
(B: whether any worker's parent was this process) and exits 0, or, when no pass ended for
STALL_S (a pass takes a fraction of a second; a deadlocked worker holds it forever), `stalled
after N passes` with every thread's stack and exits 3. Run by tests/test_batch_loader.py."""

from __future__ import annotations

import faulthandler
import os
import sys
import threading
import time

STALL_S = 60


class Rows:
    """A tiny dataset the workers collate (importable: a forkserver's worker unpickles it)."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> dict:
        import torch

        return {"x": torch.randn(64, 64), "parent": os.getppid()}


def main(passes: int) -> int:
    import torch

    from ops.drafter.data import batch_loader

    done = [0]
    last = [time.monotonic()]
    parents: set[int] = set()

    def feed() -> None:
        for _ in range(passes):
            for batch in batch_loader(Rows(), list(range(4)), workers=2):
                parents.add(batch["parent"])
            done[0] += 1
            last[0] = time.monotonic()

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64))
    opt = torch.optim.AdamW(model.parameters())
    while feeder.is_alive():
        loss = model(torch.randn(32, 64)).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        if time.monotonic() - last[0] > STALL_S:
            print(f"stalled after {done[0]} passes", flush=True)
            faulthandler.dump_traceback(all_threads=True)
            os._exit(3)     # the feeder waits on a worker that never answers: no clean exit
    print(f"ok {done[0]} passes; workers forked by this process: {os.getpid() in parents}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1])))
