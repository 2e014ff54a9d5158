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
- `unroll_drafts(...)`: the same unroll without a loss, each step's drafts
  (train's held-out acceptance, ops/train/heldout.py).
- `extend(...)`: incremental decoding against a DraftCache (ops.bench, export --check).

The target's embedding is not a parameter here: it is frozen and passed in, so
that neither DDP nor the checkpoint carries a vocab x hidden copy of it.

Training-speed levers, attributes of the module, each equal to the
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
The layer is ops/drafter/layer.py, the TTT masks and FlexAttention
ttt_attention.py, the loss soft_ce.py; what compile_step compiles is here.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ops.drafter.config import DrafterConfig
from ops.drafter.layer import Eagle3DecoderLayer, norm_class
from ops.drafter.soft_ce import chunked_soft_ce, full_soft_ce, soft_ce_chunk
from ops.drafter.ttt_attention import raise_recompile_limit, ttt_block_mask, ttt_mask

# What compile_step compiles with (tests count graphs with backend "eager",
# which runs dynamo without inductor's code generation).
COMPILE_BACKEND = "inductor"
COMPILE_MODE: str | None = None      # e.g. "max-autotune-no-cudagraphs"
_COMPILED: dict = {}


def _compiled(fn):
    key = (fn.__name__, COMPILE_BACKEND, COMPILE_MODE)
    if key not in _COMPILED:
        raise_recompile_limit()
        _COMPILED[key] = torch.compile(fn, dynamic=False, backend=COMPILE_BACKEND, mode=COMPILE_MODE)
    return _COMPILED[key]


def _layer_qkv(layer, embeds, hidden, cos, sin):
    return layer.qkv(embeds, hidden, cos, sin)


def _layer_finish(layer, norm, hidden, attn):
    """(the step's output state, its final norm) from the attention's [B, heads, T, D]."""
    out = layer.finish(hidden, layer.self_attn.project(attn))
    return out, norm(out)


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
        self.norm = norm_class()(cfg.hidden_size, eps=cfg.rms_norm_eps)
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

    def unroll_drafts(self, input_ids: torch.Tensor, aux: torch.Tensor, embed_weight: torch.Tensor, steps: int):
        """Yield (k, the step's argmax as target ids [B,T]) for k = 0..steps-1, the
        LM head a chunk of loss_chunk_rows rows at a time (no [B,T,Vd] of a step held)."""
        for k, _hidden, normed in self._unroll(input_ids, aux, embed_weight, steps):
            flat = normed.reshape(-1, normed.shape[-1])
            best = torch.cat([self.lm_head(flat[i:i + self.loss_chunk_rows]).argmax(-1)
                              for i in range(0, flat.shape[0], self.loss_chunk_rows)])
            yield k, self.draft_to_target(best).view(normed.shape[:-1])

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
        full_fn = _compiled(full_soft_ce) if self.compile_step else full_soft_ce
        chunk_fn = _compiled(soft_ce_chunk) if self.compile_step and self.loss == "chunked" else soft_ce_chunk
        for k, _hidden, normed in self._unroll(input_ids, aux, embed_weight, steps):
            tgt = pad_logits[:, k + 1:k + 1 + t]
            ok = pad_ok[:, k + 1:k + 1 + t]
            okf = ok.float()
            n = okf.sum()
            if self.loss == "chunked":
                ce_sum, right = chunked_soft_ce(normed, self.lm_head.weight, tgt, okf, self.loss_chunk_rows,
                                                chunk_fn)
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
