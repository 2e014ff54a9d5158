"""One sample file of an extract output against what its data_config.json
declares, from the header alone (no tensor data read): the header parses,
the file is as long as the header says, the keys, dtypes and shapes agree
with each other and with data_config, the token count with
sample_lengths.json.

Below the stages: verify's header pass (ops/verify/check.py) and a resumed
extract's check of what is already on disk (ops/extract/run.py) judge a file
by the same rules. The layout is shared/DESIGN.md's, read through
ops/formats.py and ops/hidden_formats.py.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from ops import hidden_formats
from ops.formats import SAMPLE_LENGTHS, BadSampleFile, check_whole
from ops.hidden_formats import SAFETENSORS_DTYPE, STATE_KEYS, file_format

SAMPLE_KEYS = ("input_ids", "loss_mask", "aux_hidden_states", "final_hidden_states")
LOSS_MASK_DTYPES = ("U8", "I64", "BOOL")
# How check_header's reason for a file of another format begins (a resumed
# extract refuses such a file instead of rewriting it).
FORMAT_MISMATCH = "format "


@dataclass
class Expected:
    hidden_size: int | None
    aux_layers: int | None
    dtype: str | None           # safetensors dtype code, e.g. "BF16"
    format: str = hidden_formats.DEFAULT


def expected_from(config: dict | None, where: str = "data_config.json") -> Expected:
    """What data_config.json says the files hold; BadFormat for a format this tool does not know."""
    if not config:
        return Expected(None, None, None)
    dtype = config.get("dtype")
    ids = config.get("layer_ids")
    return Expected(hidden_size=config.get("hidden_size"),
                    aux_layers=len(ids) if isinstance(ids, list) else None,
                    dtype=SAFETENSORS_DTYPE.get(str(dtype).replace("torch.", "")) if dtype else None,
                    format=hidden_formats.config_format(config, where))


def check_header(header: dict, exp: Expected) -> tuple[int | None, str | None]:
    """(tokens, None) for a sample whose header is consistent, else (None, reason)."""
    fmt = file_format(header)
    if fmt != exp.format:
        return None, f"{FORMAT_MISMATCH}{fmt!r} in the file's header, data_config.json declares {exp.format!r}"
    if exp.format != hidden_formats.BF16:
        return _check_encoded(header, exp)
    wrong = _keys_problem(header, SAMPLE_KEYS)
    if wrong:
        return None, wrong
    shapes = {k: header[k].get("shape") for k in SAMPLE_KEYS}
    dtypes = {k: header[k].get("dtype") for k in SAMPLE_KEYS}
    t, reason = _ids_and_mask(header)
    if reason:
        return None, reason
    final, aux = shapes["final_hidden_states"], shapes["aux_hidden_states"]
    h = exp.hidden_size or (final[1] if isinstance(final, list) and len(final) == 2 else None)
    if final != [t, h]:
        return None, f"final_hidden_states shape {final}, expected [{t}, {h}]"
    if exp.aux_layers is not None:
        if aux != [t, exp.aux_layers * h]:
            return None, (f"aux_hidden_states shape {aux}, expected [{t}, {exp.aux_layers * h}] "
                          f"({exp.aux_layers} layers x hidden {h})")
    elif not (isinstance(aux, list) and len(aux) == 2 and aux[0] == t and aux[1] % h == 0):
        return None, f"aux_hidden_states shape {aux}, expected [{t}, k x {h}]"
    for key in ("aux_hidden_states", "final_hidden_states"):
        if exp.dtype and dtypes[key] != exp.dtype:
            return None, f"{key} dtype {dtypes[key]}, expected {exp.dtype} (data_config dtype)"
    if dtypes["aux_hidden_states"] != dtypes["final_hidden_states"]:
        return None, (f"aux_hidden_states is {dtypes['aux_hidden_states']} but final_hidden_states "
                      f"{dtypes['final_hidden_states']}")
    return t, None


def _keys_problem(header: dict, wanted: Sequence[str]) -> str | None:
    """The tensors missing from the header, or else those it holds beyond `wanted`; None when neither."""
    missing = [k for k in wanted if k not in header]
    if missing:
        return f"missing tensor(s) {missing}"
    extra = sorted(k for k in header if k not in wanted and k != "__metadata__")
    if extra:
        return f"unexpected tensor(s) {extra}"
    return None


def _ids_and_mask(header: dict) -> tuple[int | None, str | None]:
    ids = header["input_ids"].get("shape")
    if not isinstance(ids, list) or len(ids) != 1 or ids[0] < 1:
        return None, f"input_ids shape {ids}, expected [T] with T >= 1"
    t = ids[0]
    if header["input_ids"].get("dtype") != "I64":
        return None, f"input_ids dtype {header['input_ids'].get('dtype')}, expected I64"
    if header["loss_mask"].get("shape") != [t]:
        return None, f"loss_mask shape {header['loss_mask'].get('shape')}, expected [{t}] like input_ids"
    if header["loss_mask"].get("dtype") not in LOSS_MASK_DTYPES:
        return None, f"loss_mask dtype {header['loss_mask'].get('dtype')}, expected one of {list(LOSS_MASK_DTYPES)}"
    return t, None


def _check_encoded(header: dict, exp: Expected) -> tuple[int | None, str | None]:
    """A file of an encoded format: every tensor the format lays out, of its dtype and shape."""
    fmt = exp.format
    names = [n + s for n in STATE_KEYS for s in hidden_formats.suffixes(fmt)]
    wrong = _keys_problem(header, ["input_ids", "loss_mask", *names])
    if wrong:
        return None, wrong
    t, reason = _ids_and_mask(header)
    if reason:
        return None, reason
    final = header["final_hidden_states"].get("shape")
    h = exp.hidden_size or (hidden_formats.stored_width(fmt, final[1])
                            if isinstance(final, list) and len(final) == 2 else None)
    if not h:
        return None, f"final_hidden_states shape {final}, expected [{t}, hidden]"
    aux_width = (exp.aux_layers or 0) * h
    if not exp.aux_layers:
        aux = header["aux_hidden_states"].get("shape")
        aux_width = hidden_formats.stored_width(fmt, aux[1]) if isinstance(aux, list) and len(aux) == 2 else 0
        if aux_width <= 0 or aux_width % h:
            return None, f"aux_hidden_states shape {aux}, expected [{t}, k x {h}] in {fmt}"
    for name, width in (("aux_hidden_states", aux_width), ("final_hidden_states", h)):
        for suffix, (dtype, shape) in hidden_formats.layout(fmt, t, width, h, "").items():
            got = header[name + suffix]
            if got.get("dtype") != dtype or got.get("shape") != shape:
                return None, (f"{name + suffix} is {got.get('dtype')} {got.get('shape')}, expected {dtype} {shape} "
                              f"({fmt}, hidden {h})")
    return t, None


def _check_file(path: str, exp: Expected, tokens: int | None) -> tuple[int | None, str | None]:
    try:
        header = check_whole(Path(path))
    except BadSampleFile as exc:
        return None, str(exc).removeprefix(f"{path}: ")
    found, reason = check_header(header, exp)
    if reason is None and tokens is not None and found != tokens:
        return None, f"{found} tokens, {SAMPLE_LENGTHS} says {tokens}"
    return found, reason


def check_files(paths: dict[int, str], exp: Expected, lengths: dict[int, int] | None = None,
                workers: int = 8) -> Iterator[tuple[int, str, int | None, str | None]]:
    """(idx, path, tokens, None) for each sample file whose header is whole and
    consistent (with `exp`, and with lengths[idx] where given), else (idx, path,
    None, reason); in index order. Headers only: no tensor data is read.
    verify's header pass and a resumed extract's check of what is on disk."""
    order = sorted(paths)
    want = lengths or {}
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        results = pool.map(lambda i: _check_file(paths[i], exp, want.get(i)), order, chunksize=64)
        for idx, (tokens, reason) in zip(order, results):
            yield idx, paths[idx], tokens, reason
