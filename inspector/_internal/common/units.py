"""Sizes: parsing "5GB", printing byte counts, and the split size checkpoints are cut at.

Checkpoint tools size shards in decimal units (huggingface_hub's `max_shard_size="5GB"` is
5 * 10**9 bytes), so the project prints decimal units only; binary units (GiB) are accepted
when parsing. Every byte count the project shows goes through `format_bytes`, so one
checkpoint never reads "4.1 GB" in one place and "3.8 GiB" in another.
"""

from __future__ import annotations

import math
import re

__all__ = [
    "DECIMAL_UNITS",
    "SHARD_SPLIT_SIZE",
    "SINGLE_FILE_SIZE",
    "format_bytes",
    "format_count",
    "parse_size",
    "scale_for",
]

# huggingface_hub's default `max_shard_size` ("5GB", decimal): transformers, the DCP
# consolidators and Model-Optimizer split shards at this size.
SHARD_SPLIT_SIZE = 5 * 10**9
# transformers 5's default `max_shard_size` ("50GB", `PreTrainedModel.save_pretrained`): under
# it a model is saved as one model.safetensors and no index.
SINGLE_FILE_SIZE = 50 * 10**9

DECIMAL_UNITS = ("B", "kB", "MB", "GB", "TB", "PB")
_FACTORS = {
    "": 1,
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "PB": 10**15,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
    "TIB": 2**40,
    "PIB": 2**50,
}
_SIZE = re.compile(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*")


def parse_size(value: int | str) -> int:
    """Bytes of a size written like `max_shard_size`: "5GB" = 5 * 10**9, "5GiB" = 5 * 2**30,
    "500MB", "1.5KB", or an int. Raises ValueError naming the value and the accepted forms."""
    if isinstance(value, bool):
        raise ValueError(f"size {value!r} is not a number of bytes")
    if isinstance(value, int):
        if value <= 0:
            raise ValueError(f"size {value} must be positive")
        return value
    match = _SIZE.fullmatch(value)
    unit = match.group(2).upper() if match else None
    if match is None or unit not in _FACTORS:
        raise ValueError(f"cannot read size {value!r}; expected e.g. 5GB, 500MB, 2GiB or bytes")
    size = int(float(match.group(1)) * _FACTORS[unit])
    if size <= 0:
        raise ValueError(f"size {value!r} must be positive")
    return size


def format_bytes(n: float, *, digits: int = 1) -> str:
    """'4.1 GB' (decimal); whole bytes below 1 kB."""
    value = float(n)
    if not math.isfinite(value):
        return f"{value} B"
    for unit in DECIMAL_UNITS:
        if abs(value) < 1000 or unit == DECIMAL_UNITS[-1]:
            return f"{int(value)} B" if unit == "B" else f"{value:.{digits}f} {unit}"
        value /= 1000
    raise AssertionError("unreachable")


# Past this a count cannot be real (more elements than any storage holds): printed by its
# order of magnitude. Python refuses to print ints over 4300 digits, and a hostile shape such
# as [2**40] * 400 multiplies out to 4,817 digits.
_COUNT_LIMIT = 10**30


def format_count(n: int) -> str:
    """`1,234,567`, or `more than 10^4816` for a count no checkpoint can hold (a hostile
    shape multiplied out): never fails, never prints thousands of digits."""
    if -_COUNT_LIMIT < n < _COUNT_LIMIT:
        return f"{n:,}"
    digits = int((abs(n).bit_length() - 1) * math.log10(2))
    return f"{'-' if n < 0 else ''}more than 10^{digits}"


def scale_for(largest: float) -> tuple[float, str]:
    """(divisor, unit) that shows `largest` as a number between 1 and 1000: for axes and table
    columns, where every value of a series must share one unit."""
    divisor = 1.0
    for unit in DECIMAL_UNITS:
        if abs(largest) < 1000 * divisor or unit == DECIMAL_UNITS[-1]:
            return divisor, unit
        divisor *= 1000
    raise AssertionError("unreachable")
