"""`ckpt-inspect demo OUTDIR`: write the built-in demo checkpoints."""

from __future__ import annotations

import argparse
from pathlib import Path

from inspector._internal.cli.args import EXIT_OK
from inspector._internal.demo import write_demos

__all__ = ["add_arguments", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of `demo` (its name and help: `cli.main.COMMANDS`)."""
    p.add_argument("outdir", type=Path)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    write_demos(args.outdir)
    return EXIT_OK
