"""`ckpt-inspect demo OUTDIR`: write the built-in demo checkpoints."""

from __future__ import annotations

import argparse
from pathlib import Path

from inspector._internal.cli.args import EXIT_OK

__all__ = ["add_arguments", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of `demo` (its name and help: `cli.main.COMMANDS`)."""
    p.add_argument("outdir", type=Path)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # Here, not at the top: `demo --help` imports this module and must stay light.
    from inspector._internal.demo import write_demos

    write_demos(args.outdir)
    return EXIT_OK
