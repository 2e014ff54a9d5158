"""The drafter's training-speed levers (issue 11) equal today's path on the same
batch: loss, per-step losses, accuracies and gradients (ops/drafter/model.py)."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from ops.drafter import model as model_mod  # noqa: E402
from ops.drafter.config import DrafterConfig  # noqa: E402
from ops.drafter.model import Eagle3Drafter  # noqa: E402

K = 3


def setup(seed: int = 0):
    torch.manual_seed(seed)
    cfg = DrafterConfig(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                        intermediate_size=64, draft_vocab_size=50, target_vocab_size=80,
                        max_position_embeddings=256)
    model = Eagle3Drafter(cfg)
    b, t = 2, 24
    ids = torch.randint(0, 80, (b, t))
    aux = torch.randn(b, t, 3 * 32)
    embed = torch.randn(80, 32) * 0.1
    tgt = torch.randn(b, t, 50) * 3
    ok = torch.rand(b, t) < 0.7
    ok[1, 18:] = False        # a shorter second sample
    return model, (ids, aux, embed, tgt, ok, K, 0.8)


def run(model, batch, autocast: bool = False):
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        loss, losses, correct, counts = model(*batch)
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), losses, correct, counts, grads, loss.grad_fn


def graph_names(fn) -> set[str]:
    seen, todo = set(), [fn]
    while todo:
        f = todo.pop()
        if f is None or f in seen:
            continue
        seen.add(f)
        todo.extend(nxt for nxt, _ in f.next_functions)
    return {type(f).__name__ for f in seen}


@pytest.mark.parametrize("rows", [7, 30, 48])
def test_chunked_loss_equals_the_full_loss_and_its_gradients(rows):
    # 24-token samples: runs of 7 rows (the last partial), one sample, both samples a chunk
    model, batch = setup()
    ref = run(model, batch)
    chunked = copy.deepcopy(model)
    chunked.loss, chunked.loss_chunk_rows = "chunked", rows
    got = run(chunked, batch)
    assert "_ChunkedSoftCEBackward" in graph_names(got[5])
    assert "_ChunkedSoftCEBackward" not in graph_names(ref[5])
    torch.testing.assert_close(got[0], ref[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got[1], ref[1], rtol=1e-5, atol=1e-6)
    assert torch.equal(got[2], ref[2]) and torch.equal(got[3], ref[3])
    assert got[4].keys() == ref[4].keys()
    for name in ref[4]:
        torch.testing.assert_close(got[4][name], ref[4][name], rtol=1e-4, atol=1e-6, msg=name)


def test_chunked_loss_under_bf16_autocast_is_within_bf16_noise():
    model, batch = setup(1)
    ref = run(model, batch, autocast=True)
    chunked = copy.deepcopy(model)
    chunked.loss, chunked.loss_chunk_rows = "chunked", 16
    got = run(chunked, batch, autocast=True)
    torch.testing.assert_close(got[0], ref[0], rtol=2e-2, atol=1e-3)
    torch.testing.assert_close(got[1], ref[1], rtol=2e-2, atol=1e-3)
    assert (got[2] - ref[2]).abs().max() <= 1      # an argmax tie may flip under bf16
    for name in ref[4]:
        assert torch.nn.functional.cosine_similarity(got[4][name].flatten(), ref[4][name].flatten(), 0) > 0.999, name


def test_flex_ttt_attention_equals_the_explicit_mask(monkeypatch):
    """Forward only: FlexAttention has no backward on the CPU (the gradients are
    compared on the GPU by benchmarks/train_throughput.py --check-levers)."""
    model, batch = setup(2)
    with torch.no_grad():
        ref = model(*batch)
        flex = copy.deepcopy(model)
        flex.ttt_attention = "flex"

        def no_mask(*_a, **_k):
            raise AssertionError("the flex path built the explicit mask")

        monkeypatch.setattr(model_mod, "ttt_mask", no_mask)
        got = flex(*batch)
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_block_mask_is_the_explicit_mask():
    t, steps = 24, 4
    for step in range(1, steps):
        bm = model_mod.ttt_block_mask(t, step, steps, "cpu")
        dense = bm.to_dense()   # [1, 1, q blocks, kv blocks]: which blocks hold any allowed key
        mask = model_mod.ttt_mask(t, step, "cpu")
        full = torch.zeros(t, steps * t, dtype=torch.bool)
        full[:, : mask.shape[1]] = mask
        q_idx = torch.arange(t)[:, None]
        kv_idx = torch.arange(steps * t)[None, :]
        assert torch.equal(bm.mask_mod(0, 0, q_idx, kv_idx), full)
        assert dense.numel() > 0


def test_bad_lever_names_are_errors():
    model, batch = setup()
    model.loss = "fused"
    with pytest.raises(ValueError, match="loss 'fused'"):
        model(*batch)
    model.loss, model.ttt_attention = "full", "sparse"
    with pytest.raises(ValueError, match="ttt_attention 'sparse'"):
        model(*batch)


def test_block_mask_skips_what_the_ttt_mask_forbids():
    """The lever's point: at 4 query blocks of 128, step 3 of 7 slots touches the
    10 causal blocks of step 0 and one diagonal block per query block and later
    step (3 x 4), not the 4 x 4 x 4 blocks of the explicit mask's 4 steps."""
    bm = model_mod.ttt_block_mask(512, 3, 7, "cpu")
    full = bm.kv_num_blocks.sum() + (bm.full_kv_num_blocks.sum() if bm.full_kv_num_blocks is not None else 0)
    assert int(full) == 10 + 3 * 4
