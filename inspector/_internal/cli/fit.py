"""`ckpt-inspect fit`: will it serve? The parallel plans vLLM and SGLang would start, the
weights and KV cache per GPU, and on a given GPU the longest context that fits."""

from __future__ import annotations

import argparse

from inspector._internal.cli.args import (
    EXIT_FOUND,
    EXIT_OK,
    add_path_arguments,
    emit,
    number,
    positive,
    scan_from_args,
    scan_path,
)
from inspector._internal.common.defaults import DEFAULT_UTILIZATION, ENGINES, MATRIX_TP
from inspector._internal.common.dtypes import KV_CACHE_DTYPES
from inspector._internal.serve.gpus import GPUS, gpu_named

__all__ = ["add_arguments", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of `fit` (its name and help: `cli.main.COMMANDS`)."""
    add_path_arguments(p)
    matrix = ", ".join(map(str, MATRIX_TP))
    p.add_argument(
        "--tp",
        type=positive,
        metavar="N",
        help=f"tensor-parallel size of the one plan to judge (default: the matrix TP {matrix}, "
        "each with EP 1 and, for a MoE model, EP = TP)",
    )
    p.add_argument(
        "--ep", type=positive, metavar="N", help="expert-parallel size; divides --tp (default 1)"
    )
    p.add_argument("--pp", type=positive, metavar="N", help="pipeline stages (default 1)")
    gpu = p.add_mutually_exclusive_group()
    gpu.add_argument(
        "--gpu",
        type=_gpu,
        metavar="NAME",
        help=f"the GPU to fit on: {', '.join(GPUS)}",
    )
    gpu.add_argument(
        "--gpu-memory",
        type=_gib,
        metavar="GIB",
        help="the GPU's memory in GiB, for a GPU the catalogue does not list",
    )
    p.add_argument(
        "--context",
        type=positive,
        metavar="TOKENS",
        help="the context to serve (default: the model's max_position_embeddings, which vLLM "
        "serves unless --max-model-len says otherwise)",
    )
    p.add_argument(
        "--kv-dtype",
        choices=tuple(KV_CACHE_DTYPES),
        default="auto",
        help="the KV cache dtype, as vLLM's --kv-cache-dtype (default auto: the model's 16 bits)",
    )
    p.add_argument(
        "--gpu-memory-utilization",
        type=_share,
        default=DEFAULT_UTILIZATION,
        metavar="SHARE",
        help=f"share of GPU memory the engine may use (default {DEFAULT_UTILIZATION}, as vLLM)",
    )
    p.add_argument(
        "--target",
        metavar="PATH",
        help="the checkpoint is a draft model (EAGLE) for this target: judge the pair",
    )
    p.add_argument(
        "--engine",
        choices=ENGINES,
        help="also this serving engine's own check: vllm runs vLLM's weight loading on a meta "
        "model at --tp (default 1; the [vllm] extra), llama.cpp the names its converter "
        "cannot map",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Exit 0 when a plan starts (and fits, with a GPU), 1 when none does."""
    # Here, not at the top: `fit --help` imports this module and must stay light.
    from inspector._internal.report.fit import fit_text
    from inspector._internal.serve.fit import fit

    scanned = scan_from_args(args)
    result = fit(
        scanned,
        tp=args.tp,
        ep=args.ep,
        pp=args.pp,
        gpu=args.gpu,
        gpu_memory=args.gpu_memory,
        context=args.context,
        kv_dtype=args.kv_dtype,
        gpu_memory_utilization=args.gpu_memory_utilization,
        target=None if args.target is None else scan_path(args.target, args),
        engine=args.engine,
    )
    emit(result.to_dict(), args.json, lambda _: fit_text(result, path=str(scanned.path)))
    return EXIT_OK if result.feasible else EXIT_FOUND


def _gpu(text: str) -> str:
    known = gpu_named(text)
    if known is None:
        raise argparse.ArgumentTypeError(f"{text!r}: not a known GPU; one of {', '.join(GPUS)}")
    return known.name


_gib = number(
    float,
    "a number of GiB",
    lambda v: 0 < v <= 1 << 20,
    f"{{text}}: expected more than 0 and at most {1 << 20:,} GiB",
)
_share = number(
    float, "a share such as 0.9", lambda v: 0 < v <= 1, "{text}: expected more than 0 and at most 1"
)
