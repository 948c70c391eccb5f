"""`ckpt-inspect completion bash|zsh|tcsh`: the shell completion script of the whole CLI,
written by shtab (a maintained library that reads the argparse parser) from the parser the
command runs in, so every command, option and choice, the plugin commands too, completes
as it parses. Checkpoint and folder arguments complete as paths. shtab is the optional
`[completion]` extra: without it the command says how to install it (exit 2)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping

from inspector._internal.cli.args import EXIT_CANNOT, EXIT_OK

__all__ = ["PATH_ARGUMENTS", "SHELLS", "add_arguments", "run"]

SHELLS = ("bash", "zsh", "tcsh")
# Positional arguments that name a checkpoint, a file or a folder: completed as paths.
PATH_ARGUMENTS = frozenset({"path", "a", "b", "src", "dest", "outdir", "folder"})


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of `completion` (its name and help: `cli.main.COMMANDS`)."""
    p.add_argument("shell", choices=SHELLS, help="the shell to complete in")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        import shtab
    except ImportError:
        print(
            "ckpt-inspect completion: the completion script is written by shtab, which is not "
            "installed; pip install 'checkpoint-inspector[completion]'",
            file=sys.stderr,
        )
        return EXIT_CANNOT

    parser: argparse.ArgumentParser = args.root_parser
    _paths_complete_as_files(parser, shtab.FILE)
    sys.stdout.write(shtab.complete(parser, shell=args.shell))
    return EXIT_OK


def _paths_complete_as_files(parser: argparse.ArgumentParser, files: Mapping[str, object]) -> None:
    """Mark the path arguments of every command (shtab reads an action's `complete`)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for command in dict.fromkeys(action.choices.values()):
                _paths_complete_as_files(command, files)
        elif not action.option_strings and action.dest in PATH_ARGUMENTS:
            action.complete = files  # type: ignore[attr-defined]
