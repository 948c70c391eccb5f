"""`ckpt-inspect verify` and `ckpt-inspect manifest`: argument parsing over
`inspector.integrity`. Registered by `inspector.cli` when it builds its parser."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from inspector.cli import (
    EXIT_FOUND,
    EXIT_OK,
    add_remote_arguments,
    remote_kwargs,
    target,
)
from inspector.display import legible
from inspector.filenames import MANIFEST_NAME
from inspector.integrity.verify import LEVELS, Verification, verify, write_manifest

__all__ = ["format_verification", "register"]


def register(sub: argparse._SubParsersAction) -> None:
    """Add `verify` and `manifest` to the CLI's subcommands."""
    p = sub.add_parser(
        "verify",
        help="are the bytes right? compare with a manifest, the Hub's listing or another copy",
    )
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
    p.add_argument(
        "--fail-on",
        choices=("error", "warning", "never"),
        default="error",
        help="exit 1 when a finding of this severity or worse exists (default: error)",
    )
    p.add_argument("--workers", type=int, metavar="N", help="files hashed at once")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    add_remote_arguments(p)
    p.set_defaults(func=_cmd_verify)

    p = sub.add_parser(
        "manifest",
        help="write a content manifest (per file size + SHA-256, per tensor content hash)",
    )
    p.add_argument("path", type=target, help="checkpoint folder, or a URL with -o")
    p.add_argument(
        "-o",
        "--output",
        type=Path,
        help=f"where to write it (default: {MANIFEST_NAME} inside the folder)",
    )
    p.add_argument("--workers", type=int, metavar="N", help="files hashed at once")
    p.set_defaults(func=_cmd_manifest)


def _progress() -> bool:
    return sys.stderr.isatty()


def _cmd_verify(args: argparse.Namespace) -> int:
    kw = remote_kwargs(args)
    kw.pop("read_ahead", None)
    result = verify(
        args.path,
        against=args.against,
        level=args.level,
        workers=args.workers,
        progress=_progress(),
        **kw,
    )
    if args.json:
        json.dump(result.to_dict(), sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
    else:
        print(format_verification(result))
    if args.fail_on == "never":
        return EXIT_OK
    worst = ("error",) if args.fail_on == "error" else ("error", "warning")
    return EXIT_FOUND if any(f.severity in worst for f in result.findings) else EXIT_OK


def format_verification(result: Verification) -> str:
    """The result as people read it on a terminal."""
    lines = [result.line()]
    for f in result.findings:
        lines.append(f"  {f.severity.value:7} {f.code}: {legible(f.message)}")
    if result.bytes_read:
        rate = result.bytes_read / max(result.seconds, 1e-9) / 1e6
        lines.append(
            f"  read {result.bytes_read:,} bytes in {result.seconds:.1f} s ({rate:,.0f} MB/s)"
        )
    return "\n".join(lines)


def _cmd_manifest(args: argparse.Namespace) -> int:
    path = args.path if isinstance(args.path, str) else str(args.path)
    dest = write_manifest(path, output=args.output, workers=args.workers, progress=_progress())
    print(f"wrote {legible(dest)}")
    return EXIT_OK
