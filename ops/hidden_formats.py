"""The storage formats of extracted hidden states, readable without torch.

What each format puts in a sample file (the tensors' names, dtypes and
shapes), its bytes an element, the error its round trip adds, and what
data_config.json records of it. extract writes a format (ops/hidden_codec.py
encodes on the device), verify checks headers against it, train and verify
decode it (hidden_codec.decode), the disk estimate counts its bytes.

- bf16: the states as the forward made them, in the run's dtype (bfloat16 for
  the real targets): 2 B an element.
- fp8: float8 e4m3 values, each token row of each captured layer (a block of
  hidden_size elements) scaled by its own float32 factor (its largest
  magnitude / 448, e4m3's largest value) in `<name>_scale` [T, blocks]:
  1 + 4 / hidden_size B an element. A scale per layer block, not per row of
  the concatenated aux tensor: the captured layers' magnitudes differ by
  orders (an early layer against a late one), and one shared scale would push
  the small layer into e4m3's subnormals.
- int4: 4-bit codes, two a byte (low nibble first), of groups of 32 elements
  with one 8-bit log scale each (2^((k - 128) / 8): 1/8-octave steps over
  2^-16 .. 2^16), carried in the low bit of the group's first 8 codes, which
  are 3-bit codes for it: exactly 0.5 B an element, scales included. Why this
  design: per-group scales keep the outlier channels of hidden states (a few
  dimensions 100x the rest) from flattening a whole row (a row scale would
  send the other dimensions to zero; a Hadamard rotation spreads the outlier
  but leaves every coordinate riding on it), 32 elements are what the MX
  formats group, and taking the scale's bits from 8 of the 32 codes is what
  keeps the format at 0.5 B instead of MXFP4's 0.53. Levels are uniform with
  a zero ((c - 8) x scale, c in 1..15; the 3-bit ones (c - 4) x 7/3 x scale):
  the small values of a group that holds an outlier decode to zero, not to
  half a step (which made a mid-rise grid 0.47 off there against 0.05).
"""

from __future__ import annotations

from ops.common import BadInput

BF16, FP8, INT4 = "bf16", "fp8", "int4"
FORMATS = (BF16, FP8, INT4)
DEFAULT = BF16
FP8_MAX = 448.0
INT4_GROUP = 32
INT4_SCALE_CODES = 8            # codes of a group whose low bit carries its scale
INT4_TOP = 7                    # the largest level, in scales: levels -7..7 (code 0 unused)
INT4_HEAD_STEP = 7 / 3          # the 3-bit codes' step, in scales: levels -7..7 in 7 steps
STATE_KEYS = ("aux_hidden_states", "final_hidden_states")
SCALE_SUFFIX = "_scale"
SAFETENSORS_DTYPE = {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}

# Bound on a tensor's relative (Frobenius) error after a round trip through the
# format, for states of any scale, with or without outlier channels
# (tests/test_hidden_formats.py: fp8 0.025 on Gaussian rows, 0.002 on rows with
# 100x channels; int4 0.15 and 0.08). verify's recompute tolerance adds it to the engine's.
_REL_ERROR = {BF16: 0.0, FP8: 0.04, INT4: 0.2}


class BadFormat(BadInput):
    """An unknown format, or a file in another format than its output declares.
    The console's code for bad input (3), also when the op itself finds it."""

    exit_code = 3


def check_name(fmt: object, where: str) -> str:
    if fmt not in FORMATS:
        raise BadFormat(f"{where}: format {fmt!r} is not one of {', '.join(FORMATS)}")
    return str(fmt)


def config_format(config: dict, where: str) -> str:
    """The format a data_config.json declares (none: bf16, what every older output holds)."""
    return check_name(config.get("format", DEFAULT), f"{where}: key 'format'")


def file_format(header: dict) -> str:
    """The format a sample file's safetensors header says it holds (no metadata: bf16)."""
    meta = header.get("__metadata__")
    fmt = meta.get("format") if isinstance(meta, dict) else None
    return fmt if fmt is not None else BF16


