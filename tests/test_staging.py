"""ops/extract/staging.py: a fixed set of host slabs, reused, bounding what is in flight."""

from __future__ import annotations

import threading

import pytest

torch = pytest.importorskip("torch")

from ops.extract.sample_file import ALIGN  # noqa: E402
from ops.extract.staging import SlabPool  # noqa: E402


def _specs(n: int, width: int = 16) -> dict:
    return {"input_ids": (torch.int64, (n,)), "loss_mask": (torch.uint8, (n,)),
            "aux_hidden_states": (torch.bfloat16, (n, 3 * width)),
            "final_hidden_states": (torch.bfloat16, (n, width))}


def test_images_are_aligned_disjoint_and_the_slab_comes_back_after_the_last_release():
    pool = SlabPool(count=1, nbytes=64 * ALIGN, pin=False)
    first = pool.take([_specs(10), _specs(33), _specs(7)])
    ptrs = [im.buffer.data_ptr() for im in first]
    assert all(p % ALIGN == 0 for p in ptrs)
    spans = sorted((im.buffer.data_ptr(), im.buffer.data_ptr() + im.buffer.numel()) for im in first)
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))

    got = []
    waiter = threading.Thread(target=lambda: got.append(pool.take([_specs(5)])))
    waiter.start()
    waiter.join(0.3)
    assert waiter.is_alive(), "the only slab is in flight: take() must wait"
    first[0].release()
    first[1].release()
    waiter.join(0.3)
    assert waiter.is_alive(), "one image of the batch is still unwritten"
    first[2].release()
    waiter.join(5)
    assert not waiter.is_alive() and got
    assert got[0][0].buffer.data_ptr() == ptrs[0], "the same slab is reused, not a new one pinned"


def test_a_batch_larger_than_a_slab_gets_a_block_of_its_own():
    pool = SlabPool(count=1, nbytes=4 * ALIGN, pin=False)
    held = pool.take([_specs(4)])
    big = pool.take([_specs(4000)])         # does not wait for the held slab
    assert big[0].views["aux_hidden_states"].shape == (4000, 48)
    big[0].release()
    held[0].release()


def test_a_pool_needs_one_slab():
    with pytest.raises(ValueError, match="at least 1"):
        SlabPool(count=0, nbytes=ALIGN, pin=False)
