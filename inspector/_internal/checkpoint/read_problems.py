"""What a reader could not read: `ReadProblem` (a file, its role to the layout, why) and the
one table that says which finding code each (role, kind) is and what to do about it. Pure.

Readers never judge: they record a `ReadProblem`; `ScannedCheckpoint.read_findings` turns the
scan's problems into findings through this table.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum

from inspector._internal.common.display import legible
from inspector._internal.common.text import examples
from inspector._internal.findings.codes import Code, code_set
from inspector._internal.findings.finding import Finding, fold, make_finding
from inspector._internal.formats.pickles.stand_ins import refuse_state

__all__ = ["CODES", "FileRole", "ProblemKind", "ReadProblem", "read_problem_findings"]


class FileRole(StrEnum):
    """What a side file is to its layout; `_TABLE` below maps it to a code."""

    INDEX = "index"
    SIDECAR = "sidecar"
    CONFIG = "config"
    QUANT_CONFIG = "quant-config"
    MAPPING = "mapping"
    DCP_SHARDING_INFO = "dcp-sharding-info"
    TORCH_DIST_METADATA = "torch-dist-metadata"
    TORCH_DIST_COMMON = "torch-dist-common"
    METADATA_JSON = "metadata-json"
    ITERATION_TRACKER = "iteration-tracker"
    # A .distcp file the storage map names (its size is compared with the stored ranges).
    TORCH_DIST_DATA = "torch-dist-data"

    # The bounded child's reply names this enum (`formats.pickles.sandbox`): BUILD on a member,
    # which every reader shares, is refused instead of changing it for the process.
    __setstate__ = refuse_state


class ProblemKind(StrEnum):
    """How much of the file was lost."""

    # The file (or the part of a shard header) cannot be used at all.
    UNREADABLE = "unreadable"
    # Some entries are malformed and were skipped; the rest was read.
    INVALID_ENTRIES = "invalid-entries"
    # An entry names a path outside the checkpoint folder; it was ignored.
    UNSAFE_PATH = "unsafe-path"
    # A pickle naming callables that run code (os.system, eval...): refused, nothing loaded.
    HOSTILE = "hostile"
    # A pickle whose unpickling would take unbounded work or memory: refused before it ran.
    BOMB = "bomb"
    # The storage refused the file itself (not a regular file, a link leaving the folder, a
    # link loop): nothing of it was read.
    UNSAFE_FILE = "unsafe-file"

    __setstate__ = refuse_state  # as FileRole's


@dataclass(frozen=True, slots=True)
class ReadProblem:
    """A file, or part of one, that a reader could not use. `reason` is a clause that follows
    the file name ("is not valid JSON (...)"); `read_problem_findings` adds the code and the
    advice."""

    file: str
    role: FileRole
    reason: str
    kind: ProblemKind = ProblemKind.UNREADABLE
    tensor: str | None = None


_R, _K = FileRole, ProblemKind

# (role, kind) -> code; what to do is the code's fix (`Code.fix`). Kinds a role never has are
# absent.
_TABLE: dict[tuple[FileRole, ProblemKind], Code] = {
    (_R.INDEX, _K.UNREADABLE): Code.INDEX_UNREADABLE,
    (_R.INDEX, _K.UNSAFE_PATH): Code.INDEX_UNSAFE_PATH,
    (_R.SIDECAR, _K.UNREADABLE): Code.SIDECAR_UNREADABLE,
    (_R.SIDECAR, _K.UNSAFE_PATH): Code.INDEX_UNSAFE_PATH,
    (_R.CONFIG, _K.UNREADABLE): Code.CONFIG_UNREADABLE,
    (_R.QUANT_CONFIG, _K.UNREADABLE): Code.QUANT_CONFIG_UNREADABLE,
    (_R.MAPPING, _K.UNREADABLE): Code.MAPPING_UNREADABLE,
    (_R.MAPPING, _K.INVALID_ENTRIES): Code.MAPPING_UNREADABLE,
    (_R.DCP_SHARDING_INFO, _K.UNREADABLE): Code.DCP_SHARDING_INFO_MISSING,
    (_R.DCP_SHARDING_INFO, _K.INVALID_ENTRIES): Code.DCP_SHARDING_INFO_MISSING,
    (_R.TORCH_DIST_METADATA, _K.UNREADABLE): Code.TORCH_DIST_METADATA_UNREADABLE,
    (_R.TORCH_DIST_METADATA, _K.INVALID_ENTRIES): Code.TORCH_DIST_METADATA_UNREADABLE,
    (_R.TORCH_DIST_METADATA, _K.UNSAFE_PATH): Code.TORCH_DIST_METADATA_UNREADABLE,
    (_R.TORCH_DIST_METADATA, _K.HOSTILE): Code.PICKLE_HOSTILE,
    (_R.TORCH_DIST_METADATA, _K.BOMB): Code.PICKLE_BOMB,
    (_R.ITERATION_TRACKER, _K.UNREADABLE): Code.TORCH_DIST_METADATA_UNREADABLE,
    (_R.METADATA_JSON, _K.UNREADABLE): Code.TORCH_DIST_METADATA_JSON,
    (_R.TORCH_DIST_COMMON, _K.UNREADABLE): Code.TORCH_DIST_COMMON_UNREADABLE,
    (_R.TORCH_DIST_COMMON, _K.HOSTILE): Code.PICKLE_HOSTILE,
    (_R.TORCH_DIST_COMMON, _K.BOMB): Code.PICKLE_BOMB,
    # Whatever the role, a file the storage refused is the same finding: nothing was read.
    **{(role, _K.UNSAFE_FILE): Code.FILE_UNSAFE for role in FileRole},
}

CODES = code_set(*_TABLE.values())


def read_problem_findings(problems: Iterable[ReadProblem]) -> list[Finding]:
    """One finding per problem, in reading order; per code and file the fold policy applies
    (an index with 50,000 entries pointing outside the folder lists 20 and folds the rest)."""
    by_code: dict[Code, dict[str, list[ReadProblem]]] = {}
    for problem in problems:
        code = _TABLE[(problem.role, problem.kind)]
        by_code.setdefault(code, {}).setdefault(problem.file, []).append(problem)
    out: list[Finding] = []
    for code, groups in by_code.items():
        out += fold(groups, _detail, _summary(code))
    return out


def _detail(_file: str | None, problem: ReadProblem) -> Finding:
    code = _TABLE[(problem.role, problem.kind)]
    message = f"{legible(problem.file)} {problem.reason}; {code.fix.text}"
    return make_finding(code, message, file=problem.file, tensor=problem.tensor)


def _summary(code: Code) -> Callable[[str | None, Sequence[ReadProblem], int], Finding]:
    def summary(file: str | None, rest: Sequence[ReadProblem], shown: int) -> Finding:
        tensors = [p.tensor for p in rest if p.tensor]
        eg = f" ({examples(tensors)})" if tensors else ""
        message = f"{legible(file)}: {len(rest):,} more {code} findings{eg}, not listed one by one"
        return make_finding(code, message, file=file)

    return summary
