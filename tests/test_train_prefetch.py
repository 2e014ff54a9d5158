"""ops.train's DevicePrefetcher: batches in order, their device tensors in the
training dtype, prefetching one ahead, the time blocked on the loader summed."""

from __future__ import annotations

import time

import pytest

torch = pytest.importorskip("torch")

from ops.train.prefetch import DevicePrefetcher  # noqa: E402


def batches(n: int, delay: float = 0.0):
    for i in range(n):
        time.sleep(delay)
        yield {"input_ids": torch.full((2, 4), i), "aux": torch.full((2, 4, 6), float(i), dtype=torch.float64),
               "final": torch.zeros(2, 4, 2, dtype=torch.float64), "loss_mask": torch.ones(2, 4, dtype=torch.bool),
               "lengths": torch.tensor([4, 3]), "i": i}


def test_batches_come_in_order_on_the_device_in_its_dtype():
    seen = []
    pf = DevicePrefetcher(batches(3), torch.device("cpu"), torch.float32)
    for _ in range(3):
        cpu, dev = pf.next()
        if cpu["i"] < 2:
            pf.prefetch()
        seen.append(cpu["i"])
        assert dev["aux"].dtype == torch.float32 and dev["input_ids"].dtype == torch.long
        assert dev["loss_mask"].dtype == torch.bool and int(dev["input_ids"][0, 0]) == cpu["i"]
        assert torch.equal(dev["aux"], cpu["aux"].float())
    assert seen == [0, 1, 2]
    with pytest.raises(StopIteration):
        pf.next()


def test_prefetch_takes_the_next_batch_once_and_counts_the_wait():
    pf = DevicePrefetcher(batches(2, delay=0.05), torch.device("cpu"), torch.float32)
    pf.prefetch()
    pf.prefetch()                       # already pending: not a second batch
    assert pf.next()[0]["i"] == 0 and pf.next()[0]["i"] == 1
    assert pf.wait_s >= 0.09
