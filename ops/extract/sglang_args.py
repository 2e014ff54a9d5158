"""engine sglang's launch: the torchrun argv for tp > 1, and the `extra_args` an operator adds.

Where it sits: ops/extract/spec.py builds the stage's argv and lint from here
(the console, no SGLang import); sglang_run.check() parses the full argv with
SGLang's own parser before anything loads (the op, on the GPU host). The
engine's own flags are sglang_capture.server_argv's.

`extra_args` is a list of SGLang server flags passed after the engine's own
(`["--attention-backend", "triton", "--disable-custom-all-reduce"]`), as the
serve op takes them. Flags the engine sets from its params or needs as they
are (MANAGED, with every alias the 0.5.23 parser gives the same field:
argparse keeps the last value, so an alias later in the argv would win
silently) and flags that split the tokens over ranks (INCOMPATIBLE) are
refused. tests/test_extract_sglang_launch.py checks both tables against
SGLang's parser.
"""

from __future__ import annotations

from typing import Any, Sequence

from ops.sglang_flags import extra_args_of, flags
from ops.spec import Lint

# flag -> the param that sets it, or why the engine fixes it.
MANAGED = {
    "--model-path": "the [target] path", "--model": "the [target] path",
    "--tp-size": "param tp", "--tensor-parallel-size": "param tp",
    "--ep-size": "param ep", "--expert-parallel-size": "param ep", "--ep": "param ep",
    "--dtype": "param dtype", "--context-length": "param max_seq_len",
    "--mem-fraction-static": "param mem_fraction_static",
    "--return-aux-hidden-state-layer-ids": "param layer_ids",
    "--enable-return-aux-hidden-states": "the engine (aux capture)",
    "--speculative-algorithm": "the engine (capture-only EAGLE3 mode)",
    "--disable-radix-cache": "the engine (every token's state: no prefix reuse)",
    "--chunked-prefill-size": "the engine (one extend a sample)",
    "--cuda-graph-backend-decode": "the engine (eager prefill of any shape)",
    "--cuda-graph-backend-prefill": "the engine (eager prefill of any shape)",
    "--skip-tokenizer-init": "the engine (token ids in, no tokenizer)",
    "--disable-overlap-schedule": "the engine (no scheduler)",
    "--random-seed": "the engine",
}
# A rank would hold only its share of the tokens (attention DP, LayerNorm SP:
# sglang_capture.py's docstring) or of the layers (PP), or a second replica
# would need its own processes: the engine's plain TP prefill cannot do these.
INCOMPATIBLE = {
    "--dp-size", "--data-parallel-size", "--pp-size", "--pipeline-parallel-size",
    "--attn-dp-size", "--attention-data-parallel-size", "--enable-dp-attention", "--enable-layernorm-sp",
}


def lint(params: dict[str, Any], gpus: Sequence[int] | None) -> list[Lint]:
    """What is wrong with an engine-sglang launch before it starts (the console's
    `run`); `params`: extract's effective params (its SPEC.effective, or the
    program's parsed flags)."""
    if params["engine"] != "sglang":
        if params.get("extra_args"):
            return [Lint("error", "extra_args: SGLang server flags, for engine = \"sglang\" only")]
        return []
    out: list[Lint] = []
    try:
        extra = extra_args_of(params.get("extra_args"))
    except ValueError as exc:
        return [Lint("error", str(exc))]
    for flag in flags(extra):
        if flag in MANAGED:
            out.append(Lint("error", f"extra_args sets {flag}, which {MANAGED[flag]} sets for engine sglang"
                        + ("" if MANAGED[flag].startswith("the engine") else ": set that instead")))
        elif flag in INCOMPATIBLE:
            out.append(Lint("error", f"extra_args {flag}: engine sglang runs one TP group, each rank on "
                                     f"every token; data, attention-data and pipeline parallel are not for it"))
    tp = int(params["tp"])
    if gpus is not None and len(gpus) != tp:
        out.append(Lint("error", f"engine sglang: tp {tp}, but the stage's gpus list has {len(gpus)} "
                                 f"({','.join(map(str, gpus))}): one GPU a TP rank"))
    return out


def launch(params: dict[str, Any], argv: list[str]) -> list[str]:
    """One process per TP rank: `python -m torch.distributed.run --standalone
    --nproc-per-node TP -m ops.extract ...` (torchrun under the op's own
    interpreter); tp 1 and the HF engine run as they are. `params`: the
    effective ones (OpSpec.argv hands its merged params)."""
    tp = int(params["tp"])
    if params["engine"] != "sglang" or tp <= 1:
        return argv
    python, dash_m, module, *rest = argv
    assert dash_m == "-m", argv
    return [python, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(tp),
            "-m", module, *rest]


def parse_full(argv: Sequence[str]):
    """SGLang's ServerArgs for the engine's argv plus extra_args, through its own
    parser; ValueError naming what it refused (argparse would exit the rank)."""
    import argparse
    import contextlib
    import io

    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(prog="extract --engine sglang", exit_on_error=False)
    ServerArgs.add_cli_args(parser)
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            ns = parser.parse_args(list(argv))
    except SystemExit:
        raise ValueError(err.getvalue().strip().splitlines()[-1] if err.getvalue().strip()
                         else "SGLang's parser refused the argv") from None
    except argparse.ArgumentError as exc:
        raise ValueError(str(exc)) from None
    return ServerArgs.from_cli_args(ns)

