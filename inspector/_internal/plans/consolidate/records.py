"""The records a consolidation plan is made of and what executing it returns: planned
tensors and their source pieces, output files, the result, and the index a plan writes.
Imports nothing of the consolidation's other modules, so the writer (`engine`) and the
planner (`plan`) both build on it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, TypedDict

import orjson

from inspector._internal.common.display import MESSAGE_LIMIT, legible
from inspector._internal.common.text import examples, plural
from inspector._internal.common.units import format_bytes
from inspector._internal.diagnosis.references import Reference
from inspector._internal.execution.temps import Leftovers
from inspector._internal.findings.finding import Finding
from inspector._internal.storage import Entry, EntryKind, RemoteURL, Storage

__all__ = [
    "METADATA_CAP",
    "ConsolidationOptions",
    "ConsolidationResult",
    "Execution",
    "OutputFile",
    "Piece",
    "PlanView",
    "PlannedTensor",
    "describe_result",
    "index_bytes",
    "not_copied",
]


METADATA_CAP = 2_000_000_000


def not_copied(entry: Entry, rel: str) -> str | None:
    """Why a metadata file (`rel` in the source) is not copied beside the outputs, or None:
    refused by the storage (a FIFO, a link out of the folder), or of unknown size or over
    `METADATA_CAP`. Decided when planning, so executing the plan never meets it."""
    if entry.kind is EntryKind.REFUSED:
        return f"not copied: {legible(rel)} {entry.reason}"
    if entry.size is None or entry.size > METADATA_CAP:
        size = "of unknown size" if entry.size is None else f"over {format_bytes(METADATA_CAP)}"
        return f"not copied: {legible(rel)} is {size}"
    return None


class ConsolidationOptions(TypedDict, total=False):
    """How a plan is executed: the one set of options `consolidate()` and
    `ConsolidationPlan.execute()` take as keywords (the driver gets them resolved against
    their defaults, `Execution`). Every option is optional:

    - `resume` keeps outputs already complete (same size and header).
    - `overwrite`: DEST must be empty or hold only this plan's own output; anything else is
      refused unless `overwrite`, which first moves every entry a written file replaces into
      `DEST/.ckpt-inspect-backup/<time>/`.
    - `progress` shows a progress bar (tqdm).
    - `verify` re-scans and checks DEST; `verify_data` also compares every tensor's content
      hash with the source.
    - `workers` threads write separate files (each holds one 8 MB block buffer).
    - `rank`/`world_size`: output i is written by rank i % world_size (under torchrun they
      come from the environment).
    - `fsync=False` skips flushing each output to disk before its rename: a killed process
      still never leaves a partial file under a final name, but a power loss may (for scratch
      destinations that are re-created on failure anyway).

    Defaults: `resume`, `overwrite` and `verify_data` off; `progress`, `verify` and `fsync`
    on; one worker; `rank`/`world_size` from torchrun's environment, else 0 of 1.
    """

    resume: bool
    overwrite: bool
    progress: bool
    verify: bool
    verify_data: bool
    workers: int
    rank: int | None
    world_size: int | None
    fsync: bool


@dataclass(frozen=True, kw_only=True, slots=True)
class Execution:
    """`ConsolidationOptions` resolved against their defaults (a field per option)."""

    resume: bool = False
    overwrite: bool = False
    progress: bool = True
    verify: bool = True
    verify_data: bool = False
    workers: int = 1
    rank: int | None = None
    world_size: int | None = None
    fsync: bool = True

    @classmethod
    def of(cls, options: ConsolidationOptions) -> Execution:
        """The options given, the defaults for the rest."""
        return dataclasses.replace(cls(), **options)


@dataclass(frozen=True, slots=True)
class Piece:
    """One source chunk of a tensor: where its bytes are, and where it sits in the tensor."""

    file: str
    src_offset: int  # absolute byte offset of the chunk in `file`
    nbytes: int
    offsets: tuple[int, ...]
    shape: tuple[int, ...]
    # Byte offset inside the output tensor when the chunk is one contiguous range, else None.
    dst_offset: int | None
    # Element strides of a `.bin` view whose elements are not one row-major run from
    # `src_offset` (a transposed or sliced tensor torch.save kept as it was), else None.
    strides: tuple[int, ...] | None = None


@dataclass(frozen=True, slots=True)
class PlannedTensor:
    name: str
    dtype: str  # source dtype
    out_dtype: str
    shape: tuple[int, ...]
    begin: int  # data offsets in the output file's data section
    end: int
    pieces: tuple[Piece, ...]
    # The pieces leave regions uncovered (allow_partial): those bytes must be zeros.
    partial: bool = False

    @property
    def contiguous(self) -> bool:
        """True when every chunk is a plain byte range of the output and no cast is needed."""
        return self.dtype == self.out_dtype and all(p.dst_offset is not None for p in self.pieces)


@dataclass(frozen=True, slots=True)
class OutputFile:
    index: int  # 1-based
    name: str
    header: bytes  # the 8-byte length prefix and the padded JSON header
    tensors: tuple[PlannedTensor, ...]

    @property
    def data_bytes(self) -> int:
        return self.tensors[-1].end if self.tensors else 0

    @property
    def size(self) -> int:
        return len(self.header) + self.data_bytes


@dataclass(frozen=True)
class ConsolidationResult:
    """What one process wrote and what the verification of DEST found."""

    dest: Path
    written: tuple[str, ...]
    skipped: tuple[str, ...]  # complete outputs left alone by `resume=True`
    bytes_written: int
    seconds: float
    index_file: str | None  # None on ranks other than 0
    metadata_files: tuple[str, ...]
    rank: int = 0
    world_size: int = 1
    verified: bool = False
    findings: tuple[Finding, ...] = ()
    data_checked: int = 0
    data_mismatches: tuple[str, ...] = ()
    # Tensors the source did not fully hold, written with zeros there (allow_partial).
    partial: tuple[str, ...] = ()
    backup: Path | None = None  # where `overwrite` moved the entries it replaced
    replaced: tuple[str, ...] = ()
    # Seconds of the copy alone (first byte to last file sealed): the progress bar's clock.
    copy_seconds: float = 0.0
    # Temp files a killed run of this plan left in DEST: removed, or kept with why (rank 0).
    leftovers: Leftovers = field(default_factory=Leftovers)

    @property
    def rate(self) -> float:
        """Bytes per second of the copy, as the progress bar measures it (0 when none)."""
        return self.bytes_written / self.copy_seconds if self.copy_seconds > 0 else 0.0

    @property
    def ok(self) -> bool:
        """No finding, no content mismatch and no partial tensor in DEST (findings and
        mismatches are only known on the rank that verified)."""
        return not self.findings and not self.data_mismatches and not self.partial

    def describe(self) -> str:
        return describe_result(self)

    def __str__(self) -> str:
        return self.describe()


def index_bytes(plan: PlanView) -> bytes:
    """The `model.safetensors.index.json` this plan writes, byte for byte."""
    doc = {
        "metadata": {"total_size": plan.total_size, "total_parameters": plan.total_parameters},
        "weight_map": dict(sorted(plan.weight_map.items())),
    }
    return orjson.dumps(doc, option=orjson.OPT_INDENT_2) + b"\n"


def describe_result(result: ConsolidationResult) -> str:
    who = f" (rank {result.rank} of {result.world_size})" if result.world_size > 1 else ""
    # One definition of the rate, the bar's: bytes over the copy's seconds, decimal units.
    rate = f"{format_bytes(result.rate)}/s" if result.rate else "nothing copied"
    rest = result.seconds - result.copy_seconds
    around = f"; {result.seconds:.2f} s in all with planning and checks" if rest >= 0.01 else ""
    lines = [
        f"Consolidated into {result.dest}{who}: wrote {plural(len(result.written), 'file')}, "
        f"{format_bytes(result.bytes_written)} in {result.copy_seconds:.2f} s of copying "
        f"({rate}){around}",
    ]
    if result.skipped:
        kept = examples(list(result.skipped))
        lines.append(f"  resumed: {plural(len(result.skipped), 'complete file')} kept: {kept}")
    if result.backup is not None:
        lines.append(
            f"  replaced {plural(len(result.replaced), 'entry')}"
            f" of DEST ({examples(list(result.replaced))}); the originals are in {result.backup}"
        )
    lines += [f"  {line}" for line in result.leftovers.lines()]
    if result.index_file:
        lines.append(f"  index: {result.index_file}")
    if result.metadata_files:
        lines.append(f"  copied: {', '.join(result.metadata_files)}")
    if result.verified:
        state = "no finding" if not result.findings else plural(len(result.findings), "finding")
        lines.append(f"  verify: re-scanned and checked the output: {state}")
        lines += [f"    [{f.code}] {f.message}" for f in result.findings[:20]]
    if result.partial:
        lines.append(
            f"  WARNING: PARTIAL {plural(len(result.partial), 'tensor')} (--allow-partial: zeros "
            f"where the source held no data): {examples(list(result.partial))}"
        )
    if result.data_checked:
        bad = result.data_mismatches
        state = "all match" if not bad else f"{plural(len(bad), 'mismatch')}: {examples(list(bad))}"
        lines.append(f"  verify data: {result.data_checked:,} tensor hashes vs the source: {state}")
    return "\n".join(legible(line, limit=MESSAGE_LIMIT) for line in lines)


class PlanView(Protocol):
    """A consolidation plan as `engine`, which executes and verifies it, reads it
    (`plan.ConsolidationPlan` is one): `plan` imports `engine` to execute itself, so it names
    the plan by this type rather than import it back."""

    @property
    def source(self) -> Path | RemoteURL: ...
    @property
    def dest(self) -> Path: ...
    @property
    def outputs(self) -> tuple[OutputFile, ...]: ...
    @property
    def assignment(self) -> str: ...
    @property
    def metadata_files(self) -> tuple[str, ...]: ...
    @property
    def partial(self) -> tuple[str, ...]: ...
    @property
    def layout(self) -> Reference | None: ...
    @property
    def index_file(self) -> str | None: ...
    @property
    def source_storage(self) -> Storage: ...
    @property
    def total_size(self) -> int: ...
    @property
    def total_parameters(self) -> int: ...
    @property
    def weight_map(self) -> dict[str, str]: ...
