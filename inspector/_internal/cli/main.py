"""`ckpt-inspect` / `python -m inspector`: the parser, made of one module per command (the
`COMMANDS` table, and the commands other packages add), and the one place errors become one
line and an exit code.

A command's module is imported only when that command runs: `ckpt-inspect --help` and
`--version` list the table and import none of them (each pulls in pandas and the readers).
"""

from __future__ import annotations

import argparse
import errno
import functools
import importlib
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from inspector._internal.cli import EXIT_CANNOT, EXIT_OK
from inspector._internal.common.display import LINE_LIMIT, legible
from inspector._internal.common.lazy import entry_points
from inspector.errors import InspectorError

__all__ = ["COMMANDS", "PLUGIN_GROUP", "Command", "describe_os_error", "main"]


@dataclass(frozen=True, slots=True)
class Command:
    """One command: its name, the line `--help` shows for it, and the module whose
    `add_arguments(parser)` defines its options and sets `func` to its `run`: the module of
    `inspector/_internal/cli/` named after the command, or another package's for a plugin
    command (`module`)."""

    name: str
    help: str
    module: str = ""
    description: str | None = None
    # `completion` writes the script of the whole parser: every command's options.
    whole_parser: bool = False

    @property
    def module_name(self) -> str:
        return self.module or f"inspector._internal.cli.{self.name}"

    def add_to(self, sub: argparse._SubParsersAction, *, full: bool) -> None:
        p = sub.add_parser(self.name, help=self.help, description=self.description or self.help)
        if full:
            importlib.import_module(self.module_name).add_arguments(p)


