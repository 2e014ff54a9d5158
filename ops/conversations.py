"""Read a conversation JSONL into normalised message lists (prepare, regenerate and the prompt files share it).

Accepts the ShareGPT form (`conversations: [{from, value}]`) and the OpenAI
form (`messages: [{role, content}]`) on any line, and turns both into
`[{"role": system|user|assistant, "content": str}]` for the chat template.
A malformed line is the operator's error (BadInput naming file:line); a
conversation that is empty or has no assistant turn is data, dropped and
counted by the caller.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from ops.common import BadInput

SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant",
                  "assistant": "assistant", "system": "system"}
OPENAI_ROLES = {"user": "user", "assistant": "assistant", "system": "system"}
# JSON's \\uD800-\\uDFFF escapes parse to lone surrogates when unpaired: text no UTF-8 file,
# request or journal line can hold (str.encode raises). Looked for only where the raw line has one.
SURROGATE = re.compile("[\ud800-\udfff]")
SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


@dataclass
class Conversation:
    line: int                        # 1-based line number in the input
    messages: list[dict]             # [{"role", "content"}], roles normalised
    drop: str | None = None          # why it cannot become a sample, if so


def _text(value, where: str) -> str:
    if isinstance(value, str):
        return value
    # OpenAI content may be a list of parts; only text parts carry tokens here.
    if isinstance(value, list) and all(isinstance(p, dict) for p in value):
        parts = [p.get("text") for p in value if p.get("type", "text") == "text"]
        if all(isinstance(p, str) for p in parts):
            return "".join(parts)
    raise BadInput(f"{where}: expected a string (or a list of text parts), got {type(value).__name__}")


def parse_row(row, where: str, line: int) -> Conversation:
    """One JSONL object -> Conversation; BadInput when its shape is wrong."""
    if not isinstance(row, dict):
        raise BadInput(f"{where}: expected a JSON object, got {type(row).__name__}")
    if "conversations" in row:
        key, role_key, text_key, roles = "conversations", "from", "value", SHAREGPT_ROLES
    elif "messages" in row:
        key, role_key, text_key, roles = "messages", "role", "content", OPENAI_ROLES
    else:
        raise BadInput(f"{where}: expected a 'conversations' (ShareGPT) or 'messages' (OpenAI) "
                       f"list, found keys {sorted(row)}")
    turns = row[key]
    if not isinstance(turns, list):
        raise BadInput(f"{where}: '{key}' must be a list, got {type(turns).__name__}")
    messages = []
    for i, turn in enumerate(turns):
        at = f"{where}: {key}[{i}]"
        if not isinstance(turn, dict):
            raise BadInput(f"{at}: expected an object with '{role_key}' and '{text_key}'")
        if role_key not in turn or text_key not in turn:
            raise BadInput(f"{at}: missing '{role_key if role_key not in turn else text_key}' "
                           f"(has {sorted(turn)})")
        role = roles.get(str(turn[role_key]).lower()) if isinstance(turn[role_key], str) else None
        if role is None:
            raise BadInput(f"{at}: unknown {role_key} {turn[role_key]!r}; expected one of {sorted(roles)}")
        messages.append({"role": role, "content": _text(turn[text_key], f"{at}.{text_key}")})
    conv = Conversation(line=line, messages=messages)
    if not messages or all(not m["content"].strip() for m in messages):
        conv.drop = "empty"
    elif not any(m["role"] == "assistant" for m in messages):
        conv.drop = "no_assistant_turn"
    return conv


def lone_surrogate(text: str) -> tuple[int, str] | None:
    """(character index, the surrogate as a \\uXXXX escape) of the first lone surrogate in `text`, or None."""
    m = SURROGATE.search(text)
    return None if m is None else (m.start(), f"\\u{ord(m.group()):04x}")


def _find_surrogate(value: Any, key: str = "") -> tuple[str, int, str] | None:
    """(key path, index, escape) of the first lone surrogate in a parsed JSON value."""
    if isinstance(value, str):
        found = lone_surrogate(value)
        return None if found is None else (key or "the row", *found)
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for k, v in items:
        sub = f"{key}[{k}]" if isinstance(k, int) else (f"{key}.{k}" if key else str(k))
        found = _find_surrogate(k, f"{sub} (the key)") if isinstance(k, str) else None
        found = found or _find_surrogate(v, sub)
        if found:
            return found
    return None


def check_text(row: Any, raw: bytes, where: str) -> None:
    """BadInput naming file:line and key when the row holds a lone surrogate."""
    if not SURROGATE_ESCAPE.search(raw):
        return
    found = _find_surrogate(row)
    if found:
        key, at, esc = found
        raise BadInput(f"{where}: {key} holds a lone surrogate '{esc}' at character {at} (an escape that is no "
                       f"character; UTF-8 cannot hold it): fix or drop that row")


def jsonl_rows(path: Path, what: str) -> Iterator[tuple[int, str, Any]]:
    """(line number, "file:line", row) of each non-blank line of a JSONL file: the one
    reader of the conversation and prompt files. BadInput naming the file ("<what> PATH:
    no such file") or the line (not UTF-8, not JSON, a lone surrogate escape)."""
    path = Path(path)
    if not path.is_file():
        raise BadInput(f"{what} {path}: no such file")
    with open(path, "rb") as fh:
        for line_no, raw in enumerate(fh, start=1):
            if not raw.strip():
                continue
            where = f"{path}:{line_no}"
            try:
                row = json.loads(raw)
            except UnicodeDecodeError as exc:
                raise BadInput(f"{where}: not UTF-8 ({exc.reason} at byte {exc.start})") from None
            except ValueError as exc:
                raise BadInput(f"{where}: not valid JSON ({exc})") from None
            check_text(row, raw, where)
            yield line_no, where, row


def read_conversations(path: Path, limit: int | None = None) -> list[Conversation]:
    """All rows of `path` (the first `limit` non-blank ones if given)."""
    out: list[Conversation] = []
    for line_no, where, row in jsonl_rows(path, "input"):
        if limit is not None and len(out) >= limit:
            break
        out.append(parse_row(row, where, line_no))
    return out
