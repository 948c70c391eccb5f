"""`ckpt-inspect` / `python -m inspector`: thin argument parsing over the core functions."""

from __future__ import annotations

import argparse
import errno
import json
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from inspector.display import LINE_LIMIT, legible
from inspector.errors import InspectorError
from inspector.safetensors_header import DEFAULT_HEADER_CAP
from inspector.units import SHARD_SPLIT_SIZE, format_bytes

if TYPE_CHECKING:
    from inspector.findings import Finding
    from inspector.model import ScannedCheckpoint
    from inspector.model_load import LoadVerdict
    from inspector.repair import RepairPlan
    from inspector.reshard import ReshardPlan
    from inspector.restore import RestorePlan

__all__ = [
    "EXIT_CANNOT",
    "EXIT_FOUND",
    "EXIT_OK",
    "PLUGIN_GROUP",
    "add_model_arguments",
    "add_path_arguments",
    "add_remote_arguments",
    "describe_os_error",
    "main",
    "remote_kwargs",
    "scan_from_args",
    "target",
    "verdict_from_args",
]

EXIT_OK, EXIT_FOUND, EXIT_CANNOT = 0, 1, 2


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

    p = sub.add_parser("scan", help="summarize a checkpoint (headers and JSON only)")
    add_path_arguments(p)
    p.set_defaults(func=_cmd_scan)

    p = sub.add_parser(
        "check", help="report every finding (drift, structure, will it load) and its fix; CI gate"
    )
    add_path_arguments(p)
    p.add_argument(
        "--fail-on",
        choices=("error", "warning", "never"),
        default="error",
        help="exit 1 when a finding of this severity or worse exists (default: error)",
    )
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
        "small windows of each tensor, `full` every byte (see docs/values.md)",
    )
    p.add_argument(
        "--full",
        action="store_true",
        help="with --json: list every name of the load verdict (by default each list keeps "
        "its first few names and its count)",
    )
    add_model_arguments(p)
    p.set_defaults(func=_cmd_check)

    p = sub.add_parser("diff", help="compare two checkpoints: names, dtypes, shapes, layer keys")
    p.add_argument("a", type=target, help="first checkpoint (a folder, a file or a URL)")
    p.add_argument("b", type=target, help="second checkpoint (a folder, a file or a URL)")
    p.add_argument("--data", action="store_true", help="also compare content hashes (reads data)")
    p.add_argument(
        "--reference",
        action="store_true",
        help="A is the checkpoint B was derived from: classify each difference as expected "
        "(quantization, experts fused, MTP added) or not; exit 1 only for unexpected ones",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--header-cap", type=int, default=DEFAULT_HEADER_CAP, metavar="BYTES")
    add_remote_arguments(p)
    p.set_defaults(func=_cmd_diff)

    p = sub.add_parser(
        "repair",
        help="rebuild index, sidecars, quant config from the shards on disk (all at once by "
        "default); restore lost tensors from a reference (--from REF)",
    )
    p.add_argument("path", type=target, help="checkpoint folder (or URL, with --output-dir)")
    p.add_argument(
        "--output-dir",
        type=Path,
        metavar="DIR",
        help="write the repaired JSON files into this local folder instead of the checkpoint "
        "(required for a remote checkpoint: nothing is uploaded)",
    )
    p.add_argument("--dry-run", action="store_true", help="show the plan and stop")
    p.add_argument("--yes", action="store_true", help="execute without asking")
    p.add_argument("--diff", action="store_true", help="also print the plan as a unified diff")
    p.add_argument(
        "--only",
        action="append",
        choices=("all", "index", "sidecars", "quant-config", "reshard"),
        help="repair only this part (repeatable); the default, all, plans the index, the "
        "sidecars and the quantization config together (or the re-shard of a checkpoint "
        "collapsed into one file), so no part is left disagreeing with another",
    )
    p.add_argument(
        "--duplicates",
        choices=("first", "last", "index"),
        help="which copy of a tensor stored in two shards the index keeps",
    )
    p.add_argument(
        "--max-shard-size",
        default=SHARD_SPLIT_SIZE,
        help=f"for --only reshard (default {format_bytes(SHARD_SPLIT_SIZE, digits=0)})",
    )
    p.add_argument(
        "--from",
        dest="source",
        type=target,
        metavar="REF",
        help="copy the tensors REF has and PATH lost (MTP layers, lm_head, experts) into one "
        "new shard; existing shards are never modified",
    )
    p.add_argument(
        "--verify-data",
        action="store_true",
        help="with --from: compare every copied tensor's bytes with REF before anything moves",
    )
    p.add_argument("--no-backup", action="store_true", help="do not keep copies of replaced files")
    p.add_argument("--header-cap", type=int, default=DEFAULT_HEADER_CAP, metavar="BYTES")
    add_remote_arguments(p)
    journal = p.add_mutually_exclusive_group()
    journal.add_argument(
        "--recover",
        action="store_true",
        help="show the folder's unfinished write journal and, confirmed, finish it",
    )
    journal.add_argument(
        "--discard-journal",
        action="store_true",
        help="show the folder's unfinished write journal and remove it (its files stay)",
    )
    p.set_defaults(func=_cmd_repair, layout=None)

    p = sub.add_parser("consolidate", help="turn DCP-sharded safetensors into an HF checkpoint")
    p.add_argument(
        "src", type=target, help="DCP-sharded folder (or a checkpoint with model/), or a URL"
    )
    p.add_argument("dest", type=Path, help="local output folder for model-*-of-*.safetensors")
    p.add_argument(
        "--mapping", type=target, help="JSON {tensor: 1-based output file index} (path or URL)"
    )
    p.add_argument(
        "--reference", type=target, help="HF folder or index whose files to follow (or a URL)"
    )
    p.add_argument(
        "--max-shard-size",
        default=SHARD_SPLIT_SIZE,
        help=f"greedy packing limit (default {format_bytes(SHARD_SPLIT_SIZE, digits=0)})",
    )
    p.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), help="cast floating tensors")
    p.add_argument(
        "--allow-partial",
        action="store_true",
        help="consolidate a source that lost rank files anyway: tensors it does not fully hold "
        "are written with zeros there, and named (exit code 1)",
    )
    p.add_argument("--resume", action="store_true", help="keep outputs that are already complete")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="write into a DEST holding other files; each one replaced is moved to "
        "DEST/.ckpt-inspect-backup/<time>/ first",
    )
    p.add_argument("--verify-data", action="store_true", help="compare content hashes at the end")
    p.add_argument("--dry-run", action="store_true", help="print the plan, write nothing")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--workers", type=int, default=1, help="output files written in parallel")
    p.add_argument(
        "--no-fsync",
        action="store_true",
        help="do not flush outputs to disk before renaming them (scratch destinations)",
    )
    add_remote_arguments(p)
    p.set_defaults(func=_cmd_consolidate)

    p = sub.add_parser("codes", help="list every finding code with its severity and meaning")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--markdown", action="store_true", help="print the reference as Markdown")
    p.set_defaults(func=_cmd_codes)

    p = sub.add_parser("demo", help="write the built-in demo checkpoints into OUTDIR")
    p.add_argument("outdir", type=Path)
    p.set_defaults(func=_cmd_demo)
    _add_plugin_commands(sub)
    return parser


