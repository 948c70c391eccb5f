"""Would the serving engine load it? vLLM's own verdict on a checkpoint, without tensor data.

A child interpreter (`load.engine_child`) runs vLLM's `load_weights` on a meta model, sealed;
its answer is untrusted data (one capped JSON line, checked field by field, never
unpickled). Without vLLM (an optional extra: docs/cli.md), for a remote checkpoint or on
Windows the verdict is `skipped` with the reason. Costs on 2 cores: importing vLLM 6-30 s,
building and loading on meta a second or two. The protocol: docs/architecture.md, "load/".
"""

from __future__ import annotations

import atexit
import importlib.util
import sys
from dataclasses import dataclass
from typing import Any

from inspector._internal.checkpoint.scanned import ScannedCheckpoint
from inspector._internal.load.child import NoAnswer, VerdictProcess, verdict_digest
from inspector._internal.load.verdict import LOADABLE_LAYOUTS

__all__ = [
    "ENGINE_MEMORY",
    "ENGINE_PROCESS",
    "ENGINE_SECONDS",
    "VLLM_PIN",
    "EngineVerdict",
    "engine_verdict",
    "vllm_available",
]

# The vLLM release the verdict is written against (the `[vllm]` extra pins it).
VLLM_PIN = "0.33.0"
# How long one verdict may take: importing vLLM on a busy CPU takes up to half a minute.
ENGINE_SECONDS = 300.0
# The child's address space (RLIMIT_AS, set by the child before it reads a request): vLLM's
# import takes about 1 GiB, a Qwen3-235B-shaped model on the meta device 0.6 GiB more; a
# config.json declaring a billion layers or experts ends at this cap, not at the machine's.
ENGINE_MEMORY = 8 << 30
_NAMES = 200


@dataclass(frozen=True)
class EngineVerdict:
    """vLLM's verdict (module docstring). `error` is the exception `load_weights` raised, as
    the engine wrote it, with `error_kind` "unmapped", "shape" or "other"; `missing` the
    parameters it never loaded; `missing_shards` (parameter, the shard ids no tensor filled);
    `size_mismatched` (parameter, elements received, elements it holds, its shape) at TP 1.
    Lists keep their first 200 entries; `*_count` are the full counts."""

    engine: str = "vllm"
    skipped: str | None = None
    version: str | None = None
    architecture: str | None = None
    tp: int = 1
    quantization: str | None = None
    error: str | None = None
    error_kind: str | None = None
    missing: tuple[str, ...] = ()
    missing_count: int = 0
    missing_shards: tuple[tuple[str, str], ...] = ()
    missing_shards_count: int = 0
    size_mismatched: tuple[tuple[str, int, int, tuple[int, ...]], ...] = ()
    size_mismatched_count: int = 0
    parameters: int = 0
    seconds: float = 0.0

    @property
    def ran(self) -> bool:
        return self.skipped is None

    @property
    def loads(self) -> bool | None:
        if self.skipped is not None:
            return None
        return not (self.error or self.missing_count or self.missing_shards_count) and not (
            self.size_mismatched_count
        )

    def summary(self) -> str:
        """One line: what vLLM would do with the checkpoint."""
        if self.skipped is not None:
            return f"vLLM verdict skipped: {self.skipped}"
        head = f"vLLM {self.version} as {self.architecture} (TP {self.tp})"
        if self.error:
            return f"{head}: load_weights raises {self.error.splitlines()[0][:160]}"
        parts = []
        if self.missing_count:
            parts.append(f"{self.missing_count:,} parameters never loaded")
        if self.missing_shards_count:
            parts.append(f"{self.missing_shards_count:,} fused parameters partly filled")
        if self.size_mismatched_count:
            parts.append(f"{self.size_mismatched_count:,} with other element counts")
        if not parts:
            return f"{head}: loads ({self.parameters:,} parameters)"
        return f"{head}: starts, but {', '.join(parts)}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "engine": self.engine,
            "skipped": self.skipped,
            "loads": self.loads,
            "version": self.version,
            "architecture": self.architecture,
            "tp": self.tp,
            "quantization": self.quantization,
            "error": self.error,
            "error_kind": self.error_kind,
            "missing": list(self.missing),
            "missing_count": self.missing_count,
            "missing_shards": [list(s) for s in self.missing_shards],
            "missing_shards_count": self.missing_shards_count,
            "size_mismatched": [[n, a, b, list(s)] for n, a, b, s in self.size_mismatched],
            "size_mismatched_count": self.size_mismatched_count,
            "parameters": self.parameters,
            "seconds": self.seconds,
        }

    @classmethod
    def from_answer(cls, data: object, *, tp: int) -> EngineVerdict:
        """The child's answer, checked field by field: ValueError on anything else than
        what `engine_child` writes (it ran vLLM on an untrusted config)."""
        if not isinstance(data, dict):
            raise ValueError("the vLLM verdict must be a JSON object")
        if data.get("skipped") is not None:
            return cls(skipped=_text(data["skipped"]), tp=tp)
        kind = _optional_text(data.get("error_kind"))
        if kind not in (None, "unmapped", "shape", "other"):
            raise ValueError(f"vLLM verdict: unknown error_kind {kind!r}")
        shards = tuple((_text(a), _text(b)) for a, b in _pairs(data.get("missing_shards", []), 2))
        sizes = tuple(
            (_text(n), _count(a), _count(b), tuple(_count(x) for x in _list(s)))
            for n, a, b, s in _pairs(data.get("size_mismatched", []), 4)
        )
        missing = tuple(_text(n) for n in _list(data.get("missing", [])))
        if len(missing) > _NAMES or len(shards) > _NAMES or len(sizes) > _NAMES:
            raise ValueError("vLLM verdict: a list longer than the child writes")
        seconds = data.get("seconds", 0.0)
        if not isinstance(seconds, int | float) or isinstance(seconds, bool):
            raise ValueError("vLLM verdict: seconds is not a number")
        return cls(
            version=_optional_text(data.get("version")),
            architecture=_optional_text(data.get("architecture")),
            tp=_count(data.get("tp", tp)),
            quantization=_optional_text(data.get("quantization")),
            error=_optional_text(data.get("error")),
            error_kind=kind,
            missing=missing,
            missing_count=max(_count(data.get("missing_count", 0)), len(missing)),
            missing_shards=shards,
            missing_shards_count=max(_count(data.get("missing_shards_count", 0)), len(shards)),
            size_mismatched=sizes,
            size_mismatched_count=max(_count(data.get("size_mismatched_count", 0)), len(sizes)),
            parameters=_count(data.get("parameters", 0)),
            seconds=float(seconds),
        )


