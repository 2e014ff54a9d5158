"""Length buckets and the compiled TTT step (issue 11): a corpus of many lengths
gives few batch shapes, so few compiled graphs; the padding changes neither the
loss nor the accuracies; the compiled step equals the eager one."""

from __future__ import annotations

import copy
import random
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from ops.drafter import model as model_mod  # noqa: E402
from ops.drafter.config import DrafterConfig  # noqa: E402
from ops.drafter.data import bucket_length, collate, make_batches  # noqa: E402
from ops.drafter.model import Eagle3Drafter  # noqa: E402
from ops.train.targets import TargetView  # noqa: E402
from ops.train.levers import resolve  # noqa: E402

H, V, VD, K = 32, 80, 50, 3


def cfg():
    return DrafterConfig(hidden_size=H, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                         intermediate_size=64, draft_vocab_size=VD, target_vocab_size=V,
                         max_position_embeddings=512)


def target_view():
    g = torch.Generator().manual_seed(5)
    head = SimpleNamespace(embed=torch.randn(V, H, generator=g) * 0.1, lm_head=torch.randn(V, H, generator=g),
                           norm=torch.ones(H), eps=1e-6)
    ids = torch.randperm(V, generator=g)[:VD].sort().values
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[ids] = True
    vocab = SimpleNamespace(draft_to_target=ids, t2d=t2d)
    return TargetView(head, vocab, torch.device("cpu"), torch.float32, post_norm=True)


