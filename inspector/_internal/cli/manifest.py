"""`ckpt-inspect manifest`: write a checkpoint's content manifest (per file size + SHA-256,
per tensor content hash). Under torchrun the ranks share the reading; rank 0 alone writes
and prints."""

from __future__ import annotations

import argparse

from inspector._internal.cli.args import EXIT_OK, add_options, local_output, target
from inspector._internal.cli.verify import progress_wanted
from inspector._internal.common.display import legible
from inspector._internal.common.filenames import MANIFEST_NAME
from inspector._internal.execution.ranks import is_lead

__all__ = ["add_arguments", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of `manifest` (its name and help: `cli.main.COMMANDS`)."""
    p.add_argument("path", type=target, help="checkpoint folder, or a URL with -o")
    p.add_argument(
        "-o",
        "--output",
        type=local_output,
        help=f"where to write it (default: {MANIFEST_NAME} inside the folder)",
    )
    add_options(p, "--workers")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # Here, not at the top: `manifest --help` imports this module and must stay light.
    from inspector._internal.integrity.verify import write_manifest

    path = args.path if isinstance(args.path, str) else str(args.path)
    dest = write_manifest(
        path,
        output=args.output,
        workers=args.workers,
        progress=progress_wanted(),
        distributed=True,
    )
    if is_lead():
        print(f"wrote {legible(dest)}")
    return EXIT_OK
