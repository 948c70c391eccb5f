"""`ckpt-inspect codes`: every finding code with its severity, meaning and fix."""

from __future__ import annotations

import argparse
import sys

from inspector._internal.cli.args import EXIT_OK, add_options, emit
from inspector._internal.findings.codes import Code, codes_markdown

__all__ = ["add_arguments", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of `codes` (its name and help: `cli.main.COMMANDS`)."""
    add_options(p, "--json")
    p.add_argument("--markdown", action="store_true", help="print the reference as Markdown")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.markdown:
        sys.stdout.write(codes_markdown())
        return EXIT_OK
    table = {
        c.value: {
            "severity": c.severity.value,
            "group": c.group,
            "help": c.help,
            "fix": {"kind": c.fix.kind, "text": c.fix.text},
        }
        for c in Code
    }
    if args.json:
        emit(table, True, str)
        return EXIT_OK
    width = max(map(len, table))
    for code, row in table.items():
        print(f"{code:<{width}}  {row['severity']:<7}  {row['help']}")
    return EXIT_OK
