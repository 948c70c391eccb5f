"""Every dtype fact in one place: safetensors dtypes and their widths, torch dtype names, and
the numpy views the data readers (`--deep`, casting) use. See docs/formats.md.

Nothing here reads files; the tables are plain constants.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

__all__ = [
    "DTYPE_BITS",
    "FLOAT_DTYPES",
    "FLOAT_VIEWS",
    "KV_CACHE_DTYPES",
    "NONFINITE_BITS",
    "QUANT_DTYPES",
    "STORAGE_DTYPES",
    "TORCH_DTYPES",
    "nbytes_for",
    "torch_itemsize",
]

# safetensors dtype -> bits per element. Sub-byte dtypes (F4, F6) pack several elements per
# byte; a tensor of them must still fill whole bytes.
DTYPE_BITS: Mapping[str, int] = MappingProxyType(
    {
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
)

# Floating dtypes a cast may touch; packed/8-bit float formats are left alone on purpose.
FLOAT_DTYPES = frozenset({"F16", "BF16", "F32", "F64"})

# Packed or 8-bit float storage that only a quantized module uses (U8 holds packed FP4).
QUANT_DTYPES = frozenset(
    {
        "U8",
        "F4",
        "F6_E2M3",
        "F6_E3M2",
        "F8_E5M2",
        "F8_E4M3",
        "F8_E8M0",
        "F8_E4M3FNUZ",
        "F8_E5M2FNUZ",
    }
)

# numpy dtypes that read these safetensors dtypes directly (little-endian).
FLOAT_VIEWS: Mapping[str, str] = MappingProxyType({"F16": "<f2", "F32": "<f4", "F64": "<f8"})

# Float formats numpy has no dtype for: (unsigned view, mask, value); an element is NaN or Inf
# when `(bits & mask) == value` (all exponent bits set, or the single NaN code of FNUZ/E8M0).
NONFINITE_BITS: Mapping[str, tuple[str, int, int]] = MappingProxyType(
    {
        "BF16": ("<u2", 0x7F80, 0x7F80),
        "F8_E5M2": ("u1", 0x7C, 0x7C),
        "F8_E4M3": ("u1", 0x7F, 0x7F),
        "F8_E4M3FNUZ": ("u1", 0xFF, 0x80),
        "F8_E5M2FNUZ": ("u1", 0xFF, 0x80),
        "F8_E8M0": ("u1", 0xFF, 0xFF),
    }
)

# torch dtype name -> (safetensors dtype name or None, bytes per element). Only names in this
# table are accepted as `torch.<name>` globals by the restricted unpickler; aliases (`float`,
# `half`, `long`) are listed because older writers may pickle them.
TORCH_DTYPES: Mapping[str, tuple[str | None, int]] = MappingProxyType(
    {
        "bool": ("BOOL", 1),
        "uint8": ("U8", 1),
        "int8": ("I8", 1),
        "uint16": ("U16", 2),
        "int16": ("I16", 2),
        "short": ("I16", 2),
        "uint32": ("U32", 4),
        "int32": ("I32", 4),
        "int": ("I32", 4),
        "uint64": ("U64", 8),
        "int64": ("I64", 8),
        "long": ("I64", 8),
        "float16": ("F16", 2),
        "half": ("F16", 2),
        "bfloat16": ("BF16", 2),
        "float32": ("F32", 4),
        "float": ("F32", 4),
        "float64": ("F64", 8),
        "double": ("F64", 8),
        "complex64": ("C64", 8),
        "cfloat": ("C64", 8),
        "complex32": (None, 4),
        "chalf": (None, 4),
        "complex128": (None, 16),
        "cdouble": (None, 16),
        "float8_e4m3fn": ("F8_E4M3", 1),
        "float8_e5m2": ("F8_E5M2", 1),
        "float8_e4m3fnuz": ("F8_E4M3FNUZ", 1),
        "float8_e5m2fnuz": ("F8_E5M2FNUZ", 1),
        "float8_e8m0fnu": ("F8_E8M0", 1),
        # Two FP4 values packed per byte: torch counts one element per byte.
        "float4_e2m1fn_x2": (None, 1),
        "qint8": (None, 1),
        "quint8": (None, 1),
        "qint32": (None, 4),
        "quint4x2": (None, 1),
        "quint2x4": (None, 1),
        **{f"bits{n}": (None, 1) for n in ("8", "1x8", "2x4", "4x2")},
        "bits16": (None, 2),
        **{f"uint{n}": (None, 1) for n in range(1, 8)},
        **{f"int{n}": (None, 1) for n in range(1, 8)},
    }
)

# torch storage class -> torch dtype name: the typed storages a `torch.save` file names
# (torch/storage.py's legacy classes, which `torch.save` still pickles).
STORAGE_DTYPES: Mapping[str, str] = MappingProxyType(
    {
        "FloatStorage": "float32",
        "DoubleStorage": "float64",
        "HalfStorage": "float16",
        "BFloat16Storage": "bfloat16",
        "LongStorage": "int64",
        "IntStorage": "int32",
        "ShortStorage": "int16",
        "CharStorage": "int8",
        "ByteStorage": "uint8",
        "BoolStorage": "bool",
        "ComplexFloatStorage": "complex64",
        "ComplexDoubleStorage": "complex128",
    }
)

# The KV cache dtypes an engine can be asked for (vLLM's `--kv-cache-dtype`, its
# `CacheConfig.cache_dtype`; SGLang's `--kv-cache-dtype` takes the same names) -> bytes per
# element. "auto" is the dtype the model is served in, 16 bits whatever config.json names:
# vLLM's `_get_and_verify_dtype` serves a float32 checkpoint in float16 or bfloat16.
KV_CACHE_DTYPES: Mapping[str, int] = MappingProxyType(
    {"auto": 2, "bfloat16": 2, "float16": 2, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}
)

# Bytes per element of a dtype as torch_dist metadata names it: the safetensors name when
# there is one, else "torch.<name>".
_TORCH_ITEMSIZE = {st or f"torch.{name}": size for name, (st, size) in TORCH_DTYPES.items()}


def nbytes_for(dtype: str, numel: int) -> int | None:
    """Bytes for `numel` elements of `dtype`, or None if unknown or not a whole byte count."""
    bits = DTYPE_BITS.get(dtype)
    if bits is None:
        return None
    total = numel * bits
    return total // 8 if total % 8 == 0 else None


def torch_itemsize(dtype: str) -> int:
    """Bytes per element of a torch_dist tensor's dtype (0 when unknown)."""
    return _TORCH_ITEMSIZE.get(dtype, 0)
