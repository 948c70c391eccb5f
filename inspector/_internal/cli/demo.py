"""`ckpt-inspect demo OUTDIR`: write the built-in demo checkpoints."""

from __future__ import annotations

import argparse
from pathlib import Path

from inspector._internal.cli.args import EXIT_OK
from inspector._internal.demo import write_demos

__all__ = ["add_parser", "run"]


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add the `demo` command to the CLI's subcommands."""
    p = sub.add_parser("demo", help="write the built-in demo checkpoints into OUTDIR")
    p.add_argument("outdir", type=Path)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    write_demos(args.outdir)
    return EXIT_OK
