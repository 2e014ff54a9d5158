"""python -m ops.bench: acceptance and speed-up of an exported drafter on held-out prompts.

Data flow: export's directory (SGLang or speculators format, read back by
ops.drafter.formats) + the Hugging Face target + prompts (the held-out samples
of the hidden-state data: each sample's tokens before its first loss-masked
token, i.e. the conversation up to the assistant's answer; or --prompts-file
JSONL with "input_ids") -> ops.bench.speculative -> <output>/bench.json and a
`bench:` summary line the console shows next to the stage.

Reports the acceptance length as SGLang defines it (completion tokens / verify
steps, the bonus token included: its `spec_verify_ct`), the acceptance rate per draft position (conditional:
draft i accepted given drafts 1..i-1 were), and the speed-up against plain
greedy decoding timed in the same process on the same prompts. Exits 1 when
the speculative output differs from plain greedy output. With engine sglang, on
a real bf16 target, speculative and plain greedy answers may part after a
near-tie: bench reports how many prompts differ and where, beside the plain
server's own drift between concurrency 1 and 8, and exits 1 only when numerics
cannot explain it (ops/bench/figures.py judge_drift).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from ops.common import BadInput, run_main, wants_cuda
from ops.params import build_parser as spec_parser
from ops.bench.spec import SPEC


def build_parser() -> argparse.ArgumentParser:
    return spec_parser(SPEC, description=__doc__.splitlines()[0], target_required=False,
                       target_help="the target's Hugging Face checkpoint directory (engine reference needs it)")


def parse_args(argv=None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def prompts_from_data(data_dir: Path, indices: list[int], n: int) -> list[tuple[int, list[int]]]:
    """Held-out prompts (the tokens before each sample's first answer token) from extract's
    output, or from prepare's (an online run's data)."""
    from safetensors import safe_open

    from ops.drafter.data import read_data
    from ops.prepared import SAMPLES_FILE, load_samples

    if (Path(data_dir) / SAMPLES_FILE).is_file():
        # An online run's data: prepare's samples (the drafter's held-out ids are theirs too).
        prepared = load_samples(Path(data_dir))
        known = range(len(prepared))
        rows = {i: tuple(a.tolist() for a in prepared.get(i)) for i in
                ([i for i in indices if 0 <= i < len(prepared)] or list(known)[-n:])}
    else:
        info = read_data(data_dir)
        rows = {}
        for i in [i for i in indices if i in info.samples] or sorted(info.samples)[-n:]:
            with safe_open(str(info.samples[i]), framework="pt") as fh:
                rows[i] = (fh.get_tensor("input_ids").tolist(), fh.get_tensor("loss_mask").tolist())
    out = []
    for idx, (ids, mask) in rows.items():
        first = next((i for i, m in enumerate(mask) if m), len(ids))
        if first >= 2:
            out.append((idx, ids[:first]))
        if len(out) == n:
            break
    return out


def prompts_from_file(path: Path, n: int, tokenizer_dir: str | None = None) -> list[tuple[int, list[int]]]:
    """Rows of `"input_ids"`, or chat rows (conversations, messages, prompt: ops/prompts.py)
    rendered with the target's chat template."""
    from ops.prompts import prompt_ids

    return prompt_ids(Path(path), n, tokenizer_dir)


def prompts_for(args) -> list[tuple[int, list[int]]]:
    """Held-out prompts: --prompts-file, else the data's samples (the export's
    holdout first, named by its export_info.json, when --drafter is given)."""
    if args.prompts_file:
        return prompts_from_file(Path(args.prompts_file), args.num_prompts, args.target)
    info: dict = {}
    if args.drafter:
        from ops.drafter.formats import INFO_FILE, detect_format
        ddir, _fmt = detect_format(Path(args.drafter))
        info_path = ddir.parent / INFO_FILE
        info = json.loads(info_path.read_text()) if info_path.exists() else {}
    data = args.data or info.get("data") or info.get("samples")
    if not data:
        raise ValueError("no prompts: pass --data or --prompts-file (or --drafter whose export_info.json names data)")
    return prompts_from_data(Path(data), list(info.get("holdout") or []), args.num_prompts)


