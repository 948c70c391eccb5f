"""`ckpt-inspect report`: the HTML report and the Markdown summary, a command this package adds
to the core CLI through the `checkpoint_inspector.commands` entry point (the core never imports
the UI package). Nothing heavy is imported until the command runs, so the CLI starts fast and
works without plotly for every other command."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

__all__ = ["HELP", "add_arguments", "run"]

HELP = "write a self-contained HTML report (needs the ui extra)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of `report`; the core's CLI lists the command from `HELP` alone and calls
    this only when `report` runs (the facade below imports pandas and the readers)."""
    from inspector.ui import add_model_arguments, add_path_arguments

    add_path_arguments(p)
    p.add_argument("-o", "--output", type=Path, help="HTML file (default: <name>-report.html)")
    p.add_argument(
        "--figures",
        choices=("embedded", "cdn", "png"),
        default="embedded",
        help="how the figures are drawn: plotly.js embedded (default, about 1.5 MB, offline), "
        "loaded from its CDN (small, needs internet to draw), or PNG images (small, offline, "
        "needs kaleido and Chrome/Chromium)",
    )
    p.add_argument(
        "--light",
        dest="figures",
        action="store_const",
        const="cdn",
        help="a report small enough to attach: the same as --figures cdn",
    )
    p.add_argument(
        "--markdown",
        action="store_true",
        help="print a Markdown summary for bug reports; writes HTML too only when -o is given",
    )
    add_model_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from inspector.ui import EXIT_CANNOT, EXIT_OK, check, legible, scan_from_args, verdict_from_args

    scanned = scan_from_args(args)
    verdict = verdict_from_args(args, scanned)
    findings = check(scanned, model=verdict is not None, verdict=verdict)
    if args.markdown:
        from inspector.ui import fit, markdown_summary

        serving = fit(scanned)
        sys.stdout.write(markdown_summary(scanned, findings, verdict=verdict, serving=serving))
        if args.output is None:
            return EXIT_OK
    try:
        from .report import write_html_report
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] != "plotly":
            raise
        print(
            "ckpt-inspect: the HTML report needs plotly; install the ui extra: "
            "pip install 'checkpoint-inspector[ui]' (or use --markdown)",
            file=sys.stderr,
        )
        return EXIT_CANNOT
    default = Path(f"{scanned.path.name.removesuffix('.safetensors')}-report.html")
    written = write_html_report(
        scanned, findings, args.output or default, verdict=verdict, figures=args.figures
    )
    print(f"wrote {legible(written)}", file=sys.stderr if args.markdown else sys.stdout)
    return EXIT_OK
