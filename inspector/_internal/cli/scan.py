"""`ckpt-inspect scan`: summarize a checkpoint (headers and JSON only)."""

from __future__ import annotations

import argparse

from inspector._internal.cli.args import EXIT_OK, add_path_arguments, emit, scan_from_args
from inspector._internal.report.summary import format_summary, summarize

__all__ = ["add_parser", "run"]


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add the `scan` command to the CLI's subcommands."""
    p = sub.add_parser("scan", help="summarize a checkpoint (headers and JSON only)")
    add_path_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    summary = summarize(scan_from_args(args))
    emit(summary, args.json, format_summary)
    return EXIT_OK
