"""`ckpt-inspect diff A B`: what differs between two checkpoints."""

from __future__ import annotations

import argparse

from inspector._internal.cli.args import (
    EXIT_FOUND,
    EXIT_OK,
    add_options,
    add_remote_arguments,
    emit,
    remote_kwargs,
    target,
)

__all__ = ["add_arguments", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of `diff` (its name and help: `cli.main.COMMANDS`)."""
    p.add_argument("a", type=target, help="first checkpoint (a folder, a file or a URL)")
    p.add_argument("b", type=target, help="second checkpoint (a folder, a file or a URL)")
    p.add_argument("--data", action="store_true", help="also compare content hashes (reads data)")
    p.add_argument(
        "--reference",
        action="store_true",
        help="A is the checkpoint B was derived from: classify each difference as expected "
        "(quantization, experts fused, MTP added) or not; exit 1 only for unexpected ones",
    )
    add_options(p, "--json", "--header-cap")
    add_remote_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # Here, not at the top: `diff --help` imports this module and must stay light.
    from inspector._internal.checks.diff import diff_checkpoints
    from inspector._internal.report.text import format_diff
    from inspector._internal.scan.entry import scan

    a = scan(args.a, header_cap=args.header_cap, **remote_kwargs(args))
    b = scan(args.b, header_cap=args.header_cap, **remote_kwargs(args))
    result = diff_checkpoints(a, b, data=args.data, reference=args.reference)
    emit(result.to_dict(), args.json, format_diff)
    if args.reference:
        # A reference that lacks shards cannot vouch for B's tensors there: not a pass.
        failed = result.unexpected or result.data_unreadable or result.not_compared
        return EXIT_FOUND if failed else EXIT_OK
    return EXIT_OK if result.identical else EXIT_FOUND
