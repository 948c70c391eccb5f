"""`ckpt-inspect scan`: summarize a checkpoint (headers and JSON only)."""

from __future__ import annotations

import argparse

from inspector._internal.cli.args import EXIT_OK, add_path_arguments, emit, remote_kwargs, settled

__all__ = ["add_arguments", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of `scan` (its name and help: `cli.main.COMMANDS`)."""
    add_path_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from inspector._internal.common.gc import gc_paused

    # The summary's passes over the names make no cycles; paused through them, the collector
    # never walks the scan's objects (one pass right after the scan took 16 ms at 300,000
    # tensors, and four more during the summary). Paused through the imports too, which live
    # until the end (`settled`): their passes over numpy's and our modules cost 10-15 ms.
    with gc_paused():
        # Here, not at the top: `scan --help` imports this module and must stay light.
        from inspector._internal.report.summary import format_summary, summarize
        from inspector._internal.scan.entry import scan_once
        from inspector._internal.storage import RemoteOptions

        settled(args)
        remote = RemoteOptions(**remote_kwargs(args))
        scanned = scan_once(
            args.path, header_cap=args.header_cap, layout=args.layout, remote=remote
        )
        summary = summarize(scanned)
        del scanned  # freed by its reference count, before the collector resumes
    emit(summary, args.json, format_summary)
    return EXIT_OK