def _text(value: object) -> str:
    if not isinstance(value, str) or len(value) > 4_000:
        raise ValueError("vLLM verdict: expected a string of at most 4,000 characters")
    return value


def _optional_text(value: object) -> str | None:
    return None if value is None else _text(value)


def _count(value: object) -> int:
    if type(value) is not int or not 0 <= value < 1 << 62:
        raise ValueError("vLLM verdict: expected a count")
    return value


def _list(value: object) -> list[Any]:
    if not isinstance(value, list):
        raise ValueError("vLLM verdict: expected a list")
    return value


def _pairs(value: object, n: int) -> list[list[Any]]:
    items = _list(value)
    if not all(isinstance(i, list) and len(i) == n for i in items):
        raise ValueError(f"vLLM verdict: expected lists of {n}")
    return items


def vllm_available() -> str | None:
    """None when vLLM is importable here, else the one line saying how to get the verdict."""
    if importlib.util.find_spec("vllm") is not None:
        return None
    return (
        "vLLM's own verdict not run: vLLM is not installed (pip install "
        f"'checkpoint-inspector[vllm]', then vllm=={VLLM_PIN} --no-deps; docs/cli.md)"
    )


def engine_verdict(scanned: ScannedCheckpoint, *, tp: int = 1) -> EngineVerdict:
    """vLLM's verdict on `scanned` at tensor-parallel size `tp` (module docstring)."""
    missing = vllm_available()
    if missing is not None:
        return EngineVerdict(skipped=missing, tp=tp)
    folder = scanned.local_path
    if folder is None or scanned.layout not in LOADABLE_LAYOUTS or sys.platform == "win32":
        where = "a remote checkpoint" if folder is None else f"the {scanned.layout} layout"
        return EngineVerdict(
            skipped=f"vLLM's verdict runs on local folders vLLM reads, not {where}", tp=tp
        )
    if scanned.config is None:
        return EngineVerdict(skipped="no config.json: vLLM builds its model from it", tp=tp)
    request = {"path": str(folder), "layout": str(scanned.layout), "tp": tp}
    try:
        answer = ENGINE_PROCESS.ask(request)
    except NoAnswer as why:
        return EngineVerdict(skipped=str(why), tp=tp)
    if "failed" in answer:
        ENGINE_PROCESS.close()
        raise RuntimeError(f"the vLLM verdict failed in its process:\n{answer['failed']}")
    if answer.get("digest") != verdict_digest(scanned):
        return EngineVerdict(
            skipped="the files changed while vLLM read them; re-scan to check them again", tp=tp
        )
    try:
        return EngineVerdict.from_answer(answer, tp=tp)
    except ValueError as exc:
        ENGINE_PROCESS.close()  # what it writes next cannot be trusted either
        return EngineVerdict(
            skipped=f"the vLLM verdict's process answered with no verdict: {exc}", tp=tp
        )


def _child_env(env: dict[str, str]) -> dict[str, str]:
    """The child's environment: none of the user's vLLM settings (a plugin list, a model hub,
    remote code allowed) nor tokens; vLLM on CPU, offline, quiet."""
    kept = {
        k: v
        for k, v in env.items()
        if not k.startswith(("VLLM_", "HF_", "HUGGING_FACE_", "AWS_", "GOOGLE_"))
        and "TOKEN" not in k
    }
    return {
        **kept,
        "VLLM_TARGET_DEVICE": "cpu",
        "VLLM_NO_USAGE_STATS": "1",
        "VLLM_PLUGINS": "",
        "VLLM_LOGGING_LEVEL": "ERROR",
        "DO_NOT_TRACK": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }


# One child per process, kept for the next verdict (vLLM's import is most of its cost).
ENGINE_PROCESS = VerdictProcess(
    "inspector._internal.load.engine_child",
    what="vLLM's verdict",
    seconds=ENGINE_SECONDS,
    env=_child_env,
    cap=16 << 20,
)
atexit.register(ENGINE_PROCESS.close)
