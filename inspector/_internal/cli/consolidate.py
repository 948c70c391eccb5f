"""`ckpt-inspect consolidate SRC DEST`: DCP-sharded safetensors, or a PyTorch `.bin`
checkpoint, into a Hugging Face safetensors checkpoint (plan, print, execute; under torchrun
each rank writes its share)."""

from __future__ import annotations

import argparse

from inspector._internal.cli.args import (
    EXIT_FOUND,
    EXIT_OK,
    add_remote_arguments,
    local_output,
    scan_path,
    target,
)
from inspector._internal.common.units import SHARD_SPLIT_SIZE, format_bytes
from inspector._internal.execution.ranks import is_lead

__all__ = ["add_arguments", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of `consolidate` (its name and help: `cli.main.COMMANDS`)."""
    p.add_argument(
        "src",
        type=target,
        help="DCP-sharded folder (or a checkpoint with model/), a .bin checkpoint, or a URL",
    )
    p.add_argument("dest", type=local_output, help="local output folder for the .safetensors files")
    p.add_argument(
        "--mapping", type=target, help="JSON {tensor: 1-based output file index} (path or URL)"
    )
    p.add_argument(
        "--reference", type=target, help="HF folder or index whose files to follow (or a URL)"
    )
    p.add_argument(
        "--max-shard-size",
        default=None,
        help="greedy packing limit (default "
        f"{format_bytes(SHARD_SPLIT_SIZE, digits=0)}; a .bin checkpoint keeps its own files "
        "unless this is given)",
    )
    p.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), help="cast floating tensors")
    p.add_argument(
        "--allow-partial",
        action="store_true",
        help="consolidate a source that lost rank files anyway: tensors it does not fully hold "
        "are written with zeros there, and named (exit code 1)",
    )
    p.add_argument("--resume", action="store_true", help="keep outputs that are already complete")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="write into a DEST holding other files; each one replaced is moved to "
        "DEST/.ckpt-inspect-backup/<time>/ first",
    )
    p.add_argument("--verify-data", action="store_true", help="compare content hashes at the end")
    p.add_argument("--dry-run", action="store_true", help="print the plan, write nothing")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--workers", type=int, default=1, help="output files written in parallel")
    p.add_argument(
        "--no-fsync",
        action="store_true",
        help="do not flush outputs to disk before renaming them (scratch destinations)",
    )
    add_remote_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # Here, not at the top: `consolidate --help` imports this module and must stay light.
    from inspector._internal.plans.consolidate import plan_consolidation

    plan = plan_consolidation(
        scan_path(args.src, args),
        args.dest,
        mapping=args.mapping,
        reference=args.reference,
        max_shard_size=args.max_shard_size,
        dtype=args.dtype,
        allow_partial=args.allow_partial,
    )
    lead = is_lead()  # under torchrun only rank 0 prints
    if lead:
        print(plan)
    if args.dry_run:
        return EXIT_OK
    result = plan.execute(
        resume=args.resume,
        overwrite=args.overwrite,
        progress=lead and not args.no_progress,
        verify_data=args.verify_data,
        workers=args.workers,
        fsync=not args.no_fsync,
    )
    if lead:
        print(result)
    return EXIT_OK if result.ok else EXIT_FOUND
