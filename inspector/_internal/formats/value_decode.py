"""Stored tensor bytes decoded to numbers, for the value statistics (`check --values`).

Each dtype decodes bit for bit as the writer meant it; integers and packed 4-bit weights are
not decoded (only their raw bytes are looked at). How each dtype is decoded:
docs/architecture.md, "formats/".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

__all__ = ["Decoder", "decoder_for"]


@dataclass(frozen=True)
class Decoder:
    """How one dtype is read: element width, raw integer view, float decoding and the
    magnitudes that mark never-written memory (below `tiny`: subnormal; at or above `huge`:
    an exponent real weights never reach)."""

    itemsize: int
    word: str  # unsigned numpy view of one element (the "repeated word" test)
    decode: Callable[[np.ndarray], np.ndarray] | None  # raw words -> float32/float64
    tiny: float = 0.0
    huge: float = float("inf")


def _fp8_table(exp_bits: int, bias: int, *, fnuz: bool, inf: bool) -> np.ndarray:
    """float32 value of every byte of an FP8 format with `exp_bits` exponent bits."""
    mant_bits = 7 - exp_bits
    codes = np.arange(256, dtype=np.uint32)
    sign = np.where(codes & 0x80, -1.0, 1.0)
    exp = ((codes >> mant_bits) & ((1 << exp_bits) - 1)).astype(np.int64)
    mant = (codes & ((1 << mant_bits) - 1)).astype(np.float64)
    normal = (1.0 + mant / (1 << mant_bits)) * np.exp2(exp - bias)
    subnormal = (mant / (1 << mant_bits)) * np.exp2(1 - bias)
    value = sign * np.where(exp == 0, subnormal, normal)
    top = exp == (1 << exp_bits) - 1
    if fnuz:
        value[0x80] = np.nan  # the single NaN code; no -0, no Inf
    elif inf:  # E5M2: IEEE-like top exponent
        value[top & (mant == 0)] = sign[top & (mant == 0)] * np.inf
        value[top & (mant != 0)] = np.nan
    else:  # E4M3FN: only S.1111.111 is NaN, no Inf
        value[(codes & 0x7F) == 0x7F] = np.nan
    return value.astype(np.float32)


def _e8m0_table() -> np.ndarray:
    value = np.exp2(np.arange(256, dtype=np.float64) - 127)
    value[0xFF] = np.nan
    return value.astype(np.float32)


def _lookup(table: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    return lambda raw: table[raw]


def _bf16(raw: np.ndarray) -> np.ndarray:
    # The word as the high half of a float32 (little-endian pairs of 16-bit halves): one
    # strided copy, three times faster than widening and shifting.
    pairs = np.zeros((*raw.shape, 2), np.uint16)
    pairs[..., 1] = raw
    return pairs.view(np.float32).reshape(raw.shape)


_E4M3 = _fp8_table(4, 7, fnuz=False, inf=False)
_E5M2 = _fp8_table(5, 15, fnuz=False, inf=True)
_E4M3FNUZ = _fp8_table(4, 8, fnuz=True, inf=False)
_E5M2FNUZ = _fp8_table(5, 16, fnuz=True, inf=False)
_E8M0 = _e8m0_table()

_F32_TINY = float(np.finfo(np.float32).tiny)
_DECODERS: dict[str, Decoder] = {
    "BF16": Decoder(2, "<u2", _bf16, tiny=_F32_TINY, huge=1e30),
    "F16": Decoder(2, "<u2", lambda raw: raw.view("<f2").astype(np.float32), 2.0**-14, 1e4),
    "F32": Decoder(4, "<u4", lambda raw: raw.view("<f4"), tiny=_F32_TINY, huge=1e30),
    "F64": Decoder(8, "<u8", lambda raw: raw.view("<f8"), float(np.finfo(np.float64).tiny), 1e30),
    "F8_E4M3": Decoder(1, "u1", _lookup(_E4M3), tiny=2.0**-6),
    "F8_E5M2": Decoder(1, "u1", _lookup(_E5M2), tiny=2.0**-14),
    "F8_E4M3FNUZ": Decoder(1, "u1", _lookup(_E4M3FNUZ), tiny=2.0**-7),
    "F8_E5M2FNUZ": Decoder(1, "u1", _lookup(_E5M2FNUZ), tiny=2.0**-15),
    "F8_E8M0": Decoder(1, "u1", _lookup(_E8M0)),
}
_RAW = {1: "u1", 2: "<u2", 4: "<u4", 8: "<u8"}
_INT_WIDTH = {"U8": 1, "I8": 1, "BOOL": 1, "I16": 2, "U16": 2, "I32": 4, "U32": 4}
_INT_WIDTH |= {"I64": 8, "U64": 8, "F4": 1, "F6_E2M3": 1, "F6_E3M2": 1, "C64": 8}
_UNDECODED = {width: Decoder(width, word, None) for width, word in _RAW.items()}


def decoder_for(name: str, dtype: str) -> Decoder | None:
    """How to read tensor `name` of safetensors `dtype` (None: a dtype we do not know)."""
    if dtype == "U8" and name.endswith("scales"):
        return _DECODERS["F8_E8M0"]  # MXFP4 block scales: E8M0 stored as uint8
    if dtype in _DECODERS:
        return _DECODERS[dtype]
    width = _INT_WIDTH.get(dtype)
    return None if width is None else _UNDECODED[width]
