"""`ckpt-inspect check`: every finding and its fix; the CI gate (`--fail-on`)."""

from __future__ import annotations

import argparse
import sys
from typing import Literal

from inspector._internal.cli.args import (
    add_model_arguments,
    add_options,
    add_path_arguments,
    emit,
    exit_for,
    positive,
    sample_windows,
    scan_from_args,
    settled,
    verdict_from_args,
    write_json,
)
from inspector._internal.common.defaults import ENGINES
from inspector._internal.common.gc import gc_paused
from inspector._internal.serve.gpus import GPUS
from inspector.errors import InspectorError

FORMATS = ("text", "json", "sarif", "junit")

__all__ = ["FORMATS", "add_arguments", "output_format", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of `check` (its name and help: `cli.main.COMMANDS`)."""
    add_path_arguments(p)
    add_options(p, "--fail-on")
    p.add_argument(
        "--deep",
        action="store_true",
        help="also read tensor data: all-zero and NaN/Inf tensors, bytes of duplicated tensors",
    )
    p.add_argument(
        "--values",
        choices=("sample", "full"),
        help="read tensor values for per-tensor statistics judged against the sibling layers "
        "and experts (NaN/Inf, all-zero, never-written, outlier tensors): `sample` reads a few "
        "small windows of each tensor, `full` every byte (see the docs' Tensor values page)",
    )
    p.add_argument(
        "--sample-windows",
        type=sample_windows,
        metavar="N",
        help="windows --values sample reads per tensor, which it implies (default 8 of 256 "
        "bytes; more catch smaller damaged spans, at N x 256 bytes a tensor)",
    )
    p.add_argument(
        "--sample-seed",
        type=int,
        default=0,
        metavar="S",
        help="where the windows of --values sample fall, which it implies (default 0; the "
        "same seed reads the same bytes, another seed other ones)",
    )
    p.add_argument(
        "--full",
        action="store_true",
        help="with --format json: list every name of the load verdict (by default each list "
        "keeps its first few names and its count)",
    )
    p.add_argument(
        "--format",
        choices=FORMATS,
        help="text (default: the issues, then one line per code), json (every field; --json "
        "is the same), sarif (SARIF 2.1.0, for code-scanning uploads) or junit (JUnit XML, "
        "for CI test reports); the exit code follows --fail-on in every format",
    )
    p.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="text: also list every finding under its code, its fix said once",
    )
    p.add_argument(
        "--engine",
        choices=ENGINES,
        help="also what this serving engine would make of it: vllm runs vLLM's own weight "
        "loading on a meta model (the [vllm] extra), llama.cpp the names its converter "
        "cannot map; sglang: quantization support only",
    )
    p.add_argument(
        "--tp", type=positive, default=1, metavar="N", help="with --engine vllm: the TP size"
    )
    p.add_argument(
        "--gpu",
        choices=tuple(GPUS),
        metavar="NAME",
        help=f"with --engine: judge the quantization scheme on this GPU ({', '.join(GPUS)})",
    )
    add_model_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # Here, not at the top: `check --help` imports this module and must stay light.
    with gc_paused():  # `settled`: what they make lives as long as the process
        from inspector._internal.checks import check
        from inspector._internal.checks.sharding import collapse_note
        from inspector._internal.findings.finding import sort_findings
        from inspector._internal.report.text import check_result, format_check

        settled(args)

    form = output_format(args)  # a contradiction is refused before any reading
    if args.engine is None and (args.tp != 1 or args.gpu is not None):
        raise InspectorError("check: --tp and --gpu go with --engine")
    sampling = args.sample_windows is not None or args.sample_seed != 0
    if sampling and args.values == "full":
        raise InspectorError(
            "check: --sample-windows and --sample-seed choose what --values sample reads, "
            "but --values full reads every byte; drop them or use --values sample"
        )
    values: Literal["sample", "full"] | None = (
        "sample" if sampling and args.values is None else args.values
    )
    # Settled before the collector resumes: resumed first, its next pass walked every object
    # the scan made (10-15 ms at 300,000 tensors), all of which live until the end anyway.
    with gc_paused():
        scanned = scan_from_args(args)
        settled(args)  # the scan's headers and columns
    verdict = verdict_from_args(args, scanned)
    findings = check(
        scanned,
        deep=args.deep,
        values=values,
        sample_windows=args.sample_windows,
        sample_seed=args.sample_seed,
        model=verdict is not None,
        verdict=verdict,
    )
    engine = None
    if args.engine is not None:
        from inspector._internal.serve.engine import engine_check  # only with --engine

        engine = engine_check(scanned, engine=args.engine, tp=args.tp, gpu=args.gpu)
        findings = sort_findings([*findings, *engine.findings])
    read = None
    if values is not None:
        # Only with --values: the value tables are frames, and pandas costs a quarter second.
        from inspector._internal.checks.values import SampleBudget, values_read

        budget = None if args.sample_windows is None else SampleBudget(windows=args.sample_windows)
        read = values_read(scanned, values, budget=budget, seed=args.sample_seed)
    note = collapse_note(scanned)
    result = check_result(
        scanned,
        findings,
        verdict=verdict,
        full=args.full,
        engine=engine,
        values=read,
        notes=[note] if note else [],
    )
    if form in ("sarif", "junit"):  # their writers imported only for them (10 ms)
        from inspector._internal.report.ci import junit_xml, sarif_log

        if form == "sarif":
            write_json(sarif_log(result, scanned=scanned))
        else:
            sys.stdout.write(junit_xml(result, fail_on=args.fail_on))
    else:
        emit(result, form == "json", lambda r: format_check(r, verbose=args.verbose))
    return exit_for(result["counts"], args.fail_on)


def output_format(args: argparse.Namespace) -> str:
    """The format `--format` or `--json` (its alias for json, kept for the scripts that use
    it) asks for; both at once must agree."""
    if args.json and args.format not in (None, "json"):
        raise InspectorError(
            f"check: --json asks for JSON and --format for {args.format}: give one of them"
        )
    return "json" if args.json else args.format or "text"