def write_result(out_dir: Path, result: dict) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / f"bench.json.tmp-{os.getpid()}"
    tmp.write_text(json.dumps(result, indent=1) + "\n")
    os.replace(tmp, out_dir / "bench.json")


def split_by_kind(result: dict, prompts, target: str | None, log) -> None:
    """bench.json's `by_kind` (ops/bench/kinds.py) where the target's tokenizer reads here: the split
    is a view of figures already measured, so a target without one (a pipeline's `[target]` that is a
    name, or a folder of weights only) leaves it out and says why, and the bench stands."""
    from ops.bench import kinds

    if not target:
        return
    if not Path(target).is_dir():
        log(f"bench: no code/chat split: the target {target!r} is not a local folder to read its tokenizer from")
        return
    try:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(target)
    except (OSError, ValueError) as exc:
        log(f"bench: no code/chat split: {target}: no tokenizer ({str(exc).splitlines()[0][:200]})")
        return
    result["by_kind"] = kinds.split(result["per_prompt"], kinds.kinds_of(result, prompts, tok.decode))


def main_sglang(args) -> int:
    from ops.bench.sglang import ServerError, run_bench

    if not args.url:
        raise BadInput("engine sglang needs --url (the speculative serve stage's, e.g. http://127.0.0.1:30000; "
                       "in a pipeline, params.server names the serve stage instead)")
    try:
        prompts = prompts_for(args)
        if not prompts:
            raise ValueError("no usable prompts (each needs >= 2 tokens before the answer)")
        print(f"bench: engine sglang, {len(prompts)} prompts, {args.max_new_tokens} new tokens, {args.url}"
              + (f" (serve stage {args.server})" if args.server else "")
              + (f" vs baseline {args.baseline_url}" if args.baseline_url else "")
              + (f" (serve stage {args.baseline_server})" if args.baseline_server else ""), flush=True)
        urls = [u.strip() for u in args.url.split(",") if u.strip()]
        log = lambda m: print(m, flush=True)  # noqa: E731
        result = run_bench(urls[0], prompts, args.max_new_tokens, args.baseline_url, args.timeout_s,
                           log=log, ready_timeout_s=args.ready_timeout_s, more_urls=tuple(urls[1:]))
        from ops.bench.report import sglang_table
        sglang_table(result, urls, args.baseline_url, prompts, args.max_new_tokens, args.timeout_s, args, log)
        split_by_kind(result, prompts, args.target, log)
    except (ValueError, OSError, ServerError) as exc:
        raise BadInput(str(exc)) from None
    result["serve_stages"] = {"server": args.server, "baseline_server": args.baseline_server}
    write_result(Path(args.output), result)
    speed = f" | speed-up {result['speedup']:.2f}x (baseline {result['tok_s_plain']:.1f} tok/s)" \
        if result["speedup"] is not None else ""
    from ops.bench.view import cycle_words, drift_words
    cycle = cycle_words(result.get("cycle"))
    print(f"bench: engine sglang acceptance length {result['acceptance_length']:.2f} "
          f"({result['tokens']} tokens / {result['spec_verify_ct']} verify steps) | "
          f"{result['tok_s_speculative']:.1f} tok/s{speed}" + (f" | {cycle}" if cycle else ""), flush=True)
    from ops.bench.kinds import words as kind_words
    if kind_words(result.get("by_kind")):
        print(f"bench: by kind ({result['by_kind']['rule']}): {kind_words(result['by_kind'])}", flush=True)
    drift = result.get("drift")
    if result["outputs_match"] is False and isinstance(drift, dict):
        print(f"bench: {drift_words(drift)}", flush=True)
        if drift.get("verdict") == "broken":
            print(f"error: speculative output differs from the baseline's greedy output beyond numerics: "
                  f"{drift['reason']}; prompts {[m['prompt'] for m in result['mismatches']]}",
                  file=sys.stderr, flush=True)
            return 1
    elif result["outputs_match"] is False:
        print(f"error: speculative output differs from the baseline's greedy output on prompts "
              f"{[m['prompt'] for m in result['mismatches']]}", file=sys.stderr, flush=True)
        return 1
    return 0