# Commands that other packages of the distribution add (the HTML `report` comes from
# `inspector.widgets`, which needs plotly): the core never imports the UI package itself.
PLUGIN_GROUP = "checkpoint_inspector.commands"


def _add_plugin_commands(sub: argparse._SubParsersAction) -> None:
    from importlib.metadata import entry_points

    for entry in sorted(entry_points(group=PLUGIN_GROUP), key=lambda e: e.name):
        register: Callable[[argparse._SubParsersAction], None] = entry.load()
        register(sub)


def target(text: str) -> Path | str:
    """A command-line checkpoint: a URL stays a string (s3://, gs://, hf://, https://), a
    local path becomes a Path."""
    from inspector.storage import is_remote

    return text if is_remote(text) else Path(text)


def add_path_arguments(p: argparse.ArgumentParser) -> None:
    """PATH, --json, --header-cap and --layout, as every read-only command takes them, and
    the options of remote storage (`add_remote_arguments`)."""
    p.add_argument(
        "path",
        type=target,
        help="checkpoint folder or .safetensors file, or a URL: s3://bucket/prefix, gs://..., "
        "hf://org/repo[@revision][/subfolder], https://host/folder/",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument(
        "--header-cap",
        type=int,
        default=DEFAULT_HEADER_CAP,
        metavar="BYTES",
        help=f"largest safetensors header to read (default {DEFAULT_HEADER_CAP:,})",
    )
    p.add_argument("--layout", help="force a layout instead of detecting it")
    add_remote_arguments(p)


def add_remote_arguments(p: argparse.ArgumentParser) -> None:
    """--storage-option, --max-concurrency, --read-ahead, --timeout, --read-timeout and
    --allow-redirect (remote checkpoints)."""
    from inspector.storage.remote import (
        DEFAULT_CONCURRENCY,
        DEFAULT_READ_AHEAD,
        DEFAULT_READ_TIMEOUT,
        DEFAULT_TIMEOUT,
    )

    group = p.add_argument_group("remote checkpoints (s3://, gs://, hf://, https://)")
    group.add_argument(
        "--storage-option",
        action="append",
        default=[],
        type=_storage_option,
        metavar="KEY=VALUE",
        help="passed to the fsspec file system (repeatable; VALUE is JSON when it parses: "
        "anon=true, endpoint_url=http://..., client_kwargs.region_name=eu-west-1); credentials "
        "come from the usual places (AWS_PROFILE, AWS_ENDPOINT_URL, gcloud ADC, HF_TOKEN)",
    )
    group.add_argument(
        "--max-concurrency",
        type=_positive,
        default=DEFAULT_CONCURRENCY,
        metavar="N",
        help=f"requests in flight at once (default {DEFAULT_CONCURRENCY})",
    )
    group.add_argument(
        "--read-ahead",
        type=_positive,
        default=DEFAULT_READ_AHEAD,
        metavar="BYTES",
        help="bytes fetched by the first ranged read of each shard; headers that fit cost one "
        f"request (default {DEFAULT_READ_AHEAD:,})",
    )
    group.add_argument(
        "--timeout",
        type=_seconds,
        default=DEFAULT_TIMEOUT,
        metavar="SECONDS",
        help="longest one request (a listing, a read of up to 8 MiB) may take, retries "
        f"included; a server that trickles or stalls ends there (default {DEFAULT_TIMEOUT:g})",
    )
    group.add_argument(
        "--read-timeout",
        type=_seconds,
        default=DEFAULT_READ_TIMEOUT,
        metavar="SECONDS",
        help="longest a connection may bring no byte before the request is tried again "
        f"(default {DEFAULT_READ_TIMEOUT:g})",
    )
    group.add_argument(
        "--allow-redirect",
        action="append",
        default=[],
        type=_origin,
        metavar="ORIGIN",
        help="also follow redirects to ORIGIN (https://host[:port]; repeatable); by default "
        "a redirect is followed only within the origin a request went to",
    )


def _storage_option(text: str) -> tuple[str, object]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"{text!r}: expected KEY=VALUE, e.g. anon=true")
    try:
        parsed: object = json.loads(value)
    except ValueError:
        parsed = value
    return key.strip(), parsed


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value}: expected 1 or more")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a number of seconds") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text}: expected more than 0 seconds")
    return value


