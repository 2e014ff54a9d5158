"""Spec of the regenerate stage: the target answers the user turns of a prompts file.

Output (ops/regenerate/journal.py): <output>/conversations.jsonl (OpenAI
`messages` rows in input order, what prepare takes as its input),
<output>/regenerate.json (status "complete", counts, failed rows named), and
while it runs the append-only journal.jsonl + its done-index journal.idx that
a resumed run continues from. No torch imported here.

With `server` (a serve stage of mode target; the console binds its URL to
`url`, and a dependency on that stage waits for its server to be ready) or
`url`, the answers come from SGLang's `/v1/chat/completions`; without either,
from Hugging Face `generate` on the target here.
"""

from __future__ import annotations

from pathlib import Path

from ops.common import TMP_SUFFIX, read_json
from ops.spec import EstimateContext, Gauge, Lint, OpSpec, Param, ResultView, ServerParam

OUTPUT = "conversations.jsonl"
RESULT = "regenerate.json"
JOURNAL = "journal.jsonl"
INDEX = "journal.idx"
SETTINGS = "settings.json"
FAILURE_KINDS = ("timeout", "server_error", "empty", "context_overflow", "no_user_turn")
# An answer's bytes in the JSON lines: ~4 bytes a token of text plus JSON escaping.
BYTES_PER_TOKEN = 5
HEAD_BYTES = 1 << 20        # the head of the input read to guess its rows and user turns


def _input_shape(ctx: EstimateContext) -> tuple[int, float, int] | None:
    """(input bytes, rows, user turns a row) guessed from the input's head."""
    path = ctx.path("input")
    try:
        size = path.stat().st_size if path else None
        if not size:
            return None
        with open(path, "rb") as fh:
            head = fh.read(HEAD_BYTES)
    except OSError:
        return None
    lines = [ln for ln in head.split(b"\n") if ln.strip()]
    complete = lines if len(head) == size else lines[:-1] or lines
    rows = max(1, len(complete)) * size / max(1, len(head))
    users = sum(ln.count(b'"user"') + ln.count(b'"human"') + ln.count(b'"prompt"') for ln in complete)
    return size, rows, max(1, round(users / max(1, len(complete))))


def failed_words(r: dict) -> str:
    kinds = r.get("failed") or {}
    if not kinds:
        return "0 failed"
    named = ", ".join(f"{k} {v}" for k, v in sorted(kinds.items()))
    rows = [str(f.get("row")) for f in (r.get("failed_rows") or [])[:8]]
    more = "" if len(r.get("failed_rows") or []) <= 8 else ", ..."
    return f"{sum(kinds.values())} failed ({named}; rows {', '.join(rows)}{more})"


