"""Floating-point casts between F16, BF16, F32 and F64 in numpy, bit for bit like torch's `.to()`.

Consolidation changes dtypes without importing torch, so the rounding must be torch's, not
merely close (the rules, NaN payloads included: docs/architecture.md, "formats/"). Inputs
and outputs are raw little-endian bytes (uint8 arrays): callers never need a BF16 dtype.
"""

from __future__ import annotations

import numpy as np

from inspector._internal.common.dtypes import FLOAT_DTYPES

__all__ = ["CAST_TARGETS", "cast_bytes", "dtype_for_target"]

# CLI / API spelling -> safetensors dtype.
CAST_TARGETS: dict[str, str] = {"bf16": "BF16", "fp16": "F16", "fp32": "F32"}


def dtype_for_target(target: str) -> str:
    """The safetensors dtype of a `dtype=` option ("bf16", "fp16", "fp32", or "BF16"...)."""
    key = target.lower().replace("float", "fp").replace("bfloat", "bf")
    if key in CAST_TARGETS:
        return CAST_TARGETS[key]
    if target.upper() in ("BF16", "F16", "F32"):
        return target.upper()
    raise ValueError(f"unknown target dtype {target!r}; expected one of bf16, fp16, fp32")


def cast_bytes(raw: np.ndarray, src: str, dst: str) -> np.ndarray:
    """`raw` (uint8, whole elements of `src`) converted to `dst`, as a new uint8 array."""
    if src not in FLOAT_DTYPES or dst not in FLOAT_DTYPES:
        raise ValueError(f"cannot cast {src} to {dst}: only F16, BF16, F32, F64 are cast")
    if src == dst:
        return raw.copy()
    # NaN and overflow are legitimate inputs here; numpy's warnings about them are noise.
    with np.errstate(over="ignore", invalid="ignore"):
        return _cast(raw, src, dst)


def _cast(raw: np.ndarray, src: str, dst: str) -> np.ndarray:
    if dst == "F64":
        out = _to_f32(raw, src).astype("<f8")
    else:
        # Narrowing from F64 goes through F32 first, exactly as torch does.
        f32 = _f64_to_f32(raw) if src == "F64" else _to_f32(raw, src)
        if dst == "F32":
            out = f32
        elif dst == "F16":
            out = _f32_to_f16(f32)
        else:
            out = _f32_to_bf16(f32, nan_bits=0x7FC0 if src == "F16" else 0xFFFF)
    return out.view(np.uint8).reshape(-1)


def _f64_to_f32(raw: np.ndarray) -> np.ndarray:
    return raw.view("<f8").astype("<f4")


def _to_f32(raw: np.ndarray, src: str) -> np.ndarray:
    """Exact widening of F16/BF16/F32 bytes to float32."""
    if src == "F32":
        return raw.view("<f4")
    if src == "F16":
        f32 = raw.view("<f2").astype("<f4")
        nan = np.isnan(f32)
        if nan.any():
            # The CPU's conversion quiets signalling NaNs; numpy keeps them as they are.
            f32.view("<u4")[nan] |= 0x00400000
        return f32
    # BF16 is the top half of an F32: shifting the bits back is exact, NaN payloads included.
    return (raw.view("<u2").astype("<u4") << 16).view("<f4")


def _f32_to_bf16(f32: np.ndarray, *, nan_bits: int) -> np.ndarray:
    bits = f32.view("<u4")
    # Round to nearest even on the 16 dropped bits: add 0x7FFF plus the kept lowest bit.
    rounded = ((bits + (0x7FFF + ((bits >> 16) & 1))) >> 16).astype("<u2")
    nan = np.isnan(f32)
    if nan.any():
        rounded[nan] = nan_bits
    return rounded


def _f32_to_f16(f32: np.ndarray) -> np.ndarray:
    half = f32.astype("<f2").view("<u2")
    nan = np.isnan(f32)
    if nan.any():
        bits = f32.view("<u4")[nan]
        # Quiet NaN, sign and top 9 payload bits kept, like the hardware conversion torch uses.
        half[nan] = ((bits >> 16) & 0x8000) | 0x7E00 | ((bits >> 13) & 0x3FF)
    return half
