"""ops.train's DevicePrefetcher: its thread reads the source ahead (at most
depth + 1 batches), batches come in order as device tensors in the training
dtype, the source's errors and end reach next(), the time the caller was
blocked is summed, and close() leaves no thread behind. The thread's code path
is the same on the CPU (the copy a plain .to(device)), so these run there."""

from __future__ import annotations

import threading
import time

import pytest

torch = pytest.importorskip("torch")

from ops.train.prefetch import DevicePrefetcher  # noqa: E402

CPU = torch.device("cpu")


def batch(i: int) -> dict:
    return {"input_ids": torch.full((2, 4), i), "aux": torch.full((2, 4, 6), float(i), dtype=torch.float64),
            "final": torch.zeros(2, 4, 2, dtype=torch.float64), "loss_mask": torch.ones(2, 4, dtype=torch.bool),
            "lengths": torch.tensor([4, 3]), "i": i}


def batches(n: int | None, delay: float = 0.0, reads: list | None = None):
    i = 0
    while n is None or i < n:
        time.sleep(delay)
        if reads is not None:
            reads.append(i)
        yield batch(i)
        i += 1


def until(cond, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.01)
    return cond()


@pytest.fixture(autouse=True)
def no_thread_left():
    yield
    left = [t for t in threading.enumerate() if t.name == "device-prefetch"]
    assert not left, f"prefetch threads still running: {left}"


@pytest.fixture
def make():
    made = []

    def new(source, depth: int = 2):
        pf = DevicePrefetcher(source, CPU, torch.float32, depth=depth)
        made.append(pf)
        return pf

    yield new
    for pf in made:
        assert pf.close(), "the prefetch thread did not stop"


def test_batches_come_in_order_on_the_device_in_its_dtype(make):
    pf = make(batches(3))
    seen = []
    for _ in range(3):
        cpu, dev = pf.next()
        seen.append(cpu["i"])
        assert dev["aux"].dtype == torch.float32 and dev["input_ids"].dtype == torch.long
        assert dev["loss_mask"].dtype == torch.bool and int(dev["input_ids"][0, 0]) == cpu["i"]
        assert torch.equal(dev["aux"], batch(cpu["i"])["aux"].float())
    assert seen == [0, 1, 2]
    with pytest.raises(StopIteration):
        pf.next()
    with pytest.raises(StopIteration):      # and again: the end stays the end
        pf.next()


def test_a_background_daemon_thread_does_the_reading(make):
    reads = []
    pf = make(batches(None, reads=reads))
    assert pf.thread.daemon and pf.thread.name == "device-prefetch" and pf.thread.is_alive()
    # Nothing asked for yet, the source is read all the same: not by the caller.
    assert until(lambda: len(reads) >= 1)


def test_order_is_kept_over_many_batches(make):
    pf = make(batches(500), depth=3)
    assert [pf.next()[0]["i"] for _ in range(500)] == list(range(500))
    with pytest.raises(StopIteration):
        pf.next()


def test_the_sources_error_reaches_next_after_the_batches_before_it(make):
    boom = ValueError("worker 1: shard_0003.safetensors is truncated")

    def failing():
        yield batch(0)
        yield batch(1)
        raise boom

    pf = make(failing())
    assert pf.next()[0]["i"] == 0 and pf.next()[0]["i"] == 1
    with pytest.raises(ValueError) as caught:
        pf.next()
    assert caught.value is boom and str(caught.value) == "worker 1: shard_0003.safetensors is truncated"
    with pytest.raises(ValueError):         # not a hang on an empty queue
        pf.next()


def test_a_failing_copy_reaches_next_too(make):
    bad = batch(0)
    del bad["final"]
    pf = make(iter([bad]))
    with pytest.raises(KeyError, match="final"):
        pf.next()


@pytest.mark.parametrize("depth", [1, 2, 4])
def test_the_source_is_read_at_most_depth_plus_one_ahead(make, depth):
    reads = []
    pf = make(batches(None, reads=reads), depth=depth)
    # The queue full and one more batch held by the thread, blocked putting it.
    assert until(lambda: len(reads) == depth + 1)
    time.sleep(0.2)
    assert len(reads) == depth + 1
    for taken in range(1, 6):
        pf.next()
        assert until(lambda: len(reads) == taken + depth + 1)
        time.sleep(0.05)
        assert len(reads) <= taken + depth + 1


