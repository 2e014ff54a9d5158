"""Chat template + tokenization + loss mask of a batch of conversations.

The middle of prepare: ops/conversations.py gives message lists, this module renders
each with the tokenizer's own chat template, tokenizes the batch with the
fast tokenizer (offset mapping on) or a slow one (below), and marks the
tokens of the assistant turns. __main__.py runs it in worker processes and writes the arrays.

Slow tokenizers (Kimi's tiktoken-based one, loaded with trust_remote_code)
report no offsets. For them the rendered text is cut at the assistant
contents' boundaries and each piece is tokenized on its own; the pieces'
tokens are used only when their concatenation equals the whole text's
tokenization (true where the template puts special tokens around the
content, as ChatML and Kimi's do), otherwise the sample is dropped as
`mask_unaligned`, never masked by a guess.

How the mask is found (no guessing from token ids):
1. each assistant turn's content is located in the rendered text by
   character offsets: the template is rendered up to that turn with the
   generation prompt, and the content is searched from where that prefix
   ends (so a content equal to a role name cannot match the header);
2. a token is masked when its character span overlaps a content span;
3. the end-of-turn token is the first special token right after the content
   (only whitespace tokens between): `<|im_end|>`, `<|eot_id|>`, `</s>`...
   The template's text after it (a newline) is not part of the turn.

init_worker() loads the tokenizer once per process (the main one, or each
worker of the spawn pool) and encode_in_worker() runs a batch with it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ops.common import BadInput


# The tokenizer of this process (the main one or a pool worker), set by init_worker.
_tokenizer = None
_specials: set[int] = set()


@dataclass
class Encoded:
    """One conversation's tokens, or why it was dropped."""

    line: int
    ids: np.ndarray | None = None        # int32 [T] before truncation
    mask: np.ndarray | None = None       # uint8 [T]
    drop: str | None = None
    error: str | None = None             # detail of a template error


@dataclass
class BatchResult:
    items: list[Encoded] = field(default_factory=list)


def special_ids(tokenizer) -> set[int]:
    ids = set(int(i) for i in (tokenizer.all_special_ids or []))
    for idx, tok in getattr(tokenizer, "added_tokens_decoder", {}).items():
        if getattr(tok, "special", False):
            ids.add(int(idx))
    return ids


def _render(tokenizer, messages, add_generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False,
                                         add_generation_prompt=add_generation_prompt)


def assistant_spans(tokenizer, messages: list[dict], rendered: str) -> list[tuple[int, int]]:
    """Character spans [start, end) of each assistant turn's content in `rendered`.

    ValueError when a turn's content cannot be found (a template that
    rewrites the content beyond trimming).
    """
    spans = []
    cursor = 0
    for i, msg in enumerate(messages):
        content = msg["content"]
        search_from = cursor
        if msg["role"] == "assistant":
            try:
                prefix = _render(tokenizer, messages[:i], True) if i else None
            except Exception:  # noqa: BLE001 - some templates refuse a prefix; fall back to the cursor
                prefix = None
            if prefix and rendered.startswith(prefix) and len(prefix) >= cursor:
                search_from = len(prefix)
        found = rendered.find(content, search_from) if content else search_from
        if found < 0 and content.strip():
            content = content.strip()
            found = rendered.find(content, search_from)
        if found < 0:
            if msg["role"] == "assistant":
                raise ValueError(f"assistant turn {i} not found in the rendered chat template")
            continue
        if msg["role"] == "assistant":
            spans.append((found, found + len(content)))
        cursor = found + len(content)
    return spans


def mask_from_offsets(offsets: list[tuple[int, int]], ids: list[int], text: str,
                      spans: list[tuple[int, int]], specials: set[int]) -> np.ndarray:
    """1 on tokens overlapping a span, plus the end-of-turn special token after each."""
    n = len(ids)
    mask = np.zeros(n, dtype=np.uint8)
    starts = np.fromiter((o[0] for o in offsets), dtype=np.int64, count=n)
    ends = np.fromiter((o[1] for o in offsets), dtype=np.int64, count=n)
    for s, e in spans:
        if e > s:
            mask[(starts < e) & (ends > s)] = 1
        # the first token starting at or after the content end
        j = int(np.searchsorted(starts, e, side="left"))
        # zero-width tokens at the boundary (none in practice) are skipped with the whitespace
        k = j
        while k < n and ids[k] not in specials and not text[starts[k]:ends[k]].strip():
            k += 1
        if k < n and ids[k] in specials:
            mask[j:k + 1] = 1
    return mask


def _is_blank(tokenizer, token_id: int, cache: dict[int, bool]) -> bool:
    if token_id not in cache:
        cache[token_id] = not tokenizer.decode([token_id]).strip()
    return cache[token_id]