def _origin(text: str) -> str:
    from inspector.storage.guard import origin

    try:
        return origin(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def remote_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """The keyword arguments of `scan` for the remote options of a command."""
    from inspector.storage.remote import (
        DEFAULT_CONCURRENCY,
        DEFAULT_READ_AHEAD,
        DEFAULT_READ_TIMEOUT,
        DEFAULT_TIMEOUT,
    )

    return {
        "storage_options": dict(getattr(args, "storage_option", None) or []),
        "max_concurrency": getattr(args, "max_concurrency", DEFAULT_CONCURRENCY),
        "read_ahead": getattr(args, "read_ahead", DEFAULT_READ_AHEAD),
        "timeout": getattr(args, "timeout", DEFAULT_TIMEOUT),
        "read_timeout": getattr(args, "read_timeout", DEFAULT_READ_TIMEOUT),
        "allow_redirects": tuple(getattr(args, "allow_redirect", None) or ()),
    }


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    """--no-model and --trust-remote-code, as every command that runs `check()` takes them."""
    p.add_argument(
        "--no-model",
        dest="model",
        action="store_false",
        help="skip the model-aware load check (building the model named by config.json)",
    )
    p.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="let the load check run modelling code that sits in the checkpoint folder",
    )


def verdict_from_args(args: argparse.Namespace, scanned: ScannedCheckpoint) -> LoadVerdict | None:
    """The load verdict a command built with `add_model_arguments` asked for (None: --no-model)."""
    if not args.model:
        return None
    from inspector.model_load import load_verdict

    return load_verdict(scanned, trust_remote_code=args.trust_remote_code)


