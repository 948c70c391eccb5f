"""Files a reader could not read: each `ReadProblem` becomes a finding. Pure.

The readers say what is wrong with a file (`reason`) and what the file is to its layout
(`role`); this table says which code that is and what to do about it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from inspector.codes import Code, code_set
from inspector.display import legible
from inspector.errors import UNSAFE_FILE_ADVICE
from inspector.findings import Finding, examples, fold, make_finding
from inspector.model import FileRole, ProblemKind, ReadProblem

__all__ = ["CODES", "read_problem_findings"]

_R, _K = FileRole, ProblemKind
_REPAIR = "; regenerate it with `ckpt-inspect repair`"
_CONFIG = "; re-write it from the model's config"
_SAVED = "; the checkpoint cannot be loaded without it: restore it from the original save"
_HOSTILE = (
    Code.PICKLE_HOSTILE,
    "; do not load this checkpoint with plain torch.load or pickle, and tell whoever shared it",
)
_BOMB = (
    Code.PICKLE_BOMB,
    "; the file was crafted or is corrupt: restore it from the original save",
)

# (role, kind) -> (code, what to do). Kinds a role never has are absent.
_TABLE: dict[tuple[FileRole, ProblemKind], tuple[Code, str]] = {
    (_R.INDEX, _K.UNREADABLE): (Code.INDEX_UNREADABLE, _REPAIR),
    (_R.INDEX, _K.UNSAFE_PATH): (Code.INDEX_UNSAFE_PATH, ""),
    (_R.SIDECAR, _K.UNREADABLE): (Code.SIDECAR_UNREADABLE, _REPAIR),
    (_R.SIDECAR, _K.UNSAFE_PATH): (Code.INDEX_UNSAFE_PATH, ""),
    (_R.CONFIG, _K.UNREADABLE): (Code.CONFIG_UNREADABLE, _CONFIG),
    (_R.QUANT_CONFIG, _K.UNREADABLE): (Code.QUANT_CONFIG_UNREADABLE, _CONFIG),
    (_R.MAPPING, _K.UNREADABLE): (
        Code.MAPPING_UNREADABLE,
        "; regenerate it from the reference model's index",
    ),
    (_R.MAPPING, _K.INVALID_ENTRIES): (Code.MAPPING_UNREADABLE, ", regenerate the mapping"),
    (_R.DCP_SHARDING_INFO, _K.UNREADABLE): (
        Code.DCP_SHARDING_INFO_MISSING,
        "; re-save this rank's file with the DCP writer, or move a stray non-DCP file out of "
        "the folder",
    ),
    (_R.DCP_SHARDING_INFO, _K.INVALID_ENTRIES): (
        Code.DCP_SHARDING_INFO_MISSING,
        "; re-save this rank",
    ),
    (_R.TORCH_DIST_METADATA, _K.UNREADABLE): (Code.TORCH_DIST_METADATA_UNREADABLE, _SAVED),
    (_R.TORCH_DIST_METADATA, _K.INVALID_ENTRIES): (Code.TORCH_DIST_METADATA_UNREADABLE, ""),
    (_R.TORCH_DIST_METADATA, _K.UNSAFE_PATH): (Code.TORCH_DIST_METADATA_UNREADABLE, ""),
    (_R.TORCH_DIST_METADATA, _K.HOSTILE): _HOSTILE,
    (_R.TORCH_DIST_METADATA, _K.BOMB): _BOMB,
    (_R.ITERATION_TRACKER, _K.UNREADABLE): (
        Code.TORCH_DIST_METADATA_UNREADABLE,
        "; rewrite it with the iteration of the last complete save",
    ),
    (_R.METADATA_JSON, _K.UNREADABLE): (
        Code.TORCH_DIST_METADATA_JSON,
        '; expected {"sharded_backend": "torch_dist", ...}: rewrite it, or Megatron will not '
        "recognise the checkpoint",
    ),
    (_R.TORCH_DIST_COMMON, _K.UNREADABLE): (
        Code.TORCH_DIST_COMMON_UNREADABLE,
        "; drift checks against it are skipped",
    ),
    (_R.TORCH_DIST_COMMON, _K.HOSTILE): _HOSTILE,
    (_R.TORCH_DIST_COMMON, _K.BOMB): _BOMB,
    # Whatever the role, a file the storage refused is the same finding: nothing was read.
    **{(role, _K.UNSAFE_FILE): (Code.FILE_UNSAFE, UNSAFE_FILE_ADVICE) for role in FileRole},
}

CODES = code_set(*(code for code, _ in _TABLE.values()))


def read_problem_findings(problems: Iterable[ReadProblem]) -> list[Finding]:
    """One finding per problem, in reading order; per code and file the fold policy applies
    (an index with 50,000 entries pointing outside the folder lists 20 and folds the rest)."""
    by_code: dict[Code, dict[str, list[ReadProblem]]] = {}
    for problem in problems:
        code, _ = _TABLE[(problem.role, problem.kind)]
        by_code.setdefault(code, {}).setdefault(problem.file, []).append(problem)
    out: list[Finding] = []
    for code, groups in by_code.items():
        out += fold(groups, _detail, _summary(code))
    return out


def _detail(_file: str | None, problem: ReadProblem) -> Finding:
    code, advice = _TABLE[(problem.role, problem.kind)]
    message = f"{legible(problem.file)} {problem.reason}{advice}"
    return make_finding(code, message, file=problem.file, tensor=problem.tensor)


def _summary(code: Code) -> Callable[[str | None, Sequence[ReadProblem], int], Finding]:
    def summary(file: str | None, rest: Sequence[ReadProblem], shown: int) -> Finding:
        tensors = [p.tensor for p in rest if p.tensor]
        eg = f" ({examples(tensors)})" if tensors else ""
        message = f"{legible(file)}: {len(rest):,} more {code} findings{eg}, not listed one by one"
        return make_finding(code, message, file=file)

    return summary
