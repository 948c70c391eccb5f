"""`ckpt-inspect scan`: summarize a checkpoint (headers and JSON only)."""

from __future__ import annotations

import argparse

from inspector._internal.cli.args import EXIT_OK, add_path_arguments, emit, scan_from_args

__all__ = ["add_arguments", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of `scan` (its name and help: `cli.main.COMMANDS`)."""
    add_path_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # Here, not at the top: `scan --help` imports this module and must stay light.
    from inspector._internal.report.summary import format_summary, summarize

    summary = summarize(scan_from_args(args))
    emit(summary, args.json, format_summary)
    return EXIT_OK
