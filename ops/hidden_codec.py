"""Encode and decode hidden states in a storage format (ops/hidden_formats.py
says what each format is), on whatever device the states are on.

extract encodes on the GPU before the device-to-host copy (ops/extract/loop.py),
so only the format's bytes cross PCIe and reach the writers; train decodes on
the GPU after the host-to-device copy (ops/train/prefetch.py), verify on the
CPU. Every op here is row-wise: a sample's rows encode the same in any batch.
"""

from __future__ import annotations

import torch

from ops.hidden_formats import (BF16, FP8, FP8_MAX, INT4, INT4_GROUP, INT4_HEAD_STEP, INT4_SCALE_CODES, INT4_TOP,
                                SCALE_SUFFIX,
                                layout, suffixes)


# Rows encoded at once: the float32 temporaries of a 4,096-token sample of a
# 7168-wide target's aux states would be about 1.4 GB on a GPU the target fills.
ROWS = 1024


def encode(fmt: str, x: torch.Tensor, hidden: int) -> dict[str, torch.Tensor]:
    """suffix -> tensor ("" the values or codes, "_scale" fp8's scales) for
    states x [T, W] (W a multiple of hidden)."""
    if fmt == BF16:
        return {"": x}
    parts = [_encode_rows(fmt, x[i:i + ROWS], hidden) for i in range(0, x.shape[0], ROWS)]
    if len(parts) == 1:
        return parts[0]
    return {k: torch.cat([p[k] for p in parts]) for k in parts[0]}


def _encode_rows(fmt: str, x: torch.Tensor, hidden: int) -> dict[str, torch.Tensor]:
    if fmt == FP8:
        return _fp8_encode(x, hidden)
    return {"": _int4_encode(x)}


def decode(fmt: str, parts: dict[str, torch.Tensor], hidden: int, dtype: torch.dtype) -> torch.Tensor:
    """The states [..., W] in `dtype` from encode()'s parts (any leading dims)."""
    if fmt == FP8:
        return _fp8_decode(parts[""], parts[SCALE_SUFFIX], hidden, dtype)
    if fmt == INT4:
        return _int4_decode(parts[""], dtype)
    return parts[""].to(dtype)


def _fp8_encode(x: torch.Tensor, hidden: int) -> dict[str, torch.Tensor]:
    t, w = x.shape
    blocks = x.float().reshape(t, w // hidden, hidden)
    amax = blocks.abs().amax(-1, keepdim=True)
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    codes = (blocks / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return {"": codes.reshape(t, w), SCALE_SUFFIX: scale.reshape(t, w // hidden)}


def _fp8_decode(codes: torch.Tensor, scale: torch.Tensor, hidden: int, dtype: torch.dtype) -> torch.Tensor:
    lead, w = codes.shape[:-1], codes.shape[-1]
    blocks = codes.float().reshape(*lead, w // hidden, hidden) * scale.float().reshape(*lead, w // hidden, 1)
    return blocks.reshape(*lead, w).to(dtype)


def _bit_weights(device) -> torch.Tensor:
    return torch.arange(INT4_SCALE_CODES, device=device, dtype=torch.int32)


def _int4_encode(x: torch.Tensor) -> torch.Tensor:
    t, w = x.shape
    g = x.float().reshape(t, w // INT4_GROUP, INT4_GROUP)
    amax = g.abs().amax(-1)
    # The smallest scale on the grid with amax / scale <= 7 (log2(0) = -inf: the smallest).
    k = torch.ceil(8 * torch.log2(amax / INT4_TOP)) + 128
    k = torch.nan_to_num(k, nan=255.0).clamp(0, 255)
    scale = torch.exp2((k - 128) / 8).unsqueeze(-1)
    codes = (torch.round(g / scale) + 8).clamp(1, 15)
    head = (torch.round(g[..., :INT4_SCALE_CODES] / (scale * INT4_HEAD_STEP)) + 4).clamp(1, 7)
    bits = (k.to(torch.int32).unsqueeze(-1) >> _bit_weights(x.device)) & 1
    codes[..., :INT4_SCALE_CODES] = head * 2 + bits
    codes = codes.to(torch.uint8).reshape(t, w)
    return codes[:, 0::2] | (codes[:, 1::2] << 4)


def _int4_decode(packed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    lead, half = packed.shape[:-1], packed.shape[-1]
    p = packed.to(torch.int32)
    codes = torch.stack((p & 15, p >> 4), -1).reshape(*lead, half * 2 // INT4_GROUP, INT4_GROUP)
    head = codes[..., :INT4_SCALE_CODES]
    k = ((head & 1) << _bit_weights(packed.device)).sum(-1, keepdim=True)
    scale = torch.exp2((k.float() - 128) / 8)
    values = (codes.float() - 8) * scale
    values[..., :INT4_SCALE_CODES] = ((head >> 1).float() - 4) * (scale * INT4_HEAD_STEP)
    return values.reshape(*lead, half * 2).to(dtype)


def encode_states(fmt: str, states: dict[str, torch.Tensor], hidden: int) -> dict[str, torch.Tensor]:
    """{name: states} -> the file's tensors ({name + suffix: part})."""
    out = {}
    for name, x in states.items():
        for suffix, part in encode(fmt, x, hidden).items():
            out[name + suffix] = part
    return out


def decode_states(fmt: str, tensors: dict[str, torch.Tensor], names, hidden: int,
                  dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The file's (or a batch's) tensors -> {name: states in dtype} for `names`."""
    if fmt == BF16:
        return {n: tensors[n].to(dtype) for n in names}
    return {n: decode(fmt, {s: tensors[n + s] for s in suffixes(fmt)}, hidden, dtype) for n in names}


_TORCH_DTYPE = {"F8_E4M3": torch.float8_e4m3fn, "U8": torch.uint8, "F32": torch.float32}


def state_specs(fmt: str, name: str, tokens: int, width: int, hidden: int,
                dtype: torch.dtype) -> dict[str, tuple[torch.dtype, tuple[int, ...]]]:
    """name + suffix -> (torch dtype, shape) of one state's tensors in a file of `fmt`."""
    out = {}
    for suffix, (code, shape) in layout(fmt, tokens, width, hidden, "").items():
        out[name + suffix] = (dtype if fmt == BF16 else _TORCH_DTYPE[code], tuple(shape))
    return out
