"""The defaults and choices of the options a user can change on the command line, named once
in the lowest room: the readers that apply them and `ckpt-inspect <command> --help`, which
shows them without importing those readers (numpy, pandas, the remote stack), say the same."""

from __future__ import annotations

from typing import Literal

__all__ = [
    "DEFAULT_CONCURRENCY",
    "DEFAULT_HEADER_CAP",
    "DEFAULT_READ_AHEAD",
    "DEFAULT_READ_TIMEOUT",
    "DEFAULT_TIMEOUT",
    "DEFAULT_UTILIZATION",
    "ENGINES",
    "LEVELS",
    "MATRIX_TP",
    "MIN_READ_AHEAD",
    "Level",
]

# The largest safetensors header read (`formats.safetensors`), in bytes.
DEFAULT_HEADER_CAP = 100_000_000

# Remote reading (`storage.remote`): bytes the first ranged read of each shard fetches,
# requests in flight at once; seconds one operation (a listing, a ranged read of at most
# 8 MiB) may take, retries included, and seconds a socket read may bring nothing.
DEFAULT_READ_AHEAD = 64 << 10
# The least read-ahead: a safetensors file's first 8 bytes give its header's length.
MIN_READ_AHEAD = 8
DEFAULT_CONCURRENCY = 32
DEFAULT_TIMEOUT = 120.0
DEFAULT_READ_TIMEOUT = 30.0

# The serving engines `check --engine` and `fit --engine` judge for (`serve.engine`).
ENGINES = ("vllm", "llama.cpp", "sglang")
# The plans `fit` tries when no TP is given: each with EP 1, and EP = TP for a MoE model.
MATRIX_TP = (1, 2, 4, 8, 16, 32)
# vLLM's default `--gpu-memory-utilization`.
DEFAULT_UTILIZATION = 0.9

# How far `verify` compares (`integrity.verify`).
Level = Literal["size", "hash", "tensor"]
LEVELS: tuple[Level, ...] = ("size", "hash", "tensor")
