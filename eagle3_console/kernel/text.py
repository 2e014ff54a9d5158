"""Outside text made safe to print: a log's lines, another host's answer, a
value quoted in a pipeline-file error. ANSI control sequences (colours,
cursor moves) are dropped and every other non-printable character is escaped
the way repr() writes it, so nothing read sets a terminal's title or clears it.
"""

from __future__ import annotations

import re

# ANSI control sequences (colours, cursor moves): dropped, not escaped (the log monitor drops them too).
ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")


def printable(text: str, keep: str = "") -> str:
    """`text` without ANSI control sequences, every other non-printable
    character but those in `keep` escaped the way repr() writes it."""
    if text.isprintable():
        return text
    if "\x1b" in text:
        text = ANSI.sub("", text)
    return "".join(c if c.isprintable() or c in keep else c.encode("unicode_escape").decode("ascii")
                   for c in text)


def clip(text: str, limit: int) -> str:
    """Printable, and at most `limit` characters (cut with an ellipsis)."""
    text = printable(text[:limit * 4])
    return text if len(text) <= limit else text[:limit - 1] + "…"
