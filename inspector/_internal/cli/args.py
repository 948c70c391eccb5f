"""What the commands share: the checkpoint argument, the options of reading (local and
remote) and of the load check, and how a command prints its result and exits.

Light on purpose: `ckpt-inspect <command> --help` imports this and the command's module only,
so the readers (numpy, pandas, the remote stack) are imported inside the functions that run
a command, never at the top of a module of `cli/`."""

from __future__ import annotations

import argparse
import gc
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from inspector._internal.cli import EXIT_CANNOT, EXIT_FOUND, EXIT_OK
from inspector._internal.common.defaults import (
    DEFAULT_CONCURRENCY,
    DEFAULT_HEADER_CAP,
    DEFAULT_READ_AHEAD,
    DEFAULT_READ_TIMEOUT,
    DEFAULT_TIMEOUT,
    MIN_READ_AHEAD,
)
from inspector._internal.common.display import legible

if TYPE_CHECKING:
    from inspector._internal.checkpoint.scanned import ScannedCheckpoint
    from inspector._internal.load.verdict import LoadVerdict

__all__ = [
    "EXIT_CANNOT",
    "EXIT_FOUND",
    "EXIT_OK",
    "add_model_arguments",
    "add_options",
    "add_path_arguments",
    "add_remote_arguments",
    "confirm",
    "emit",
    "exit_for",
    "local_output",
    "number",
    "remote_kwargs",
    "scan_from_args",
    "scan_path",
    "settled",
    "target",
    "verdict_from_args",
    "write_json",
]


def target(text: str) -> Path | str:
    """A command-line checkpoint: a URL stays a string (s3://, gs://, hf://, https://), a
    local path becomes a Path."""
    from inspector._internal.storage.urls import is_remote

    return text if is_remote(text) else Path(text)


def local_output(text: str) -> Path:
    """A folder or file this command writes: local only. A URL is refused in one line
    (as a Path, `s3://bucket/x` would silently be the local folder `./s3:/bucket/x`)."""
    from inspector._internal.storage.urls import scheme_of

    if scheme_of(text) is not None:
        raise argparse.ArgumentTypeError(
            f"{legible(text)}: a URL; ckpt-inspect writes only local folders and files "
            "(nothing is uploaded): name a local path"
        )
    return Path(text)


def add_path_arguments(p: argparse.ArgumentParser) -> None:
    """PATH, --json, --header-cap and --layout, as every read-only command takes them, and
    the options of remote storage (`add_remote_arguments`)."""
    p.add_argument(
        "path",
        type=target,
        help="checkpoint folder or .safetensors file, or a URL: s3://bucket/prefix, gs://..., "
        "hf://org/repo[@revision][/subfolder], https://host/folder/",
    )
    add_options(p, "--json", "--header-cap")
    p.add_argument("--layout", help="force a layout instead of detecting it")
    add_remote_arguments(p)


# Options that several commands take, spelled once: `add_options(p, "--json", ...)`.
_SHARED_OPTIONS: dict[str, dict[str, Any]] = {
    "--json": {"action": "store_true", "help": "print one JSON object"},
    "--header-cap": {
        "type": int,
        "default": DEFAULT_HEADER_CAP,
        "metavar": "BYTES",
        "help": f"largest safetensors header to read (default {DEFAULT_HEADER_CAP:,})",
    },
    "--fail-on": {
        "choices": ("error", "warning", "never"),
        "default": "error",
        "help": "exit 1 when a finding of this severity or worse exists (default: error)",
    },
    "--workers": {"type": int, "metavar": "N", "help": "files hashed at once"},
}


def add_options(p: argparse.ArgumentParser, *flags: str) -> None:
    """The shared options `flags` (keys of `_SHARED_OPTIONS`), as every command spells them."""
    for flag in flags:
        p.add_argument(flag, **_SHARED_OPTIONS[flag])


def add_remote_arguments(p: argparse.ArgumentParser) -> None:
    """--storage-option, --max-concurrency, --read-ahead, --timeout, --read-timeout and
    --allow-redirect (remote checkpoints)."""
    group = p.add_argument_group("remote checkpoints (s3://, gs://, hf://, https://)")
    group.add_argument(
        "--storage-option",
        action="append",
        default=[],
        type=storage_option,
        metavar="KEY=VALUE",
        help="passed to the fsspec file system (repeatable; VALUE is JSON when it parses: "
        "anon=true, endpoint_url=http://..., client_kwargs.region_name=eu-west-1); credentials "
        "come from the usual places (AWS_PROFILE, AWS_ENDPOINT_URL, gcloud ADC, HF_TOKEN)",
    )
    group.add_argument(
        "--max-concurrency",
        type=positive,
        default=DEFAULT_CONCURRENCY,
        metavar="N",
        help=f"requests in flight at once (default {DEFAULT_CONCURRENCY})",
    )
    group.add_argument(
        "--read-ahead",
        type=_read_ahead,
        default=DEFAULT_READ_AHEAD,
        metavar="BYTES",
        help="bytes fetched by the first ranged read of each shard; headers that fit cost one "
        f"request (default {DEFAULT_READ_AHEAD:,})",
    )
    group.add_argument(
        "--timeout",
        type=seconds,
        default=DEFAULT_TIMEOUT,
        metavar="SECONDS",
        help="longest one request (a listing, a read of up to 8 MiB) may take, retries "
        f"included; a server that trickles or stalls ends there (default {DEFAULT_TIMEOUT:g})",
    )
    group.add_argument(
        "--read-timeout",
        type=seconds,
        default=DEFAULT_READ_TIMEOUT,
        metavar="SECONDS",
        help="longest a connection may bring no byte before the request is tried again "
        f"(default {DEFAULT_READ_TIMEOUT:g})",
    )
    group.add_argument(
        "--allow-redirect",
        action="append",
        default=[],
        type=origin_option,
        metavar="ORIGIN",
        help="also follow redirects to ORIGIN (https://host[:port]; repeatable); by default "
        "a redirect is followed only within the origin a request went to",
    )