def scan_from_args(args: argparse.Namespace) -> ScannedCheckpoint:
    """Scan the PATH of a command built with `add_path_arguments`."""
    from inspector.scan import scan

    return scan(args.path, header_cap=args.header_cap, layout=args.layout, **remote_kwargs(args))


def _cmd_scan(args: argparse.Namespace) -> int:
    from inspector.summary import format_summary, summarize

    summary = summarize(scan_from_args(args))
    _emit(summary, args.json, format_summary)
    return EXIT_OK


def _cmd_check(args: argparse.Namespace) -> int:
    from inspector.checks import check
    from inspector.report_text import check_result, format_check

    scanned = scan_from_args(args)
    verdict = verdict_from_args(args, scanned)
    findings = check(
        scanned,
        deep=args.deep,
        values=args.values,
        model=verdict is not None,
        verdict=verdict,
    )
    result = check_result(scanned, findings, verdict=verdict, full=args.full)
    _emit(result, args.json, format_check)
    return _exit_for(result["counts"], args.fail_on)


def _cmd_diff(args: argparse.Namespace) -> int:
    from inspector.diff import diff_checkpoints
    from inspector.report_text import format_diff
    from inspector.scan import scan

    a = scan(args.a, header_cap=args.header_cap, **remote_kwargs(args))
    b = scan(args.b, header_cap=args.header_cap, **remote_kwargs(args))
    result = diff_checkpoints(a, b, data=args.data, reference=args.reference)
    _emit(result.to_dict(), args.json, format_diff)
    if args.reference:
        return EXIT_FOUND if result.unexpected or result.data_unreadable else EXIT_OK
    return EXIT_OK if result.identical else EXIT_FOUND


