"""The demo target's tokenizer: a byte-level BPE trained on the demo corpus.

Built with the `tokenizers` library, wrapped as a transformers
PreTrainedTokenizerFast with a ChatML-style chat template, and saved into the
target directory, where prepare loads it like any Hugging Face tokenizer.
Byte-level BPE (as in Llama 3, Qwen, Kimi) decodes back to the exact text and
reports character offsets, which prepare's loss mask relies on.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

BOS, EOS, PAD = "<s>", "<|im_end|>", "<pad>"
IM_START = "<|im_start|>"
SPECIAL_TOKENS = [PAD, BOS, IM_START, EOS]
# The end-of-turn token is <|im_end|>; the newline after it belongs to the
# template, not to the turn (prepare's mask stops at <|im_end|>).
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def build_tokenizer(texts: Iterable[str], vocab_size: int = 512):
    """A PreTrainedTokenizerFast trained on `texts` (deterministic for the same texts)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    # trim_offsets=False: offsets cover the token's own spaces, so a token's
    # span is exactly its text and spans tile the input.
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(list(texts), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD,
        additional_special_tokens=[IM_START], model_max_length=4096,
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def save_tokenizer(tokenizer, directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(str(directory))