def main(argv=None) -> int:
    """The program's exit code: bad input is 2 with its `error:` line (ops/common.run_main)."""
    return run_main(_main, argv, prog=None)


def _main(argv=None) -> int:
    args = parse_args(argv)
    if args.engine == "sglang":
        return main_sglang(args)
    if not args.drafter or not args.target:
        raise BadInput("engine reference needs --drafter and --target")
    import torch
    from transformers import AutoModelForCausalLM

    from ops import layers
    from ops.bench.speculative import SpecStats, TargetRunner, greedy, speculative
    from ops.bench.table import Decoded
    from ops.drafter.config import read_target_config
    from ops.drafter.formats import INFO_FILE, read_export

    out_dir = Path(args.output)
    try:
        tcfg = read_target_config(Path(args.target))
        arch = (tcfg.get("architectures") or ["LlamaForCausalLM"])[0]
        drafter, dcfg, fmt, ddir = read_export(Path(args.drafter), arch)
        info_path = ddir.parent / INFO_FILE
        info = json.loads(info_path.read_text()) if info_path.exists() else {}
        if args.prompts_file:
            prompts = prompts_from_file(Path(args.prompts_file), args.num_prompts, args.target)
        else:
            data = args.data or info.get("data") or info.get("samples")
            if not data:
                raise ValueError(f"no prompts: pass --data or --prompts-file ({info_path} names no data)")
            prompts = prompts_from_data(Path(data), list(info.get("holdout") or []), args.num_prompts)
        if not prompts:
            raise ValueError("no usable prompts (each needs >= 2 tokens before the answer)")
    except (ValueError, OSError) as exc:
        raise BadInput(str(exc)) from None
    if dcfg.target_vocab_size != int(tcfg.get("vocab_size", dcfg.target_vocab_size)):
        raise BadInput(f"drafter's vocab_size {dcfg.target_vocab_size} != the target's {tcfg.get('vocab_size')} "
                       f"({args.target}/config.json)")

    use_cuda = wants_cuda(args.device)
    device = torch.device("cuda" if use_cuda else "cpu")
    if args.dtype == "auto":
        dtype = torch.bfloat16 if use_cuda else torch.float32
    else:
        dtype = getattr(torch, args.dtype)
    model = AutoModelForCausalLM.from_pretrained(args.target, dtype=dtype).to(device).eval()
    drafter = drafter.to(device=device, dtype=dtype).eval()
    embed = model.get_input_embeddings().weight
    runner = TargetRunner(model, layers.hf_hidden_states_indices(dcfg.aux_layer_ids))
    eos_cfg = tcfg.get("eos_token_id")
    eos = set(eos_cfg if isinstance(eos_cfg, list) else [eos_cfg] if eos_cfg is not None else [])
    k = args.draft_tokens
    print(f"bench: {len(prompts)} prompts, {args.max_new_tokens} new tokens, K={k}, drafter {ddir} ({fmt}), "
          f"aux layers {dcfg.aux_layer_ids}, device {device}, {str(dtype).replace('torch.', '')}", flush=True)

    # Warm-up of both paths: first-call allocations and kernel selection stay out of the timing.
    greedy(runner, prompts[0][1], 4, eos)
    speculative(runner, drafter, embed, prompts[0][1], 4, k, eos, SpecStats())
    stats = SpecStats()
    t_plain = t_spec = 0.0
    fw_plain = fw_spec = tokens = completion = 0
    mismatches = []
    decoded = []
    for i, (idx, prompt) in enumerate(prompts):
        t0 = time.perf_counter()
        ref, f1 = greedy(runner, prompt, args.max_new_tokens, eos)
        t1 = time.perf_counter()
        one = SpecStats()
        got, f2 = speculative(runner, drafter, embed, prompt, args.max_new_tokens, k, eos, one)
        t2 = time.perf_counter()
        stats.add(one)
        decoded.append(Decoded(got, one.verify_forwards, one.accepted_at, one.reached))
        t_plain += t1 - t0
        t_spec += t2 - t1
        fw_plain += f1
        fw_spec += f2
        tokens += len(ref)
        completion += len(got)
        if got != ref:
            first = next((j for j, (a, b) in enumerate(zip(got, ref)) if a != b), min(len(got), len(ref)))
            mismatches.append({"prompt": idx, "first_diff": first, "greedy": ref, "speculative": got})
        print(f"progress: prompt {i + 1}/{len(prompts)} accept length "
              f"{completion / max(1, stats.verify_forwards):.2f}", flush=True)
    # SGLang's definition (completion tokens / spec_verify_ct): the prefill's token
    # counts, the bonus token of each verify step counts; compare it with a server's.
    acc_len = completion / max(1, stats.verify_forwards)
    per_pos = [a / r if r else 0.0 for a, r in zip(stats.accepted_at, stats.reached)]
    frac_pos = [a / max(1, stats.verify_forwards) for a in stats.accepted_at]
    result = {
        "drafter": str(ddir), "format": fmt, "target": str(args.target), "device": str(device),
        "dtype": str(dtype).replace("torch.", ""), "aux_layer_ids": dcfg.aux_layer_ids,
        "prompts": [idx for idx, _ in prompts], "max_new_tokens": args.max_new_tokens, "draft_tokens": k,
        "acceptance_length": acc_len, "accept_rate_per_position": per_pos,
        "accepted_fraction_per_position": frac_pos, "verify_forwards": stats.verify_forwards, "completion_tokens": completion,
        "target_forwards_plain": fw_plain, "target_forwards_speculative": fw_spec, "tokens": tokens,
        "time_plain_s": t_plain, "time_speculative_s": t_spec,
        "tok_s_plain": tokens / max(t_plain, 1e-9), "tok_s_speculative": tokens / max(t_spec, 1e-9),
        "speedup": t_plain / max(t_spec, 1e-9),
        "outputs_match": not mismatches, "mismatches": mismatches,
    }
    result["engine"] = "reference"
    from ops.bench.figures import cycle_figures
    # Timed around the decoders: wall time / verify steps, wall time / tokens (a prefill each included).
    result["cycle"] = cycle_figures([(None, stats.verify_forwards, completion, t_spec)], [(None, 0, tokens, t_plain)],
                                    k, None, None)

    def decode_at(steps: int):
        def decode(prompt: list[int]) -> Decoded:
            st = SpecStats()
            toks, _ = speculative(runner, drafter, embed, prompt, args.max_new_tokens, steps, eos, st)
            return Decoded(toks, st.verify_forwards, st.accepted_at, st.reached)
        return decode

    from ops.bench.report import reference_table
    reference_table(result, args, prompts, decoded, t_spec, decode_at, log=lambda m: print(m, flush=True))
    write_result(out_dir, result)
    print(f"bench: acceptance length {acc_len:.2f} (completion tokens / verify steps: {completion}/"
          f"{stats.verify_forwards}, K={k}) | accept/pos "
          f"[{','.join(f'{p:.2f}' for p in per_pos)}] | speed-up {result['speedup']:.2f}x "
          f"(plain {result['tok_s_plain']:.1f} tok/s, speculative {result['tok_s_speculative']:.1f} tok/s) | "
          f"greedy match {len(prompts) - len(mismatches)}/{len(prompts)}", flush=True)
    if mismatches:
        print(f"error: speculative output differs from greedy on prompts "
              f"{[m['prompt'] for m in mismatches]}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
