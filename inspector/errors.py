"""The project's exceptions. Scans turn problems into findings; these are for the rest.

Messages name the file, the bad value, what was expected and what to do.
"""

from __future__ import annotations

__all__ = ["CannotInspectError", "InspectorError", "PlanRefusedError", "UnsafeInputError"]


class InspectorError(Exception):
    """Base class of every error this package raises on purpose."""


class CannotInspectError(InspectorError):
    """The path cannot be inspected at all (missing, empty, not a checkpoint)."""


class UnsafeInputError(InspectorError):
    """A file asked for something we refuse to do (execute code, leave the folder)."""


class PlanRefusedError(InspectorError):
    """A repair or consolidation plan cannot decide something without a user policy."""