def file_metadata(fmt: str) -> dict[str, str] | None:
    """The header metadata a sample file of `fmt` carries (bf16: none, so its
    bytes are those every earlier run wrote)."""
    return None if fmt == BF16 else {"format": fmt}


def relative_error(fmt: str) -> float:
    """The relative error a round trip through `fmt` may add to a state tensor."""
    return _REL_ERROR[fmt]


def width_problem(fmt: str, hidden: int) -> str | None:
    """Why a hidden size cannot be stored in `fmt`, or None."""
    if fmt == INT4 and hidden % INT4_GROUP:
        return f"int4 needs a hidden_size divisible by {INT4_GROUP}, the target's is {hidden}"
    return None


def element_bytes(fmt: str, dtype_bytes: int, hidden: int) -> float:
    """Bytes an element of the states, scales included."""
    if fmt == FP8:
        return 1 + 4 / hidden
    if fmt == INT4:
        return 0.5
    return float(dtype_bytes)


def state_bytes(fmt: str, tokens: int, states: int, hidden: int, dtype_bytes: int) -> int:
    """Bytes of `tokens` rows of `states` captured states of `hidden` elements."""
    if fmt == FP8:
        return tokens * states * (hidden + 4)
    if fmt == INT4:
        return tokens * states * hidden // 2
    return tokens * states * hidden * dtype_bytes


def describe(fmt: str, dtype: str) -> str:
    """The format in a few words, with its bytes an element."""
    if fmt == FP8:
        return "fp8 (e4m3, a float32 scale per token row of each layer)"
    if fmt == INT4:
        return f"int4 (4-bit codes, an 8-bit log scale per {INT4_GROUP} elements in the codes: 0.5 B an element)"
    return f"bf16 ({dtype} as computed)"


def stored_as(config: dict) -> str:
    """The format a data_config.json says its states are in, in words: bf16
    stores them as computed, in the run's dtype, so a float32 target's are
    float32 (said "bf16" alone, they read as bfloat16). No format: bf16."""
    fmt, dtype = config.get("format"), config.get("dtype")
    fmt = DEFAULT if fmt is None else str(fmt)
    if fmt == BF16 and isinstance(dtype, str) and dtype not in ("bfloat16", "bf16"):
        return f"bf16 (stored as computed: {dtype})"
    return fmt


def format_params(fmt: str, hidden: int) -> dict:
    """What data_config.json records of the format beside its name."""
    if fmt == FP8:
        return {"values": "float8_e4m3fn", "scale": "float32", "scale_block": hidden,
                "scale_rule": "largest magnitude of the block / 448", "scale_key_suffix": SCALE_SUFFIX}
    if fmt == INT4:
        return {"codes": "uint8, two 4-bit codes a byte, low nibble first", "group": INT4_GROUP,
                "levels": "(c - 8) x scale; the group's first 8 codes 3-bit: ((c >> 1) - 4) x 7/3 x scale",
                "scale": "2^((k - 128) / 8), k = the low bits of the group's first 8 codes, first = bit 0",
                "bytes_per_element": 0.5}
    return {}


def layout(fmt: str, tokens: int, width: int, hidden: int, dtype: str) -> dict[str, tuple[str, list[int]]]:
    """key -> (safetensors dtype, shape) of one state tensor `width` wide, by its
    own name "" and its scale's "_scale" (the caller prefixes the state's name)."""
    if fmt == FP8:
        return {"": ("F8_E4M3", [tokens, width]), SCALE_SUFFIX: ("F32", [tokens, width // hidden])}
    if fmt == INT4:
        return {"": ("U8", [tokens, width // 2])}
    return {"": (SAFETENSORS_DTYPE.get(dtype, "BF16"), [tokens, width])}


def suffixes(fmt: str) -> tuple[str, ...]:
    """The suffixes of one state's tensors in a file of `fmt`."""
    return ("", SCALE_SUFFIX) if fmt == FP8 else ("",)


def stored_width(fmt: str, shape_width: int) -> int:
    """The state's width from its stored tensor's width."""
    return shape_width * 2 if fmt == INT4 else shape_width