def _cmd_repair(args: argparse.Namespace) -> int:
    from inspector.repair import plan_repair
    from inspector.repair_all import plan_all

    if args.recover or args.discard_journal:
        return _journal_command(args)
    scanned = scan_from_args(args)
    only = set(args.only) if args.only else None
    every = only is None or "all" in only
    plan: RepairPlan | ReshardPlan | RestorePlan
    if args.source is not None:
        from inspector.restore import plan_restore
        from inspector.scan import scan

        if not every or (only and len(only) > 1) or args.duplicates:
            print(
                "ckpt-inspect: --from restores tensors on its own; run --only/--duplicates "
                "repairs separately",
                file=sys.stderr,
            )
            return EXIT_CANNOT
        reference = scan(args.source, header_cap=args.header_cap, **remote_kwargs(args))
        plan = plan_restore(scanned, reference, verify_data=args.verify_data)
    elif args.verify_data:
        print("ckpt-inspect: --verify-data goes with --from REF", file=sys.stderr)
        return EXIT_CANNOT
    elif every and only is not None and len(only) > 1:
        print("ckpt-inspect: --only all plans every part; name no other", file=sys.stderr)
        return EXIT_CANNOT
    elif every:
        plan = plan_all(
            scanned,
            duplicates=args.duplicates,
            max_shard_size=args.max_shard_size,
            output_dir=args.output_dir,
        )
    elif only and "reshard" in only:
        from inspector.reshard import plan_reshard

        if len(only) > 1:
            print(
                "ckpt-inspect: --only reshard rewrites the index itself; run it on its own, "
                "then the other repairs",
                file=sys.stderr,
            )
            return EXIT_CANNOT
        plan = plan_reshard(scanned, max_shard_size=args.max_shard_size)
    else:
        plan = plan_repair(
            scanned, only=only, duplicates=args.duplicates, output_dir=args.output_dir
        )
    print(plan.describe())
    if args.diff:
        print(plan.diff())
    if not plan.empty:
        print(_preview_text(plan, scanned))
    if plan.empty or args.dry_run:
        return EXIT_FOUND if plan.refused else EXIT_OK
    if not args.yes and not _confirm("apply this plan?"):
        print("not applied (use --yes to apply without asking)")
        return EXIT_FOUND
    result = plan.execute(backup=not args.no_backup)
    print(f"written: {', '.join(map(legible, result.written))}")
    checked = getattr(result, "data_checked", 0)  # a restore's data check
    if checked:
        print(f"verified: {checked:,} copied tensors hold the reference's bytes")
    if result.backup_dir:
        print(f"backup:  {legible(result.backup_dir)}")
    if result.remaining is None:
        print(
            "re-check: skipped (the checkpoint itself is unchanged; check it once the new "
            "files are in place)"
        )
    elif result.remaining:
        print(_remaining_text(scan_from_args(args), list(result.remaining)))
    else:
        print("re-check: no findings")
    return EXIT_FOUND if plan.refused else EXIT_OK


def _preview_text(plan: RepairPlan | ReshardPlan | RestorePlan, scanned: ScannedCheckpoint) -> str:
    """What the plan fixes and the issues left after it with their fixes: the checks re-run
    on the planned JSON in memory (`preview_repair`). Plans that write shards are checked
    once they ran."""
    from inspector.problems import group_problems
    from inspector.repair import RepairPlan, preview_repair, scanned_after
    from inspector.report_text import issue_dict, issue_lines
    from inspector.words import plural

    if not isinstance(plan, RepairPlan):
        return "preview: this plan writes shards; the checks run on the result once it is written"
    preview = preview_repair(plan, scanned)
    after = scanned_after(plan, scanned)
    left = group_problems(after, preview.remains + preview.introduces)
    lines = [
        "preview (every check re-run on the planned files, in memory): fixes "
        f"{plural(len(preview.fixes), 'finding')}"
        + (f", adds {plural(len(preview.introduces), 'finding')}" if preview.introduces else "")
    ]
    lines += issue_lines([issue_dict(p) for p in left]) or ["  nothing is left to fix"]
    return "\n".join(lines)


def _remaining_text(scanned: ScannedCheckpoint, remaining: list[Finding]) -> str:
    """The findings left after a repair, as issues with their fixes."""
    from inspector.problems import group_problems
    from inspector.report_text import issue_dict, issue_lines
    from inspector.words import plural

    issues = [issue_dict(p) for p in group_problems(scanned, remaining)]
    return "\n".join([f"remaining: {plural(len(remaining), 'finding')}", *issue_lines(issues)])


