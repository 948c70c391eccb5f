"""`ckpt-inspect` / `python -m inspector`: the parser, made of one module per command
(`COMMANDS`, and the commands other packages add), and the one place errors become one
line and an exit code."""

from __future__ import annotations

import argparse
import errno
import sys
import traceback
from collections.abc import Callable, Sequence
from importlib.metadata import entry_points
from pathlib import Path

from inspector._internal.cli import (
    check,
    codes,
    consolidate,
    demo,
    diff,
    fit,
    manifest,
    repair,
    scan,
    verify,
)
from inspector._internal.cli.args import EXIT_CANNOT, EXIT_OK
from inspector._internal.common.display import LINE_LIMIT, legible
from inspector.errors import InspectorError

__all__ = ["COMMANDS", "PLUGIN_GROUP", "describe_os_error", "main"]


# The commands, in the order `ckpt-inspect --help` lists them.
COMMANDS = (scan, check, fit, diff, verify, manifest, repair, consolidate, codes, demo)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the process exit code: 0 clean, 1 findings (or a refused plan),
    2 the command could not do its work (one line on stderr says which file, what failed and
    what to do; never a traceback)."""
    parser = _parser()
    args = parser.parse_args(argv)
    command: Callable[[argparse.Namespace], int] = args.func
    try:
        return command(args)
    except BrokenPipeError:
        return EXIT_OK
    except InspectorError as exc:
        _fail(str(exc))
    except OSError as exc:
        _fail(describe_os_error(exc, command=args.command, path=_main_path(args)))
    except MemoryError:
        _fail(f"{args.command}: out of memory; close other programs or use a larger machine")
    except KeyboardInterrupt:
        _fail(f"{args.command}: interrupted")
        return 130
    except Exception as exc:  # a bug: exit 1 would read as "findings" to CI, a traceback
        _fail(_internal_error(args.command, exc))  # would flood its log
    return EXIT_CANNOT


def _internal_error(command: str, exc: Exception) -> str:
    """One line for an exception no code path expected: where it was raised and what it
    says, enough for a bug report."""
    where = traceback.extract_tb(exc.__traceback__)[-1:]
    at = f" at {Path(where[0].filename).name}:{where[0].lineno}" if where else ""
    return (
        f"{command}: internal error{at} ({type(exc).__name__}: {exc}); the command did not "
        "finish: please report this with the command that failed"
    )


def _fail(message: str) -> None:
    # One line: a message that spans lines would be cut apart by log collectors. It may quote
    # several findings (a refused plan), each bounded already: the line is bounded as a whole.
    line = legible(" ".join(message.split()), limit=LINE_LIMIT)
    print(f"ckpt-inspect: {line}", file=sys.stderr)


def _main_path(args: argparse.Namespace) -> Path | str | None:
    for name in ("dest", "path", "src", "a", "outdir"):
        value = getattr(args, name, None)
        if isinstance(value, (Path, str)):
            return value
    return None


# errno -> (what failed, what to do). The errors people meet on shared and network storage.
_OS_ERRORS: dict[int, tuple[str, str]] = {
    errno.ENOSPC: ("no space left on the device", "free space there, or write somewhere else"),
    errno.EDQUOT: ("disk quota exceeded", "free space in your quota, or write somewhere else"),
    errno.EFBIG: (
        "file too large (for this file system, or the process file-size limit `ulimit -f`)",
        "raise the limit or write to another file system",
    ),
    errno.EROFS: (
        "read-only file system",
        "work on a writable copy of the checkpoint, or use --dry-run",
    ),
    errno.EACCES: ("permission denied", "check the permissions, or work on a copy you own"),
    errno.EPERM: ("operation not permitted", "check the permissions, or work on a copy you own"),
    errno.ELOOP: (
        "too many levels of symbolic links (a link loop)",
        "remove or fix the link",
    ),
    errno.ENOENT: ("no such file or folder", "check the path"),
    errno.ENOTDIR: ("a part of the path is not a folder", "check the path"),
    errno.EISDIR: ("is a folder where a file was expected", "check the path"),
    errno.ENAMETOOLONG: ("file name too long", "use a shorter path"),
    errno.EIO: ("input/output error", "check the disk or the network file system"),
    errno.EMFILE: ("too many open files", "raise the limit (ulimit -n) and run again"),
    errno.ENFILE: ("too many open files in the system", "close other programs and run again"),
    errno.ESTALE: ("stale network file handle", "remount the file system and run again"),
}


def describe_os_error(exc: OSError, *, command: str, path: Path | str | None = None) -> str:
    """One line for an OSError: command, file, what failed (with the errno name), what to do."""
    what, todo = _OS_ERRORS.get(exc.errno or 0, (exc.strerror or str(exc), "check the file"))
    code = errno.errorcode.get(exc.errno or 0, "")
    file = exc.filename if exc.filename is not None else path
    where = legible(file) + (f" -> {legible(exc.filename2)}" if exc.filename2 is not None else "")
    return f"{command}: {where or 'a file'}: {what}{f' [{code}]' if code else ''}; {todo}"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ckpt-inspect",
        description="Scan, check and repair large model checkpoints by reading only headers.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.add_parser(sub)
    _add_plugin_commands(sub)
    return parser


# Commands that other packages of the distribution add (the HTML `report` comes from
# `inspector.widgets`, which needs plotly): the core never imports the UI package itself.
PLUGIN_GROUP = "checkpoint_inspector.commands"


def _add_plugin_commands(sub: argparse._SubParsersAction) -> None:
    for entry in sorted(entry_points(group=PLUGIN_GROUP), key=lambda e: e.name):
        register: Callable[[argparse._SubParsersAction], None] = entry.load()
        register(sub)