def sample(n: int, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(n, dtype=torch.bool)
    mask[:3] = False                           # a prompt
    return {"input_ids": torch.randint(0, V, (n,), generator=g), "loss_mask": mask,
            "aux_hidden_states": torch.randn(n, 3 * H, generator=g),
            "final_hidden_states": torch.randn(n, H, generator=g)}


def step(model, view, batch):
    model.zero_grad(set_to_none=True)
    tgt, ok = view.targets(batch["final"], batch["loss_mask"], batch["lengths"])
    loss, losses, correct, counts = model(batch["input_ids"], batch["aux"], view.embed, tgt, ok, K, 0.8)
    loss.backward()
    return loss.detach(), losses, correct, counts, {n: p.grad.clone() for n, p in model.named_parameters()}


def corpus(n: int = 60, lo: int = 5, hi: int = 120, seed: int = 0) -> dict[int, int]:
    rng = random.Random(seed)
    return {i: rng.randint(lo, hi) for i in range(n)}


def shapes(lengths, batches, bucket, max_len):
    return {(len(b), bucket_length(max(min(lengths[i], max_len) for i in b), bucket, max_len)) for b in batches}


def test_buckets_bound_the_batch_shapes_and_keep_the_budget():
    lengths = corpus(400, 5, 500)
    max_len, budget, bucket = 400, 1024, 64
    plain = make_batches(lengths, budget, max_len)
    bucketed = make_batches(lengths, budget, max_len, bucket)
    assert sorted(i for b in bucketed for i in b) == sorted(lengths)
    n_buckets = -(-max_len // bucket)
    got = shapes(lengths, bucketed, bucket, max_len)
    assert len(got) <= 2 * n_buckets
    assert len(shapes(lengths, plain, 0, max_len)) > 3 * len(got)      # what the buckets are for
    for b in bucketed:
        padded = {bucket_length(min(lengths[i], max_len), bucket, max_len) for i in b}
        assert len(padded) == 1                                        # one bucket a batch
        assert len(b) == 1 or len(b) * padded.pop() <= budget


def test_no_bucket_batches_as_before():
    lengths = {0: 10, 1: 12, 2: 12, 3: 30, 4: 31, 5: 90}
    assert make_batches(lengths, 64, 64) == [[0, 1, 2], [3, 4], [5]]
    # 64-token buckets: 10..31 share a bucket (at most one 64-token row a batch), 90 is capped at 64
    assert make_batches(lengths, 64, 64, 64) == [[0], [1], [2], [3], [4], [5]]
    assert make_batches(lengths, 128, 100, 32) == [[0, 1, 2, 3], [4], [5]]


def test_collate_pads_to_the_bucket_and_the_padding_is_not_counted():
    batch = collate([sample(19, 1), sample(24, 2)], bucket=16, max_len=64)
    assert batch["input_ids"].shape == (2, 32) and batch["aux"].shape == (2, 32, 3 * H)
    assert batch["lengths"].tolist() == [19, 24]
    assert not batch["loss_mask"][0, 19:].any() and not batch["loss_mask"][1, 24:].any()
    assert (batch["aux"][0, 19:] == 0).all() and (batch["input_ids"][1, 24:] == 0).all()
    _, ok = target_view().targets(batch["final"], batch["loss_mask"], batch["lengths"])
    assert not ok[0, 18:].any() and not ok[1, 23:].any()
    assert collate([sample(40, 3)], bucket=16, max_len=40)["input_ids"].shape == (1, 40)   # capped at max_len


@pytest.mark.parametrize("loss", ["full", "chunked"])
def test_a_padded_batch_has_the_unpadded_loss_accuracies_and_gradients(loss):
    torch.manual_seed(0)
    model = Eagle3Drafter(cfg())
    model.loss, model.loss_chunk_rows = loss, 16
    view = target_view()
    samples = [sample(19, 1), sample(24, 2)]
    ref = step(model, view, collate(samples))
    got = step(model, view, collate(samples, bucket=16, max_len=64))
    torch.testing.assert_close(got[0], ref[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got[1], ref[1], rtol=1e-5, atol=1e-6)
    assert torch.equal(got[2], ref[2]) and torch.equal(got[3], ref[3])
    for name in ref[4]:
        torch.testing.assert_close(got[4][name], ref[4][name], rtol=1e-4, atol=1e-6, msg=name)


def count_graphs(model, view, lengths, budget, max_len, bucket) -> tuple[int, int]:
    """(dynamo graphs built, batch shapes) over one pass of the corpus, forward only."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    batches = make_batches(lengths, budget, max_len, bucket)
    with torch.no_grad():
        for b in batches:
            batch = collate([sample(min(lengths[i], max_len), i) for i in b], bucket, max_len)
            tgt, ok = view.targets(batch["final"], batch["loss_mask"], batch["lengths"])
            model(batch["input_ids"], batch["aux"], view.embed, tgt, ok, K, 0.8)
    return int(counters["stats"]["unique_graphs"]), len(shapes(lengths, batches, bucket, max_len))


def test_compiled_step_builds_a_bounded_number_of_graphs(monkeypatch):
    """Three compiled functions (layer q/k/v, layer finish, a loss chunk), one
    graph each per batch shape. 12 distinct lengths unbucketed: 12 shapes, all
    compiled (dynamo's default limit of 8 recompiles a function would leave
    the rest eager); bucketed: at most 2 shapes a bucket."""
    monkeypatch.setattr(model_mod, "COMPILE_BACKEND", "eager")   # dynamo's capture only: no code generation
    monkeypatch.setattr(model_mod, "_COMPILED", {})
    torch.manual_seed(0)
    model = Eagle3Drafter(cfg())
    model.loss, model.compile_step = "chunked", True
    view = target_view()
    lengths = {i: 8 + 3 * i for i in range(12)}          # 8..41, one sample each
    graphs, n_shapes = count_graphs(model, view, lengths, 1, 64, 0)    # a sample a batch
    assert n_shapes == 12 and graphs == 3 * 12
    many = corpus(40, 5, 64, seed=1)
    graphs, n_shapes = count_graphs(model, view, many, 128, 64, 32)
    assert n_shapes <= 2 * 2 and graphs <= 3 * n_shapes
    assert len(set(many.values())) > 20                 # many lengths, few graphs


@pytest.mark.slow
def test_compiled_step_equals_the_eager_step():
    """Inductor on the CPU (gcc): the compiled layer and chunked loss against
    the eager ones on the same batch, fp32 (rounding only)."""
    torch.manual_seed(0)
    model = Eagle3Drafter(cfg())
    model.loss, model.loss_chunk_rows = "chunked", 32
    view = target_view()
    batch = collate([sample(19, 1), sample(24, 2)], bucket=16, max_len=64)
    ref = step(model, view, batch)
    compiled = copy.deepcopy(model)
    compiled.compile_step = True
    got = step(compiled, view, batch)
    torch.testing.assert_close(got[0], ref[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got[1], ref[1], rtol=1e-5, atol=1e-6)
    assert torch.equal(got[2], ref[2]) and torch.equal(got[3], ref[3])
    for name in ref[4]:
        torch.testing.assert_close(got[4][name], ref[4][name], rtol=1e-4, atol=1e-6, msg=name)


def test_auto_levers_are_the_fast_path_on_cuda_and_the_old_path_on_the_cpu():
    fast = resolve(cuda=True)
    assert (fast.ttt_attention, fast.loss, fast.fused_adamw, fast.compile, fast.length_bucket) == \
        ("flex", "chunked", True, True, 256)
    old = resolve(cuda=False)
    assert (old.ttt_attention, old.loss, old.fused_adamw, old.compile, old.length_bucket) == \
        ("mask", "full", False, False, 0)
    assert resolve(cuda=False, compile="on").length_bucket == 256        # buckets follow what compiles
    assert resolve(cuda=True, length_bucket="0").length_bucket == 0


@pytest.mark.slow
def test_the_cuda_default_path_equals_the_old_path_within_bf16_noise():
    """What ops.train runs on CUDA by default (flex, chunked loss, compiled
    step, length-bucketed batch) against the old path (explicit mask, full
    loss, eager, unpadded) on the same batch and weights under bf16 autocast:
    the loss and accuracies within bf16 noise. FlexAttention has no CPU
    backward, so the gradients are compared with the mask in place of flex
    (the H200 compares them with flex: train_throughput.py --check-levers)."""
    torch.manual_seed(0)
    old = Eagle3Drafter(cfg())
    view = target_view()
    samples = [sample(19, 1), sample(24, 2), sample(30, 3)]
    plain, padded = collate(samples), collate(samples, bucket=16, max_len=64, token_budget=128)

    def run(model, batch, grads: bool):
        model.zero_grad(set_to_none=True)
        tgt, ok = view.targets(batch["final"], batch["loss_mask"], batch["lengths"])
        with torch.set_grad_enabled(grads), torch.autocast("cpu", dtype=torch.bfloat16):
            loss, losses, correct, counts = model(batch["input_ids"], batch["aux"], view.embed, tgt, ok, K, 0.8)
        if grads:
            loss.backward()
        g = torch.cat([p.grad.float().flatten() for p in model.parameters() if p.grad is not None]) if grads else None
        return loss.detach().float(), losses.float(), correct, counts, g

    new = copy.deepcopy(old)
    new.ttt_attention, new.loss, new.compile_step, new.loss_chunk_rows = "flex", "chunked", True, 64
    ref, got = run(old, plain, False), run(new, padded, False)
    torch.testing.assert_close(got[0], ref[0], rtol=2e-2, atol=1e-3)
    torch.testing.assert_close(got[1], ref[1], rtol=2e-2, atol=1e-3)
    assert torch.equal(got[3], ref[3]) and (got[2] - ref[2]).abs().max() <= 1   # an argmax tie may flip
    new.ttt_attention = "mask"
    ref, got = run(old, plain, True), run(new, padded, True)
    torch.testing.assert_close(got[0], ref[0], rtol=2e-2, atol=1e-3)
    assert torch.nn.functional.cosine_similarity(got[4], ref[4], 0) > 0.999


def test_a_bare_fused_adamw_flag_still_means_on():
    from ops.train.__main__ import parse_args

    base = ["--data", "d", "--vocab", "v", "--target", "t", "--output", "o"]
    assert parse_args(base + ["--fused-adamw"]).fused_adamw == "on"
    assert parse_args(base).fused_adamw == "auto"
    assert parse_args(base + ["--fused-adamw", "off"]).fused_adamw == "off"


def test_a_worker_collates_into_shared_memory_the_same_batch():
    """(That no second copy is made is not observable here: the batch arrives
    in shared memory either way.)"""
    from torch.utils.data import DataLoader

    groups = [[sample(19, 1), sample(24, 2)], [sample(30, 3)]]
    here = [collate(g, bucket=16, max_len=64, token_budget=96) for g in groups]
    loader = DataLoader(groups, batch_size=None, num_workers=1,
                        collate_fn=lambda g: collate(g, bucket=16, max_len=64, token_budget=96))
    got = list(loader)
    assert len(got) == 2
    for a, b in zip(got, here):
        assert a.keys() == b.keys()
        for key in a:
            assert torch.equal(a[key], b[key]), key
