"""checkpoint-inspector: scan, check and repair large model checkpoints from their headers."""

from inspector.checks import check
from inspector.errors import CannotInspectError, InspectorError
from inspector.findings import Finding, Severity, findings_to_frame
from inspector.model import ScannedCheckpoint
from inspector.scan import scan

__all__ = [
    "CannotInspectError",
    "Finding",
    "InspectorError",
    "ScannedCheckpoint",
    "Severity",
    "check",
    "findings_to_frame",
    "scan",
]

__version__ = "0.1.0"
