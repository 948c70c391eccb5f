"""`ckpt-inspect verify`: are the bytes what a manifest, the Hub's listing or another copy
recorded? Argument parsing over `inspector._internal.integrity.verify`. Under torchrun the
ranks share the reading; rank 0 alone prints, and every rank exits with the same code."""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from typing import TYPE_CHECKING

from inspector._internal.cli.args import (
    add_options,
    add_remote_arguments,
    exit_for,
    remote_kwargs,
    target,
    write_json,
)
from inspector._internal.common.defaults import LEVELS
from inspector._internal.common.filenames import MANIFEST_NAME
from inspector._internal.execution.ranks import is_lead

if TYPE_CHECKING:
    from inspector._internal.integrity.verify import Verification

__all__ = ["add_arguments", "format_verification", "progress_wanted", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of `verify` (its name and help: `cli.main.COMMANDS`)."""
    p.add_argument("path", type=target, help="checkpoint folder, or a URL (s3://, hf://, ...)")
    p.add_argument(
        "--against",
        metavar="SOURCE",
        help=f"a manifest file; hf://org/repo[@revision] (the Hub's own sizes and SHA-256, "
        "nothing downloaded); or another checkpoint folder or URL. Default: the folder's "
        f"{MANIFEST_NAME}, else header extents only",
    )
    p.add_argument(
        "--level",
        choices=LEVELS,
        default="hash",
        help="size: file lists and sizes (listings only); hash: SHA-256 of every file "
        "(default); tensor: content hash of every tensor, whatever the sharding",
    )
    add_options(p, "--fail-on")
    p.add_argument(
        "--download",
        action="store_true",
        help="with --against hf://...: read the repository's files where what it records "
        "is not enough (no tensor hashes at --level tensor without its manifest, no checksum "
        "for a file); by default nothing is downloaded",
    )
    add_options(p, "--workers", "--json")
    add_remote_arguments(p)
    p.set_defaults(func=run)


def progress_wanted() -> bool:
    """Progress bars only when a person watches stderr."""
    return sys.stderr.isatty()


def run(args: argparse.Namespace) -> int:
    # Here, not at the top: `verify --help` imports this module and must stay light.
    from inspector._internal.integrity.verify import verify

    kw = remote_kwargs(args)
    kw.pop("read_ahead", None)
    result = verify(
        args.path,
        against=args.against,
        level=args.level,
        download=args.download,
        workers=args.workers,
        progress=progress_wanted(),
        distributed=True,
        **kw,
    )
    if is_lead() and args.json:
        write_json(result.to_dict())
    elif is_lead():
        print(format_verification(result))
    return exit_for(Counter(f.severity for f in result.findings), args.fail_on)


def format_verification(result: Verification) -> str:
    """The result as people read it on a terminal."""
    # Grouped and bounded as `check` prints them: 20,000 damaged files are a heading, ten
    # messages and a count, not 20,000 lines.
    from inspector._internal.report.text import finding_lines

    lines = [result.line()]
    lines += finding_lines([f.to_dict() for f in result.findings])
    if result.bytes_read:
        rate = result.bytes_read / max(result.seconds, 1e-9) / 1e6
        lines.append(
            f"  read {result.bytes_read:,} bytes in {result.seconds:.1f} s ({rate:,.0f} MB/s)"
        )
    return "\n".join(lines)