# The commands, in the order `ckpt-inspect --help` lists them.
COMMANDS = (
    Command("scan", "summarize a checkpoint (headers and JSON only)"),
    Command(
        "check",
        "report every finding (drift, structure, will it load) and its fix; CI gate",
    ),
    Command(
        "fit",
        "will it serve? parallel plans (TP, EP, PP), weights and KV cache per GPU",
    ),
    Command("diff", "compare two checkpoints: names, dtypes, shapes, layer keys"),
    Command(
        "verify",
        "are the bytes right? compare with a manifest, the Hub's listing or another copy",
    ),
    Command(
        "manifest",
        "write a content manifest (per file size + SHA-256, per tensor content hash)",
    ),
    Command(
        "repair",
        "rebuild index, sidecars, quant config from the shards on disk (all at once by "
        "default); restore lost tensors from a reference (--from REF)",
    ),
    Command(
        "consolidate",
        "turn DCP-sharded safetensors or a .bin checkpoint into an HF safetensors checkpoint",
    ),
    Command("codes", "list every finding code with its severity and meaning"),
    Command("demo", "write the built-in demo checkpoints into OUTDIR"),
    Command(
        "completion",
        "print the shell completion script (bash, zsh or tcsh)",
        description="Print the completion script of ckpt-inspect for SHELL. Bash: "
        "`ckpt-inspect completion bash > ~/.local/share/bash-completion/completions/"
        "ckpt-inspect`; zsh: `ckpt-inspect completion zsh > ~/.zfunc/_ckpt-inspect` with "
        "~/.zfunc on fpath before compinit.",
        whole_parser=True,
    ),
)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the process exit code: 0 clean, 1 findings (or a refused plan),
    2 the command could not do its work (one line on stderr says which file, what failed and
    what to do; never a traceback). Without `argv` this process is the command (`ckpt-inspect`,
    `python -m inspector`): what a command leaves alive may be moved out of the garbage
    collector's sight (`gc.freeze`, see `cli.check`) until the process ends. A caller in this
    process that gives `argv` (a test, a notebook) keeps the collector as it had it: nothing
    is frozen for it, and what it froze itself stays frozen (`gc.unfreeze` cannot give back
    only the command's objects)."""
    argv_given = argv is not None
    argv = sys.argv[1:] if argv is None else list(argv)
    _share_the_heap()
    if not argv_given:
        _one_blas_thread()
    parser = _parser(
        _chosen(argv),
        asks_help=bool({"-h", "--help"} & set(argv)),
        plugins=_lists_plugins(argv),
    )
    args = parser.parse_args(argv)
    args.whole_process = not argv_given
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


# pyarrow's own allocator (mimalloc) cannot reuse what numpy and Python freed: building the
# tables' Arrow columns after the name parsing's temporaries were freed put them on fresh pages
# (about 60 bytes per tensor more at the peak of `scan`, 90 for `check`). The C library's
# allocator, which numpy uses, lets them take that freed memory. Arrow reads the variable when
# it makes its default pool, so only a process that has not imported pyarrow yet is told;
# a variable the user set wins.
ARROW_POOL_ENV = "ARROW_DEFAULT_MEMORY_POOL"


def _share_the_heap() -> None:
    """Point pyarrow at the C library's allocator for this process (see `ARROW_POOL_ENV`)."""
    if "pyarrow" not in sys.modules:
        os.environ.setdefault(ARROW_POOL_ENV, "system")


# numpy's OpenBLAS starts a thread per core, with its buffers, as numpy is imported: on the
# project's 2-core machine `python -c "import numpy"` took 0.15 s of CPU and 0.2 s of wall
# time, against 0.09 s and 0.1 s with one thread, on every command that reads a checkpoint.
# No command multiplies matrices; the value statistics' dot products run in a thread per
# core already. OpenBLAS reads the variable when numpy loads it: only a process that has not
# imported numpy yet is told, and a variable the user set wins. Only when this process is the
# command (`main` without `argv`): a caller's own numpy, imported later, keeps its threads.
BLAS_THREADS_ENV = "OPENBLAS_NUM_THREADS"


def _one_blas_thread() -> None:
    """One OpenBLAS thread for this process (see `BLAS_THREADS_ENV`)."""
    if "numpy" not in sys.modules:
        os.environ.setdefault(BLAS_THREADS_ENV, "1")


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


def _chosen(argv: Sequence[str]) -> str | None:
    """The command `argv` runs: its first word that is not an option (the top-level parser has
    no option that takes a value, so no option's value comes before it), when it names one.
    A built-in command is known without looking up the plugin commands."""
    word = next((a for a in argv if not a.startswith("-")), None)
    if word is None or word in _BUILT_IN:
        return word
    return word if word in {c.name for c in _commands()} else None


_BUILT_IN = {c.name: c for c in COMMANDS}


def _lists_plugins(argv: Sequence[str]) -> bool:
    """Whether the parse of `argv` needs the plugin commands: not when it runs a built-in
    command that does not write the whole parser, nor when it stops at `--version` before
    the top-level help lists the commands. Looking them up (`entry_points`) reads every
    installed distribution's metadata: about 9 ms, and importing importlib.metadata 25 ms
    more, on every run."""
    for arg in argv:
        if arg == "-h" or (len(arg) > 2 and "--help".startswith(arg)):
            return True  # argparse takes `--he` for `--help`: the top-level help lists all
        if len(arg) > 2 and "--version".startswith(arg):
            return False
        if not arg.startswith("-"):
            command = _BUILT_IN.get(arg)
            return command is None or command.whole_parser
    return True  # no command: argparse's error lists them all


def _parser(
    command: str | None = "*", *, asks_help: bool = False, plugins: bool = True
) -> argparse.ArgumentParser:
    """The parser with every command listed and `command`'s options defined ("*": every
    command's, as completion and the tests need; None: none, for `--help` and `--version`).
    `asks_help`: the parse ends at `--help`, so a command that runs on the whole parser
    (`completion`) needs only its own options there. `plugins=False` lists the built-in
    commands alone (see `_lists_plugins`)."""
    parser = argparse.ArgumentParser(
        prog="ckpt-inspect",
        description="Scan, check and repair large model checkpoints by reading only headers.",
    )
    parser.add_argument("--version", action=_Version, help="print the version and exit")
    sub = parser.add_subparsers(dest="command", required=True)
    commands = _commands() if plugins else COMMANDS
    whole = command == "*" or (
        not asks_help and any(c.whole_parser and c.name == command for c in commands)
    )
    for c in commands:
        c.add_to(sub, full=whole or c.name == command)
    # `completion` writes the script of the whole parser, plugin commands included.
    parser.set_defaults(root_parser=parser)
    return parser


class _Version(argparse.Action):
    """`--version`: the installed distribution's version, looked up only when asked."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: object) -> None:
        super().__init__(option_strings, dest, nargs=0, help=str(kwargs.get("help", "")))

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> None:
        from inspector import __version__

        sys.stdout.write(f"ckpt-inspect {__version__}\n")
        parser.exit()


# Commands that other packages of the distribution add (the HTML `report` comes from
# `inspector.widgets`, which needs plotly): the core never imports the UI package itself. An
# entry point names a module with `HELP`, `add_arguments` and `run`, like the core's own, and
# that module imports its heavy parts only in those functions.
PLUGIN_GROUP = "checkpoint_inspector.commands"


@functools.cache
def _commands() -> tuple[Command, ...]:
    """The table and the plugin commands, in the order `--help` lists them."""
    return (*COMMANDS, *_plugin_commands())


def _plugin_commands() -> list[Command]:
    """The commands installed packages add. One that does not load, or names no `HELP` line,
    is left out with one line on stderr: another package's bug never stops every command."""
    names = {c.name for c in COMMANDS}
    commands = []
    for entry in sorted(entry_points(group=PLUGIN_GROUP), key=lambda e: e.name):
        where = f"the command {entry.name!r} of the entry point {entry.value!r}"
        todo = "reinstall or uninstall the package that provides it"
        if entry.name in names:
            _fail(f"{where} is left out: {entry.name!r} is a built-in command; {todo}")
            continue
        try:
            text = getattr(entry.load(), "HELP", None)
        except Exception as exc:  # any error of someone else's module
            _fail(f"{where} is left out: loading it failed ({exc!r}); {todo}")
            continue
        if not isinstance(text, str):
            _fail(f"{where} is left out: its module has no HELP line (a str); {todo}")
            continue
        commands.append(Command(entry.name, text, entry.value))
    return commands