def encode_by_pieces(tokenizer, todo: list[Encoded], texts: list[str], spans: list[list[tuple[int, int]]],
                     specials: set[int]) -> None:
    """The slow-tokenizer path: tokens of the pieces between span boundaries,
    checked against the whole text's tokens (see the module docstring)."""
    cuts_of = [sorted({0, len(t), *(b for sp in spn for b in sp)}) for t, spn in zip(texts, spans)]
    pieces = [t[a:b] for t, cuts in zip(texts, cuts_of) for a, b in zip(cuts, cuts[1:])]
    piece_ids = tokenizer(pieces, add_special_tokens=False, return_attention_mask=False)["input_ids"] if pieces else []
    whole_ids = tokenizer(texts, add_special_tokens=False, return_attention_mask=False)["input_ids"]
    blank: dict[int, bool] = {}
    at = 0
    for item, cuts, spn, whole in zip(todo, cuts_of, spans, whole_ids):
        mine = piece_ids[at:at + len(cuts) - 1]
        at += len(cuts) - 1
        ids = [i for piece in mine for i in piece]
        if ids != list(whole):
            item.drop = "mask_unaligned"
            item.error = (f"line {item.line}: the tokens of the text cut at the assistant turns differ from the "
                          f"whole text's ({len(ids)} vs {len(whole)}): this slow tokenizer merges across the "
                          f"turn boundaries (no special token around the content, or a prefix space added to each "
                          f"piece); a fast tokenizer (tokenizer.json) gives exact offsets")
            continue
        starts = np.cumsum([0] + [len(p) for p in mine])      # token index where each piece begins
        mask = np.zeros(len(ids), dtype=np.uint8)
        piece_at = {c: k for k, c in enumerate(cuts)}        # a cut -> the piece that begins there
        for s, e in spn:
            mask[starts[piece_at[s]]:starts[piece_at[e]]] = 1
            j = q = int(starts[piece_at[e]])
            while q < len(ids) and ids[q] not in specials and _is_blank(tokenizer, ids[q], blank):
                q += 1
            if q < len(ids) and ids[q] in specials:
                mask[j:q + 1] = 1
        item.ids = np.asarray(ids, dtype=np.int32)
        item.mask = mask


def encode_batch(tokenizer, batch: list[tuple[int, list[dict]]], specials: set[int]) -> BatchResult:
    """Render, tokenize (one batch call) and mask `batch` = [(line, messages)]."""
    result = BatchResult()
    texts, spans, todo = [], [], []
    for line, messages in batch:
        item = Encoded(line=line)
        result.items.append(item)
        try:
            rendered = _render(tokenizer, messages, False)
            sp = assistant_spans(tokenizer, messages, rendered)
        except Exception as exc:  # noqa: BLE001 - a template refusing a row drops that row, with its reason
            item.drop, item.error = "template_error", f"line {line}: {type(exc).__name__}: {exc}"
            continue
        texts.append(rendered)
        spans.append(sp)
        todo.append(item)
    if not texts:
        return result
    if not getattr(tokenizer, "is_fast", False):
        encode_by_pieces(tokenizer, todo, texts, spans, specials)
        return result
    # The template already holds BOS where the model wants it: add no specials.
    enc = tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True,
                    return_attention_mask=False)
    for item, text, sp, ids, offs in zip(todo, texts, spans, enc["input_ids"], enc["offset_mapping"]):
        item.ids = np.asarray(ids, dtype=np.int32)
        item.mask = mask_from_offsets(offs, ids, text, sp, specials)
    return result


def load_tokenizer(path: str, trust_remote_code: bool = False):
    from transformers import AutoTokenizer

    d = Path(path)
    if not d.is_dir():
        raise BadInput(f"tokenizer directory {d}: no such directory")
    try:
        tok = AutoTokenizer.from_pretrained(str(d), trust_remote_code=trust_remote_code)
    except Exception as exc:  # noqa: BLE001 - any load failure is a bad tokenizer directory
        raise BadInput(f"tokenizer directory {d}: cannot load a tokenizer ({type(exc).__name__}: {exc})") from exc
    if not getattr(tok, "chat_template", None):
        raise BadInput(f"tokenizer {d}: has no chat_template (tokenizer_config.json or chat_template.jinja)")
    return tok


def init_worker(path: str, trust_remote_code: bool = False, threads: bool = True) -> None:
    """Load the tokenizer into this process (the pool's initializer, or in-process)."""
    global _tokenizer, _specials
    import os

    if not threads:
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
    _tokenizer = load_tokenizer(path, trust_remote_code)
    _specials = special_ids(_tokenizer)


def encode_in_worker(batch: list[tuple[int, list[dict]]]) -> BatchResult:
    return encode_batch(_tokenizer, batch, _specials)
