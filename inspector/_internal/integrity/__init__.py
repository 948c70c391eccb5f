"""Integrity: are a checkpoint's bytes what was recorded? The content manifest
(`write_manifest`, `ckpt-inspect manifest`) and `verify` against a manifest, a Hugging Face
repository's own listing or another checkpoint, at level size, hash or tensor
(docs/verify.md)."""

from inspector._internal.integrity.manifest import Manifest, ManifestError, parse_manifest
from inspector._internal.integrity.verify import (
    LEVELS,
    Level,
    Verification,
    build_manifest,
    verify,
    write_manifest,
)

__all__ = [
    "LEVELS",
    "Level",
    "Manifest",
    "ManifestError",
    "Verification",
    "build_manifest",
    "parse_manifest",
    "verify",
    "write_manifest",
]
