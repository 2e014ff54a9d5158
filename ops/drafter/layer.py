"""The drafter's one decoder layer (SGLang's LlamaForCausalLMEagle3 midlayer):
attention over concat(input_layernorm(embedding), hidden_norm(h)), then the
residual and the MLP.

Where it sits: built by model.py's Eagle3Drafter (its `midlayer`; the
parameter names are SGLang's, so export writes the state dict as it is); the
attention's paths: SDPA with a mask or causal, FlexAttention with a TTT block
mask (ttt_attention.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ops.drafter.config import DrafterConfig
from ops.drafter.ttt_attention import flex_kernels


def norm_class():
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
        flex = flex_kernels()["compiled" if q.is_cuda else "eager"]
        return flex(q, k.to(q.dtype), v.to(q.dtype), block_mask=block_mask, enable_gqa=self.n_kv != self.n_heads)

    def project(self, out: torch.Tensor) -> torch.Tensor:
        b, _, t, _ = out.shape
        return self.o_proj(out.transpose(1, 2).reshape(b, t, self.n_heads * self.head_dim))


class Eagle3DecoderLayer(nn.Module):
    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        from transformers.models.llama.modeling_llama import LlamaMLP

        norm = norm_class()
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
