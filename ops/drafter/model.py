"""The EAGLE-3 drafter module (torch), as SGLang's LlamaForCausalLMEagle3 lays it out.

Parameter names are SGLang's (fc, midlayer.*, norm, lm_head) so that export
writes the state dict as it is. The layer: residual = the fused state h;
attention over concat(input_layernorm(token embedding), hidden_norm(h)) (2H
into q/k/v); residual += o_proj(attn); out = residual + mlp(post_attention_
layernorm(residual)). Logits = lm_head(norm(out)); `out` (pre-norm) is the
state the next draft step takes, as SGLang's `hidden_states_to_aux` and
speculators' first layer do (norm_before_residual = False).

Two ways through the same weights:
- `forward(...)`: the training-time-test unroll (used by ops.train under DDP):
  step k feeds the previous step's output state and the token k+1 places
  ahead, at positions t+k; its queries attend causally to step 0's keys and to
  their own chain's keys of steps 1..k (a diagonal per step). The mask is built
  explicitly over the concatenated keys: simple and exact, at (k+1)x the
  attention cost of a causal pass.
- `extend(...)`: incremental decoding against a DraftCache (ops.bench, export --check).

The target's embedding is not a parameter here: it is frozen and passed in, so
that neither DDP nor the checkpoint carries a vocab x hidden copy of it.

Training-speed levers (issue 11), attributes of the module, each equal to the
default within bf16 noise on the same batch (tests/test_drafter_levers.py):
- ttt_attention "flex": the TTT mask as a FlexAttention block mask over all K
  steps' key slots (one compiled kernel per length; blocks with no allowed
  key are skipped, so steps 1..k cost a diagonal, not a full T x T each).
  Backward needs CUDA (FlexAttention has none on the CPU).
- loss "chunked": the LM head and the soft cross-entropy per chunk of rows in
  one autograd node whose forward also computes its gradients, so the
  [B, T, draft vocab] fp32 logits of K steps are never held at once.
- compile_step True: torch.compile (dynamic=False: one graph per batch shape,
  which length buckets keep few) of each TTT step's work outside the
  attention kernel: the layer's norms + q/k/v + rotary, its o_proj + residual
  + MLP + the final norm, and the loss (a chunk of the chunked loss, or the
  whole full loss), so the elementwise passes between the matmuls fuse.
  Attention stays SDPA's (step 0, the mask path) or compiled FlexAttention.
Which of these ops.train turns on by default: ops/train/levers.py.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ops.drafter.config import DrafterConfig


def _norm_class():
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    return LlamaRMSNorm


class Eagle3Attention(nn.Module):
    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        self.n_heads = cfg.num_attention_heads
        self.n_kv = cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        self.q_proj = nn.Linear(2 * cfg.hidden_size, self.n_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(2 * cfg.hidden_size, self.n_kv * self.head_dim, bias=False)
        self.v_proj = nn.Linear(2 * cfg.hidden_size, self.n_kv * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, cfg.hidden_size, bias=False)

    def qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.n_kv, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.n_kv, self.head_dim).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        return q, k, v

    def attend(self, q, k, v, mask: torch.Tensor | None, causal: bool = False) -> torch.Tensor:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                             enable_gqa=self.n_kv != self.n_heads)
        b, _, t, _ = out.shape
        return self.o_proj(out.transpose(1, 2).reshape(b, t, self.n_heads * self.head_dim))

    def attend_raw(self, q, k, v, mask: torch.Tensor | None, causal: bool = False) -> torch.Tensor:
        """[B, heads, T, D], before o_proj."""
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                              enable_gqa=self.n_kv != self.n_heads)

    def attend_flex(self, q, k, v, block_mask) -> torch.Tensor:
        """[B, heads, T, D], before o_proj."""
        flex = _flex_attention()["compiled" if q.is_cuda else "eager"]
        return flex(q, k.to(q.dtype), v.to(q.dtype), block_mask=block_mask, enable_gqa=self.n_kv != self.n_heads)

    def project(self, out: torch.Tensor) -> torch.Tensor:
        b, _, t, _ = out.shape
        return self.o_proj(out.transpose(1, 2).reshape(b, t, self.n_heads * self.head_dim))


class Eagle3DecoderLayer(nn.Module):
    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        from transformers.models.llama.modeling_llama import LlamaMLP

        norm = _norm_class()
        self.self_attn = Eagle3Attention(cfg)
        self.mlp = LlamaMLP(cfg.llama_config())
        self.input_layernorm = norm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.hidden_norm = norm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.post_attention_layernorm = norm(cfg.hidden_size, eps=cfg.rms_norm_eps)

    def qkv(self, embeds, hidden, cos, sin):
        x = torch.cat([self.input_layernorm(embeds), self.hidden_norm(hidden)], dim=-1)
        return self.self_attn.qkv(x, cos, sin)

    def finish(self, hidden: torch.Tensor, attn_out: torch.Tensor) -> torch.Tensor:
        residual = hidden + attn_out
        return residual + self.mlp(self.post_attention_layernorm(residual))


def ttt_mask(t: int, step: int, device) -> torch.Tensor:
    """[t, (step+1)*t] bool, True = may attend: causal over step 0's keys, then
    for each later step only the same index (the query's own chain)."""
    causal = torch.ones(t, t, dtype=torch.bool, device=device).tril()
    eye = torch.eye(t, dtype=torch.bool, device=device)
    return torch.cat([causal] + [eye] * step, dim=1)


def _flex_attention():
    """FlexAttention, compiled on first use where it can be (CUDA)."""
    global _FLEX
    if _FLEX is None:
        from torch.nn.attention.flex_attention import flex_attention

        _raise_recompile_limit()
        _FLEX = {"eager": flex_attention, "compiled": torch.compile(flex_attention, dynamic=False)}
    return _FLEX


_FLEX = None

# What compile_step compiles with (tests count graphs with backend "eager",
# which runs dynamo without inductor's code generation).
COMPILE_BACKEND = "inductor"
COMPILE_MODE: str | None = None      # e.g. "max-autotune-no-cudagraphs"
# Each compiled function (and compiled FlexAttention) sees one shape per batch
# shape: one a length bucket, 16 at max_len 4,096 and bucket 256 (more
# without buckets: a shape per distinct batch).
# Dynamo's default of 8 recompiles a function would then run the rest eagerly
# (FlexAttention eagerly materialises the whole score matrix), silently.
RECOMPILE_LIMIT = 128
_COMPILED: dict = {}


def _raise_recompile_limit() -> None:
    import torch._dynamo

    cfg = torch._dynamo.config
    name = "recompile_limit" if hasattr(cfg, "recompile_limit") else "cache_size_limit"
    setattr(cfg, name, max(getattr(cfg, name), RECOMPILE_LIMIT))
    if hasattr(cfg, "accumulated_recompile_limit"):
        cfg.accumulated_recompile_limit = max(cfg.accumulated_recompile_limit, 4 * RECOMPILE_LIMIT)


def _compiled(fn):
    key = (fn.__name__, COMPILE_BACKEND, COMPILE_MODE)
    if key not in _COMPILED:
        _raise_recompile_limit()
        _COMPILED[key] = torch.compile(fn, dynamic=False, backend=COMPILE_BACKEND, mode=COMPILE_MODE)
    return _COMPILED[key]


def _layer_qkv(layer, embeds, hidden, cos, sin):
    return layer.qkv(embeds, hidden, cos, sin)


def _layer_finish(layer, norm, hidden, attn):
    """(the step's output state, its final norm) from the attention's [B, heads, T, D]."""
    out = layer.finish(hidden, layer.self_attn.project(attn))
    return out, norm(out)


def _full_soft_ce(normed, lm_head, tgt, ok):
    logits = lm_head(normed).float()
    tgt = tgt.float()
    ce = -(torch.softmax(tgt, -1) * torch.log_softmax(logits, -1)).sum(-1)
    ce_sum = (ce * ok.float()).sum()
    right = ((logits.argmax(-1) == tgt.argmax(-1)) & ok).sum().float()
    return ce_sum, right


def ttt_block_mask(t: int, step: int, slots: int, device):
    """The BlockMask of ttt_mask(t, step) over `slots` x t key positions
    (slots > step + 1 leaves the later steps' slots empty, so every step of one
    length shares one compiled kernel; `step` is a tensor for the same reason)."""
    from torch.nn.attention.flex_attention import create_block_mask

    k = torch.tensor(step, device=device)

    def mask_mod(b, h, q_idx, kv_idx):
        slot = kv_idx // t
        return ((slot == 0) & (kv_idx <= q_idx)) | ((slot >= 1) & (slot <= k) & (kv_idx - slot * t == q_idx))

    return create_block_mask(mask_mod, None, None, t, slots * t, device=device)


class DraftCache:
    """Keys/values of the drafter's one layer for incremental decoding."""

    def __init__(self):
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None

    @property
    def length(self) -> int:
        return 0 if self.k is None else int(self.k.shape[2])

    def truncate(self, n: int) -> None:
        if self.k is not None:
            self.k, self.v = self.k[:, :, :n], self.v[:, :, :n]


class Eagle3Drafter(nn.Module):
    ttt_attention = "mask"      # or "flex" (module docstring)
    loss = "full"               # or "chunked"
    loss_chunk_rows = 4096      # rows of [rows, draft vocab] fp32 a chunk of the chunked loss
    compile_step = False        # torch.compile each TTT step's work (module docstring)

    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

        self.cfg = cfg
        self.fc = nn.Linear(3 * cfg.hidden_size, cfg.hidden_size, bias=False)
        self.midlayer = Eagle3DecoderLayer(cfg)
        self.norm = _norm_class()(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.draft_vocab_size, bias=False)
        self.rotary = LlamaRotaryEmbedding(cfg.llama_config())
        self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(cfg.target_vocab_size, dtype=torch.bool))

    # -- weights ---------------------------------------------------------
    def trainable_state(self) -> dict[str, torch.Tensor]:
        """The state dict without the rotary cache: what checkpoints and exports hold."""
        return {k: v for k, v in self.state_dict().items() if not k.startswith("rotary.")}

    def load_trainable_state(self, state: dict[str, torch.Tensor], where: str = "checkpoint") -> None:
        own = self.trainable_state()
        missing = sorted(set(own) - set(state))
        unexpected = sorted(set(state) - set(own))
        if missing or unexpected:
            raise ValueError(f"{where}: missing tensors {missing}, unexpected tensors {unexpected}")
        for k, v in state.items():
            if tuple(v.shape) != tuple(own[k].shape):
                raise ValueError(f"{where}: tensor {k!r} has shape {tuple(v.shape)}, expected {tuple(own[k].shape)}")
        self.load_state_dict(state, strict=False)

    def init_from_target(self, lm_head: torch.Tensor, d2t: torch.Tensor, t2d: torch.Tensor) -> None:
        """Head rows of the draft ids from the target's LM head; the vocab mapping."""
        with torch.no_grad():
            ids = d2t + torch.arange(d2t.shape[0], device=d2t.device)
            self.lm_head.weight.copy_(lm_head[ids.to(lm_head.device)].to(self.lm_head.weight.dtype))
            self.d2t.copy_(d2t)
            self.t2d.copy_(t2d)

    def draft_to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids + self.d2t[draft_ids]

    # -- training-time test ----------------------------------------------
    def _cos_sin(self, x: torch.Tensor, positions: torch.Tensor):
        return self.rotary(x, positions.unsqueeze(0) if positions.dim() == 1 else positions)

    def unroll(self, input_ids: torch.Tensor, aux: torch.Tensor, embed_weight: torch.Tensor,
               steps: int):
        """Yield (k, logits [B,T,Vd]) for k = 0..steps-1. Step k at index t reads
        token t+k+1 at position t+k and predicts token t+k+2."""
        for k, _hidden, normed in self._unroll(input_ids, aux, embed_weight, steps):
            yield k, self.lm_head(normed)

    def unroll_states(self, input_ids: torch.Tensor, aux: torch.Tensor, embed_weight: torch.Tensor,
                      steps: int):
        """Yield (k, output state [B,T,H] pre-norm) for k = 0..steps-1 (see unroll)."""
        for k, hidden, _normed in self._unroll(input_ids, aux, embed_weight, steps):
            yield k, hidden

    def _unroll(self, input_ids: torch.Tensor, aux: torch.Tensor, embed_weight: torch.Tensor, steps: int):
        """Yield (k, output state pre-norm, its final norm) for k = 0..steps-1."""
        b, t = input_ids.shape
        qkv_fn = _compiled(_layer_qkv) if self.compile_step else _layer_qkv
        finish_fn = _compiled(_layer_finish) if self.compile_step else _layer_finish
        hidden = self.fc(aux)
        pad_ids = F.pad(input_ids, (0, steps + 1))
        keys, values = [], []
        flex = self.ttt_attention == "flex"
        if self.ttt_attention not in ("mask", "flex"):
            raise ValueError(f"ttt_attention {self.ttt_attention!r}: expected 'mask' or 'flex'")
        for k in range(steps):
            with torch.no_grad():
                embeds = F.embedding(pad_ids[:, k + 1:k + 1 + t], embed_weight).to(hidden.dtype)
            positions = torch.arange(k, k + t, device=aux.device)
            cos, sin = self._cos_sin(hidden, positions)
            q, kk, vv = qkv_fn(self.midlayer, embeds, hidden, cos, sin)
            keys.append(kk)
            values.append(vv)
            attn_mod = self.midlayer.self_attn
            if k == 0:
                attn = attn_mod.attend_raw(q, kk, vv, None, causal=True)
            elif flex:
                # Every step's keys in `steps` slots (the later ones zeros, masked
                # out): one shape, so one compiled kernel for all k.
                empty = [torch.zeros_like(kk)] * (steps - k - 1)
                attn = attn_mod.attend_flex(q, torch.cat(keys + empty, 2), torch.cat(values + empty, 2),
                                            self._block_mask(t, k, steps, aux.device))
            else:
                attn = attn_mod.attend_raw(q, torch.cat(keys, 2), torch.cat(values, 2),
                                           ttt_mask(t, k, aux.device))
            hidden, normed = finish_fn(self.midlayer, self.norm, hidden, attn)
            yield k, hidden, normed

    def _block_mask(self, t: int, step: int, slots: int, device):
        cache = self.__dict__.setdefault("_block_masks", {})
        key = (t, step, slots, str(device))
        if key not in cache:
            if len(cache) > 512:      # (lengths x steps): buckets keep this small
                cache.clear()
            cache[key] = ttt_block_mask(t, step, slots, device)
        return cache[key]

    def forward(self, input_ids: torch.Tensor, aux: torch.Tensor, embed_weight: torch.Tensor,
                target_logits: torch.Tensor, target_ok: torch.Tensor, steps: int,
                decay: float = 0.8):
        """The K-step unroll with its loss (what DDP wraps).

        target_logits [B,T,Vd]: the target's logits at position j over the draft
        ids (they predict token j+1); target_ok [B,T]: position j's prediction
        counts (loss mask of token j+1, token j+1 exists, the target's argmax lies
        in the draft vocab). Step k at index t is scored against position t+k+1.
        Soft cross-entropy per step, averaged over its counted positions,
        weighted decay**k. Returns (loss, per-step loss [K], correct [K], count [K]).
        """
        t = input_ids.shape[1]
        pad_logits = F.pad(target_logits, (0, 0, 0, steps + 1))
        pad_ok = F.pad(target_ok, (0, steps + 1))
        total = aux.new_zeros((), dtype=torch.float32)
        losses, correct, counts = [], [], []
        if self.loss not in ("full", "chunked"):
            raise ValueError(f"loss {self.loss!r}: expected 'full' or 'chunked'")
        full_fn = _compiled(_full_soft_ce) if self.compile_step else _full_soft_ce
        for k, _hidden, normed in self._unroll(input_ids, aux, embed_weight, steps):
            tgt = pad_logits[:, k + 1:k + 1 + t]
            ok = pad_ok[:, k + 1:k + 1 + t]
            okf = ok.float()
            n = okf.sum()
            if self.loss == "chunked":
                ce_sum, right = _ChunkedSoftCE.apply(normed, self.lm_head.weight, tgt, okf,
                                                     self.loss_chunk_rows, self.compile_step)
            else:
                ce_sum, right = full_fn(normed, self.lm_head, tgt, ok)
            loss_k = ce_sum / n.clamp(min=1.0)
            total = total + (decay ** k) * loss_k
            losses.append(loss_k.detach())
            correct.append(right)
            counts.append(n.detach())
        return total, torch.stack(losses), torch.stack(correct), torch.stack(counts)

    # -- incremental decoding --------------------------------------------
    def extend(self, embeds: torch.Tensor, hidden: torch.Tensor, start: int, cache: DraftCache,
               fuse: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """Run the layer over n new positions start..start+n-1 (batch 1) that
        attend to everything in `cache` and causally to each other; append
        their keys/values. `hidden` is the target's aux states [1,n,3H] when
        fuse, else the drafter's own previous output [1,n,H].
        Returns (output state [1,n,H] pre-norm, logits [1,n,Vd])."""
        if fuse:
            hidden = self.fc(hidden)
        n = embeds.shape[1]
        positions = torch.arange(start, start + n, device=embeds.device)
        cos, sin = self._cos_sin(hidden, positions)
        q, k, v = self.midlayer.qkv(embeds, hidden, cos, sin)
        if cache.k is not None:
            k = torch.cat([cache.k, k], 2)
            v = torch.cat([cache.v, v], 2)
        past = k.shape[2] - n
        mask = torch.ones(n, k.shape[2], dtype=torch.bool, device=embeds.device)
        mask[:, past:] = torch.ones(n, n, dtype=torch.bool, device=embeds.device).tril()
        attn = self.midlayer.self_attn.attend(q, k, v, mask)
        cache.k, cache.v = k, v
        out = self.midlayer.finish(hidden, attn)
        return out, self.lm_head(self.norm(out))


class _ChunkedSoftCE(torch.autograd.Function):
    """sum over counted rows of soft CE(target logits, x @ W^T), and the count of
    rows whose argmaxes agree, a chunk of rows at a time. The forward computes
    d(sum)/dx and d(sum)/dW (d CE / d logits = softmax(logits) - softmax(target)),
    so only [chunk, Vd] fp32 is ever live; backward scales them.
    Matmuls in the autocast dtype where autocast is on, as nn.Linear's would be.

    A chunk is whole samples (chunk_rows // T of them) or, for samples longer
    than chunk_rows, a run of rows of one sample: slices of the [B, T, ...]
    inputs as they are (the target logits are a strided view of the padded
    ones; flattening them would copy [B, T, Vd] each step). Each chunk writes
    its d CE / d logits into one [B, T, Vd] buffer in the matmul dtype, and the
    two gradient matmuls run once over all rows after the loop: two large
    matmuls accumulating in fp32 instead of two small ones and an fp32
    [Vd, H] read-modify-write per chunk."""

    @staticmethod
    def forward(ctx, x, weight, target, okf, chunk_rows, compiled=False):
        device = x.device.type
        mm = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else weight.dtype
        b, t, h = x.shape
        w = weight.to(mm)
        chunk = _compiled(_soft_ce_chunk) if compiled else _soft_ce_chunk
        per = max(1, chunk_rows // t)           # samples a chunk
        run = min(t, max(1, chunk_rows))        # rows of a sample a chunk
        with torch.autocast(device, enabled=False):
            grad_logits = torch.empty((b, t, w.shape[0]), dtype=mm, device=x.device)
            ce_sum = torch.zeros((), dtype=torch.float32, device=x.device)
            right = torch.zeros((), dtype=torch.float32, device=x.device)
            for b0 in range(0, b, per):
                for r0 in range(0, t, run):
                    rows = (slice(b0, b0 + per), slice(r0, r0 + run))
                    ce_c, right_c, g = chunk(x[rows], w, target[rows], okf[rows])
                    ce_sum += ce_c
                    right += right_c
                    grad_logits[rows] = g
            flat = grad_logits.view(-1, w.shape[0])
            grad_x = (flat @ w).view(b, t, h).to(x.dtype)
            grad_w = (flat.T @ x.reshape(-1, h).to(mm)).float()
        ctx.save_for_backward(grad_x, grad_w)
        ctx.weight_dtype = weight.dtype
        ctx.mark_non_differentiable(right)
        return ce_sum, right

    @staticmethod
    def backward(ctx, grad_sum, _grad_right):
        grad_x, grad_w = ctx.saved_tensors
        return (grad_x * grad_sum.to(grad_x.dtype), (grad_w * grad_sum).to(ctx.weight_dtype),
                None, None, None, None)


def _soft_ce_chunk(x, w, target, okc):
    """One chunk of _ChunkedSoftCE ([n, r, ...] slices): (CE sum, argmax
    agreements, d CE / d logits in w's dtype); w is already in the matmul dtype."""
    logits = (x.to(w.dtype) @ w.T).float()
    tc = target.float()
    log_p = torch.log_softmax(logits, -1)
    p_t = torch.softmax(tc, -1)
    ce = (-(p_t * log_p).sum(-1) * okc).sum()
    right = ((logits.argmax(-1) == tc.argmax(-1)).float() * okc).sum()
    g = ((log_p.exp() - p_t) * okc[..., None]).to(w.dtype)
    return ce, right, g