def _journal_command(args: argparse.Namespace) -> int:
    """`repair --recover` / `--discard-journal`: the user decides about a journal that was
    not replayed on its own (written elsewhere, by someone else, or before a reboot)."""
    from inspector.atomic import JOURNAL, discard_journal, folder_lock, read_journal, recover

    root = args.path
    if not isinstance(root, Path):
        print(
            f"ckpt-inspect: {legible(root)}: journals are local; run this on the local folder",
            file=sys.stderr,
        )
        return EXIT_CANNOT
    journal = read_journal(root)
    if journal is None:
        print(f"{legible(root)}: no unfinished write journal")
        return EXIT_OK
    print(journal.describe())
    verb = "finish" if args.recover else "remove"
    if args.dry_run:
        return EXIT_OK
    if not args.yes and not _confirm(f"{verb} this journal?"):
        print(f"not done (use --yes to {verb} it without asking)")
        return EXIT_FOUND
    with folder_lock(root):
        if args.discard_journal:
            discard_journal(root)
            print(f"removed {legible(root / JOURNAL)}; the files it names are untouched")
            return EXIT_OK
        done = recover(root, confirmed=True)
    print(
        f"renamed {len(done)} files" + (f": {', '.join(map(legible, done[:20]))}" if done else "")
    )
    return EXIT_OK


def _confirm(question: str) -> bool:
    if not sys.stdin.isatty():
        return False
    return input(f"{question} [y/N] ").strip().lower() in ("y", "yes")


def _cmd_consolidate(args: argparse.Namespace) -> int:
    import os

    from inspector.consolidate import plan_consolidation

    plan = plan_consolidation(
        _scan_path(args.src, args),
        args.dest,
        mapping=args.mapping,
        reference=args.reference,
        max_shard_size=args.max_shard_size,
        dtype=args.dtype,
        allow_partial=args.allow_partial,
    )
    lead = os.environ.get("RANK", "0") == "0"  # under torchrun only rank 0 prints
    if lead:
        print(plan)
    if args.dry_run:
        return EXIT_OK
    result = plan.execute(
        resume=args.resume,
        overwrite=args.overwrite,
        progress=lead and not args.no_progress,
        verify_data=args.verify_data,
        workers=args.workers,
        fsync=not args.no_fsync,
    )
    if lead:
        print(result)
    return EXIT_OK if result.ok else EXIT_FOUND


def _scan_path(path: Path | str, args: argparse.Namespace) -> ScannedCheckpoint:
    from inspector.scan import scan

    return scan(path, **remote_kwargs(args))


def _cmd_codes(args: argparse.Namespace) -> int:
    from inspector.codes import Code, codes_markdown

    if args.markdown:
        sys.stdout.write(codes_markdown())
        return EXIT_OK
    table = {
        c.value: {"severity": c.severity.value, "group": c.group, "help": c.help} for c in Code
    }
    if args.json:
        _emit(table, True, str)
        return EXIT_OK
    width = max(map(len, table))
    for code, row in table.items():
        print(f"{code:<{width}}  {row['severity']:<7}  {row['help']}")
    return EXIT_OK


def _cmd_demo(args: argparse.Namespace) -> int:
    from inspector.demo import write_demos

    write_demos(args.outdir)
    return EXIT_OK


def _exit_for(counts: dict[str, int], fail_on: str) -> int:
    if fail_on == "never":
        return EXIT_OK
    worst = ("error",) if fail_on == "error" else ("error", "warning")
    return EXIT_FOUND if any(counts.get(s, 0) for s in worst) else EXIT_OK


def _emit(obj: dict[str, Any], as_json: bool, render: Callable[[dict[str, Any]], str]) -> None:
    if as_json:
        json.dump(obj, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
    else:
        print(render(obj))