def test_close_while_the_thread_is_blocked_on_a_full_queue(make):
    reads = []
    pf = make(batches(None, reads=reads), depth=2)
    assert until(lambda: len(reads) == 3)
    time.sleep(0.1)                         # blocked in put() on the full queue
    assert pf.close(timeout=60)             # True: the thread left its blocked put and is gone
    assert not pf.thread.is_alive()
    assert pf.queue.empty()                 # the held batches let go


def test_close_closes_the_source_so_the_loader_behind_it_is_released(make):
    closed = []

    def source():
        try:
            yield from batches(None)
        finally:
            closed.append(True)

    pf = make(source())
    pf.next()
    assert pf.close() and closed == [True]


def test_close_after_the_source_ended_or_failed(make):
    pf = make(batches(1))
    pf.next()
    assert until(lambda: not pf.thread.is_alive())
    assert pf.close()


def test_wait_s_counts_the_time_blocked_on_a_slow_source(make):
    # The source gives nothing until a timer started just before next() fires: the caller is
    # blocked for most of its 0.3 s however the threads are scheduled (a 0.05 s sleep in the
    # source could be over before a loaded machine's main thread called next()).
    go = threading.Event()

    def source():
        go.wait(60)
        yield from batches(4)

    pf = make(source())
    timer = threading.Timer(0.3, go.set)
    timer.start()
    try:
        assert [pf.next()[0]["i"] for _ in range(4)] == [0, 1, 2, 3]
    finally:
        timer.cancel()
        go.set()
    assert pf.wait_s >= 0.2


def test_depth_must_be_positive():
    with pytest.raises(ValueError, match="depth"):
        DevicePrefetcher(batches(1), CPU, torch.float32, depth=0)


def test_pinned_slot_stages_each_key_in_one_reused_buffer_grown_when_needed():
    """What the CUDA path copies from (the buffers pinned there; pinning needs CUDA)."""
    from ops.train.prefetch import _PinnedSlot

    slot = _PinnedSlot(pin=False)
    a = torch.randn(4, 8, 3).to(torch.bfloat16)
    v = slot.stage("aux", a)
    assert v.dtype == a.dtype and v.shape == a.shape and torch.equal(v, a)
    buf = slot.buffers["aux"]
    b = torch.randn(2, 8, 3).to(torch.bfloat16)          # smaller: the same buffer
    assert torch.equal(slot.stage("aux", b), b) and slot.buffers["aux"] is buf
    ids = torch.randint(0, 100, (4, 8))
    assert torch.equal(slot.stage("input_ids", ids), ids) and slot.buffers["aux"] is buf
    c = torch.randn(16, 8, 3).to(torch.bfloat16)         # larger: grown once
    assert torch.equal(slot.stage("aux", c), c) and slot.buffers["aux"] is not buf
    assert slot.buffers["aux"].numel() >= c.numel() * 2


def test_unknown_staging_is_refused():
    from ops.train.prefetch import DevicePrefetcher

    with pytest.raises(ValueError, match="staging must be one of"):
        DevicePrefetcher(iter(()), torch.device("cpu"), torch.float32, staging="zero-copy")


def test_the_host_states_are_dropped_in_the_thread_not_handed_to_the_training_thread():
    import weakref

    from ops.train.prefetch import HOST_DROPPED

    seen = []

    def source():
        for i in range(3):
            b = {"input_ids": torch.zeros(2, 4, dtype=torch.long), "aux": torch.randn(2, 4, 6),
                 "final": torch.randn(2, 4, 2), "loss_mask": torch.ones(2, 4, dtype=torch.bool),
                 "lengths": torch.tensor([4, 4]), "samples": [i, i]}
            seen.append(weakref.ref(b["aux"]))
            yield b

    it = DevicePrefetcher(source(), torch.device("cpu"), torch.float32, depth=1)
    try:
        batch, dev = it.next()
        assert not set(HOST_DROPPED) & set(batch) and batch["samples"] == [0, 0]
        assert set(HOST_DROPPED) <= set(dev) and dev["aux"].shape == (2, 4, 6)
        del batch, dev
        it.next()
        it.next()
        # The first batch's host states live nowhere once the thread moved past it.
        assert seen[0]() is None
    finally:
        it.close()
