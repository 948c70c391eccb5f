"""The safetensors dtypes and their bit widths (FORMATS.md section 1)."""

from __future__ import annotations

__all__ = ["DTYPE_BITS", "FLOAT_DTYPES", "nbytes_for"]

DTYPE_BITS: dict[str, int] = {
    "BOOL": 8,
    "U8": 8,
    "I8": 8,
    "F8_E5M2": 8,
    "F8_E4M3": 8,
    "F8_E8M0": 8,
    "F8_E4M3FNUZ": 8,
    "F8_E5M2FNUZ": 8,
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
    "I16": 16,
    "U16": 16,
    "F16": 16,
    "BF16": 16,
    "I32": 32,
    "U32": 32,
    "F32": 32,
    "I64": 64,
    "U64": 64,
    "F64": 64,
    "C64": 64,
}

# Floating dtypes a cast may touch; packed/8-bit float formats are left alone on purpose.
FLOAT_DTYPES = frozenset({"F16", "BF16", "F32", "F64"})


def nbytes_for(dtype: str, numel: int) -> int | None:
    """Bytes for `numel` elements of `dtype`, or None if unknown or not a whole byte count."""
    bits = DTYPE_BITS.get(dtype)
    if bits is None:
        return None
    total = numel * bits
    return total // 8 if total % 8 == 0 else None
