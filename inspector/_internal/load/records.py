"""What both halves of the load check share: a stored tensor as the loader sees it, a shape
the model disagrees with, and the exception that ends the check with its reason. Imports
nothing of the project, so the verdict (`inspector._internal.load.verdict`) and the
quantization view (`inspector._internal.load.quant_view`) both build on it.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["LoadSkipped", "ShapeMismatch", "Stored"]


# A stored tensor as the loader sees it: (safetensors dtype, shape).
Stored = tuple[str, tuple[int, ...]]


@dataclass(frozen=True, slots=True)
class ShapeMismatch:
    """A key the model has, whose stored shape (after conversion) is not the model's."""

    key: str
    stored: tuple[int, ...]
    expected: tuple[int, ...]


class LoadSkipped(Exception):
    """The check cannot run; the message is the verdict's `skipped` reason."""
