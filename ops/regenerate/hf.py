"""regenerate without a server: Hugging Face `generate` on the target, one turn at a time.

The prompt is the target's own chat template with the generation prompt; the
answer is what follows it up to the end-of-turn token or max_tokens. A prompt
at or over the model's context length (`max_position_embeddings`) fails as
context_overflow, as SGLang refuses it; max_tokens is cut to what fits.
"""

from __future__ import annotations

from pathlib import Path

from ops.common import BadInput, wants_cuda
from ops.regenerate.engine import Answer, RowFailed


class HFGenerator:
    engine = "hf"

    def __init__(self, target: str, device: str, dtype: str, temperature: float, top_p: float,
                 max_tokens: int, seed: int | None):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if not target or not (Path(target) / "config.json").is_file():
            raise BadInput(f"--target {target!r}: no Hugging Face model there (config.json); without --url "
                           f"regenerate generates with the target here")
        self.torch = torch
        self.tok = AutoTokenizer.from_pretrained(target)
        if not self.tok.chat_template:
            raise BadInput(f"{target}: the tokenizer has no chat template; regenerate renders turns with it")
        use_cuda = wants_cuda(device)
        self.device = torch.device("cuda" if use_cuda else "cpu")
        kind = (torch.bfloat16 if use_cuda else torch.float32) if dtype == "auto" else getattr(torch, dtype)
        self.model = AutoModelForCausalLM.from_pretrained(target, dtype=kind).to(self.device).eval()
        self.context = getattr(self.model.config, "max_position_embeddings", None)
        eos = self.model.generation_config.eos_token_id
        eos = eos if eos is not None else self.tok.eos_token_id
        self.eos = set(eos if isinstance(eos, list) else [eos]) - {None}
        self.temperature, self.top_p, self.max_tokens, self.seed = temperature, top_p, max_tokens, seed

    def chat(self, messages: list[dict], n: int = 1) -> list[Answer]:
        """n answers (sampled: seed, seed + 1, ... when a seed is given)."""
        return [self._one(messages, None if self.seed is None else self.seed + k) for k in range(n)]

    def _one(self, messages: list[dict], seed: int | None) -> Answer:
        torch = self.torch
        enc = self.tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                           return_dict=True)
        ids = enc["input_ids"].to(self.device)
        n = ids.shape[1]
        if self.context and n >= self.context:
            raise RowFailed("context_overflow", f"the prompt has {n} tokens; the target's context length is "
                                                f"{self.context} tokens")
        max_new = min(self.max_tokens, self.context - n) if self.context else self.max_tokens
        sample = self.temperature > 0
        kw = {"do_sample": sample, "temperature": self.temperature if sample else None,
              "top_p": self.top_p if sample else None, "top_k": None}
        if sample and seed is not None:
            torch.manual_seed(seed)
        with torch.no_grad():
            out = self.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new,
                                      pad_token_id=min(self.eos) if self.eos else None, **kw)
        new = out[0, n:].tolist()
        stopped = bool(new) and new[-1] in self.eos
        text = self.tok.decode(new, skip_special_tokens=True)
        if not text.strip():
            raise RowFailed("empty", f"empty answer ({len(new)} tokens)")
        return Answer(text, len(new), n, "stop" if stopped else "length")
