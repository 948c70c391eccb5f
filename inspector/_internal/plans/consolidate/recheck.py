"""The recheck of a written consolidation: re-scan and check DEST, and on request verify
every tensor's content hash against the source chunks (the `verify` and `verify_data`
options)."""

from __future__ import annotations

import numpy as np

from inspector._internal.checkpoint.loaded import tensor_data
from inspector._internal.checks import check
from inspector._internal.common.filenames import INDEX_NAME
from inspector._internal.common.text import plural
from inspector._internal.findings.codes import Code
from inspector._internal.findings.finding import Finding, make_finding
from inspector._internal.formats.casting import cast_bytes
from inspector._internal.formats.tensordata import tensor_digest
from inspector._internal.plans.consolidate.engine import SourceFiles
from inspector._internal.plans.consolidate.records import PlannedTensor, PlanView
from inspector._internal.scan.entry import scan
from inspector._internal.storage import Location, Storage

__all__ = ["recheck"]


def recheck(plan: PlanView, *, checks: bool, data: bool) -> tuple[list[Finding], int, list[str]]:
    """Re-scan DEST and run every check; with `data`, compare content hashes per tensor."""
    written = scan(plan.dest)
    # What consolidation is answerable for; whether the model named by config.json loads the
    # tensors is the same before and after, and is `ckpt-inspect check DEST`'s to say.
    findings = check(written, model=False) if checks else []
    if checks:
        findings += _collapsed_output(plan)
    if not data:
        return findings, 0, []
    source = scan(Location(plan.source_storage))
    mismatches: list[str] = []
    checked = 0
    with tensor_data(source) as src, tensor_data(written) as out:
        for output in plan.outputs:
            for t in output.tensors:
                raw: memoryview | bytes | np.ndarray | None = src.tensor_bytes(t.name)
                if raw is None and t.contiguous:
                    raw = _contiguous_source_bytes(plan.source_storage, t)  # packed F4/F6
                if raw is not None and t.out_dtype != t.dtype:
                    raw = cast_bytes(np.frombuffer(raw, dtype=np.uint8), t.dtype, t.out_dtype)
                expected = None if raw is None else tensor_digest(raw)
                checked += 1
                if expected is None or expected != out.tensor_hash(t.name):
                    mismatches.append(t.name)
    return findings, checked, mismatches


def _collapsed_output(plan: PlanView) -> list[Finding]:
    """`mapping-collapsed` for an output written as one file although the reference the
    source knows names several: the collapse the source's check reports, reproduced (an
    explicit all-in-one mapping does it), is not a clean result."""
    layout = plan.layout
    if layout is None or layout.files < 2 or len(plan.outputs) != 1:
        return []
    n = sum(len(o.tensors) for o in plan.outputs)
    message = (
        f"the output holds all {plural(n, 'tensor')} in {plan.outputs[0].name} although "
        f"{layout.label} names {plural(layout.files, 'file')}: the consolidation followed a "
        f"collapsed assignment ({plan.assignment}); consolidate again with --reference "
        f"{layout.path}"
    )
    return [make_finding(Code.MAPPING_COLLAPSED, message, file=INDEX_NAME)]


def _contiguous_source_bytes(storage: Storage, tensor: PlannedTensor) -> bytes:
    """The tensor's bytes read piece by piece (verification of byte-copied tensors that the
    element-wise assembler cannot place, such as packed sub-byte dtypes)."""
    out = bytearray(tensor.end - tensor.begin)
    sources = SourceFiles(storage)
    try:
        for piece in tensor.pieces:
            data = sources.read(piece.file, piece.src_offset, piece.nbytes)
            at = piece.dst_offset or 0  # set on every piece of a contiguous tensor
            out[at : at + piece.nbytes] = data
    finally:
        sources.close()
    return bytes(out)