def storage_option(text: str) -> tuple[str, object]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"{text!r}: expected KEY=VALUE, e.g. anon=true")
    try:
        parsed: object = json.loads(value)
    except ValueError:
        parsed = value
    return key.strip(), parsed


_N = TypeVar("_N", int, float)


def number(
    convert: Callable[[str], _N], what: str, ok: Callable[[_N], bool], bound: str
) -> Callable[[str], _N]:
    """An option's type: the text `convert`ed ("'x': expected WHAT" when it is none), a value
    `ok` refuses said by `bound` (formatted with the `text` and the `value`)."""

    def parse(text: str) -> _N:
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: expected {what}") from None
        if not ok(value):
            raise argparse.ArgumentTypeError(bound.format(text=text, value=value))
        return value

    return parse


positive = number(int, "a whole number", lambda v: v >= 1, "{value}: expected 1 or more")
# Before: `--read-ahead 4` passed `positive` and ended the command as an internal error.
_read_ahead = number(
    int,
    "a whole number of bytes",
    lambda v: v >= MIN_READ_AHEAD,
    f"{{value}}: expected at least {MIN_READ_AHEAD} bytes (a header's length field)",
)
seconds = number(
    float, "a number of seconds", lambda v: v > 0, "{text}: expected more than 0 seconds"
)


def sample_windows(text: str) -> int:
    from inspector._internal.formats.value_reading import SampleBudget

    value = positive(text)
    if value > SampleBudget.MAX_WINDOWS:
        raise argparse.ArgumentTypeError(
            f"{value:,} windows: expected at most {SampleBudget.MAX_WINDOWS:,} a tensor "
            "(for more, read every byte with --values full)"
        )
    return value


def origin_option(text: str) -> str:
    from inspector._internal.storage.guard import origin

    try:
        return origin(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def remote_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """The keyword arguments of `scan` for the remote options of a command."""
    return {
        "storage_options": dict(getattr(args, "storage_option", None) or []),
        "max_concurrency": getattr(args, "max_concurrency", DEFAULT_CONCURRENCY),
        "read_ahead": getattr(args, "read_ahead", DEFAULT_READ_AHEAD),
        "timeout": getattr(args, "timeout", DEFAULT_TIMEOUT),
        "read_timeout": getattr(args, "read_timeout", DEFAULT_READ_TIMEOUT),
        "allow_redirects": tuple(getattr(args, "allow_redirect", None) or ()),
    }


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    """--no-model, --trust-remote-code and --no-cache, as every command that runs `check()`
    takes them."""
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
    p.add_argument(
        "--no-cache",
        dest="cache",
        action="store_false",
        help="compute the load check's verdict again instead of taking the one kept in the "
        "user's cache for this very checkpoint, and keep the new one",
    )


def verdict_from_args(args: argparse.Namespace, scanned: ScannedCheckpoint) -> LoadVerdict | None:
    """The load verdict a command built with `add_model_arguments` asked for (None: --no-model)."""
    if not args.model:
        return None
    from inspector._internal.load.verdict import load_verdict

    return load_verdict(scanned, trust_remote_code=args.trust_remote_code, cache=args.cache)


def scan_from_args(args: argparse.Namespace) -> ScannedCheckpoint:
    """Scan the PATH of a command built with `add_path_arguments`."""
    from inspector._internal.scan.entry import scan

    return scan(args.path, header_cap=args.header_cap, layout=args.layout, **remote_kwargs(args))


def scan_path(path: Path | str, args: argparse.Namespace) -> ScannedCheckpoint:
    from inspector._internal.scan.entry import scan

    return scan(path, **remote_kwargs(args))


def exit_for(counts: dict[str, int], fail_on: str) -> int:
    if fail_on == "never":
        return EXIT_OK
    worst = ("error",) if fail_on == "error" else ("error", "warning")
    return EXIT_FOUND if any(counts.get(s, 0) for s in worst) else EXIT_OK


def emit(obj: dict[str, Any], as_json: bool, render: Callable[[dict[str, Any]], str]) -> None:
    if as_json:
        write_json(obj)
    else:
        print(render(obj))


def write_json(obj: object) -> None:
    """`obj` as indented JSON on stdout. ASCII only: a control character or a bidi override
    in a checkpoint's name is a `\\u` escape, never a raw byte in a terminal or a CI log."""
    json.dump(obj, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")


def confirm(question: str) -> bool:
    if not sys.stdin.isatty():
        return False
    return input(f"{question} [y/N] ").strip().lower() in ("y", "yes")


def settled(args: argparse.Namespace) -> None:
    """What the command made so far lives until it ends: moved out of the garbage collector's
    sight (`gc.freeze`), so that its passes, and the last one as the process exits, do not
    walk it again. The imports (made with the collector paused) and the scan leave about a
    million objects at 300,000 tensors, and walking them cost 0.1-0.15 s of CPU (6-8% of the
    command). Only when this process is the command (`cli.main.main` without `argv`): a
    caller's objects would be frozen with it, and `gc.unfreeze` would give back the caller's
    own frozen ones too (before: every `main(argv)` of a test undid conftest's `gc.freeze`)."""
    if args.whole_process:
        gc.freeze()