def url_problem(url: str) -> str | None:
    """Why `url` cannot be an SGLang server's address (http[s]://host[:port]), or None."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        text = str(exc)
        if "out of range" in text:
            return f"{url!r}: port {url.rsplit(':', 1)[-1].split('/')[0]} out of range 1-65535"
        return f"{url!r}: {text} (expected http://host:port)"
    if parts.scheme not in ("http", "https"):
        return f"{url!r}: not an http:// or https:// URL (expected http://host:port)"
    if not parts.hostname:
        return f"{url!r}: no host (expected http://host:port)"
    if port == 0:
        return f"{url!r}: port 0 out of range 1-65535"
    if parts.query or parts.fragment:
        return f"{url!r}: a query or fragment has no place in a server's address (expected http://host:port)"
    return None


def samples_problem(n: int, temperature: float) -> str | None:
    if n > 1 and temperature == 0:
        return (f"n {n} with temperature 0: greedy decoding draws the same answer {n} times; set temperature "
                f"(e.g. 0.7) or n = 1")
    return None


class Regenerate(OpSpec):
    name = "regenerate"
    summary = "the target answers the user turns of a prompts file (old answers dropped): SGLang or HF generate"
    params = (
        Param("input", help="prompts JSONL: conversations (ShareGPT `conversations` or OpenAI `messages`) "
                            "or {\"prompt\": text} rows"),
        Param("output", help="output directory (conversations.jsonl for prepare, regenerate.json)"),
        Param("server", None, "the serve stage (mode target) whose host:port the console makes --url", type=str),
        Param("url", None, "an SGLang server (http://host:port): /v1/chat/completions; none: HF generate here",
              type=str),
        Param("model", "default", "the request's model name (SGLang's served model name)"),
        Param("concurrency", 16, "requests in flight at once (engine sglang)", low=1, high=1024),
        Param("temperature", 0.0, "0 is greedy", low=0),
        Param("top_p", 1.0, "nucleus sampling's share", low=0, high=1, low_open=True),
        Param("max_tokens", 2048, "tokens an answer may take (a turn that leaves less room in the context "
                                  "gets what is left)", low=1),
        Param("n", 1, "sampled answers a prompt (temperature > 0): n conversations a row, each turn after the "
                      "first following its own answer", low=1, high=64),
        Param("seed", None, "sampling seed (temperature > 0; sample k of a row uses seed + k)", type=int),
        Param("limit", None, "answer only the first N rows", type=int, low=1),
        Param("timeout_s", 300.0, "seconds one request may take (then the row failed: timeout)", low=0,
              low_open=True),
        Param("ready_timeout_s", 600.0, "seconds to wait for the server to be ready first", low=0, low_open=True),
        Param("max_failed_fraction", 0.1, "the run fails (exit 1) when more of its rows failed", low=0, high=1),
        Param("device", "auto", "HF generate: auto | cpu | cuda", choices=("auto", "cpu", "cuda")),
        Param("dtype", "auto", "HF generate: auto (bf16 on CUDA, float32 on CPU), bfloat16, float16, float32",
              choices=("auto", "bfloat16", "float16", "float32")),
    )
    output_params = ("output",)
    uses_target = True
    estimate_rule = "2 x (the input + rows x user turns x n x max_tokens x 5 B): the journal and the final file"
    result_file = RESULT
    server_params = (ServerParam("server", "url", "target"),)

    def estimate_bytes(self, ctx: EstimateContext) -> int | None:
        shape = _input_shape(ctx)
        if shape is None:
            return None
        size, rows, turns = shape
        if ctx.params.get("limit"):
            share = min(1.0, int(ctx.params["limit"]) / rows)
            size, rows = int(size * share), min(rows, int(ctx.params["limit"]))
        answers = (rows * turns * int(ctx.params.get("max_tokens") or self.params["max_tokens"]) * BYTES_PER_TOKEN
                   * int(ctx.params.get("n") or 1))
        # The journal and the final file each hold every row once.
        return int(2 * (size + answers))

    def expected_samples(self, ctx: EstimateContext) -> int | None:
        return int(ctx.params["limit"]) if ctx.params.get("limit") else None

    def partial_files(self, root: Path) -> list[Path]:
        """Temp files, and the outputs no complete regenerate.json vouches for (the
        journal too: `clean` means start over)."""
        if not root.is_dir():
            return []
        out = sorted(p for p in root.iterdir() if p.is_file() and TMP_SUFFIX in p.name)
        if (read_json(root / RESULT) or {}).get("status") != "complete":
            out += [root / n for n in (OUTPUT, JOURNAL, INDEX, SETTINGS) if (root / n).is_file()]
        return out

    def result_line(self, r: dict) -> str | None:
        if r.get("status") != "complete":
            return None
        rate = r.get("tok_s")
        samples = int(r.get("samples") or 1)
        return (f"{r.get('answered', 0):,} of {r.get('rows', 0):,} rows answered ("
                + (f"{r.get('conversations', 0):,} conversations of {samples} samples, " if samples > 1 else "")
                + f"{r.get('turns', 0):,} turns, "
                f"{r.get('completion_tokens', 0):,} tokens"
                + (f", {rate:.1f} tok/s" if isinstance(rate, (int, float)) else "")
                + f", engine {r.get('engine')}); {failed_words(r)}")

    def result_view(self, r: dict) -> ResultView | None:
        line = self.result_line(r)
        if line is None:
            return None
        failed = sum((r.get("failed") or {}).values())
        head = ((f"{r.get('answered', 0):,} answered", "headline"), (f" of {r.get('rows', 0):,} rows\n", "label"),
                (failed_words(r), "alarm" if failed else "ok"))
        cell = (f"{r.get('answered', 0):,} ans" + (f", {failed} FAILED" if failed else ""), "alarm" if failed else "ok")
        return ResultView(head=head, details=(line,), cell=cell)

    def gauges(self, r: dict) -> list[Gauge]:
        if r.get("status") != "complete":
            return []
        out = [Gauge("regenerate_answered_rows", "Rows whose user turns the target answered.", r.get("answered")),
               Gauge("regenerate_tokens_per_second", "Completion tokens a second of the regenerate run.",
                     r.get("tok_s"))]
        for kind in FAILURE_KINDS:
            out.append(Gauge("regenerate_failed_rows", "Rows that failed, by cause.",
                             (r.get("failed") or {}).get(kind, 0), (("cause", kind),)))
        return out

    def lint(self, ctx: EstimateContext, gpus: list[int] | None) -> list[Lint]:
        p = ctx.params
        where = f"stages.{ctx.stage or 'regenerate'}.params"
        if p.get("url"):
            why = url_problem(str(p["url"]))
            if why:
                return [Lint("error", f"{where}.url {why}")]
        why = samples_problem(int(p.get("n") or 1), float(p.get("temperature") or 0.0))
        if why:
            return [Lint("error", f"{where}.{why}")]
        if not p.get("url") and not ctx.target.get("path"):
            return [Lint("error", "without params.server (a serve stage of mode target) or params.url, regenerate "
                                  "generates with the [target] table's path here: set it")]
        return []


SPEC = Regenerate()
