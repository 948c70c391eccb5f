"""`ckpt-inspect repair`: rebuild the JSON files from the shards, re-shard, restore lost
tensors from a reference (`--from REF`), or finish / discard an unfinished write journal."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from inspector._internal.cli.args import (
    EXIT_CANNOT,
    EXIT_FOUND,
    EXIT_OK,
    add_model_arguments,
    add_options,
    add_remote_arguments,
    confirm,
    local_output,
    remote_kwargs,
    scan_from_args,
    target,
)
from inspector._internal.common.display import legible
from inspector._internal.common.text import plural
from inspector._internal.common.units import SHARD_SPLIT_SIZE, format_bytes
from inspector._internal.execution.atomic import (
    JOURNAL,
    LOCK,
    discard_journal,
    folder_lock,
    read_journal,
    recover_folder,
)
from inspector._internal.execution.temps import find_leftovers

if TYPE_CHECKING:
    from inspector._internal.checkpoint.scanned import ScannedCheckpoint
    from inspector._internal.findings.finding import Finding
    from inspector._internal.plans.repair import RepairPlan
    from inspector._internal.plans.reshard import ReshardPlan
    from inspector._internal.plans.restore import RestorePlan

__all__ = ["add_arguments", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of `repair` (its name and help: `cli.main.COMMANDS`)."""
    p.add_argument("path", type=target, help="checkpoint folder (or URL, with --output-dir)")
    p.add_argument(
        "--output-dir",
        type=local_output,
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
    add_model_arguments(p)
    add_options(p, "--header-cap")
    add_remote_arguments(p)
    journal = p.add_mutually_exclusive_group()
    journal.add_argument(
        "--recover",
        action="store_true",
        help="show the folder's unfinished write journal and the temp files killed runs left "
        "and, confirmed, finish the one and remove the others",
    )
    journal.add_argument(
        "--discard-journal",
        action="store_true",
        help="show the folder's unfinished write journal and remove it (its files stay)",
    )
    p.set_defaults(func=run, layout=None)


def run(args: argparse.Namespace) -> int:
    # Here, not at the top: `repair --help` imports this module and must stay light.
    from inspector._internal.plans.repair import plan_repair
    from inspector._internal.plans.repair_all import plan_all
    from inspector._internal.plans.reshard import plan_reshard
    from inspector._internal.plans.restore import plan_restore
    from inspector._internal.scan.entry import scan

    if args.recover or args.discard_journal:
        return _journal_command(args)
    scanned = scan_from_args(args)
    only = set(args.only) if args.only else None
    every = only is None or "all" in only
    plan: RepairPlan | ReshardPlan | RestorePlan
    if args.source is not None:
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
        print(_preview_text(plan, scanned, args))
    if plan.empty or args.dry_run:
        return EXIT_FOUND if plan.refused else EXIT_OK
    if not args.yes and not confirm("apply this plan?"):
        print("not applied (use --yes to apply without asking)")
        return EXIT_FOUND
    result = plan.execute(
        backup=not args.no_backup,
        model=args.model,
        trust_remote_code=args.trust_remote_code,
        cache=args.cache,
    )
    if result.written:
        print(f"written: {', '.join(map(legible, result.written))}")
    leftovers = getattr(result, "leftovers", None)  # a repair's: temp files of killed runs
    if leftovers:
        print("\n".join(leftovers.lines()))
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


def _preview_text(
    plan: RepairPlan | ReshardPlan | RestorePlan,
    scanned: ScannedCheckpoint,
    args: argparse.Namespace,
) -> str:
    """What the plan fixes and the issues left after it with their fixes: the checks re-run
    on the planned JSON in memory (`preview_repair`). Plans that write shards are checked
    once they ran."""
    from inspector._internal.diagnosis.issues import group_problems
    from inspector._internal.plans.repair import RepairPlan, preview_repair, scanned_after
    from inspector._internal.report.text import issue_dict, issue_lines

    if not isinstance(plan, RepairPlan):
        return "preview: this plan writes shards; the checks run on the result once it is written"
    preview = preview_repair(
        plan,
        scanned,
        model=args.model,
        trust_remote_code=args.trust_remote_code,
        cache=args.cache,
    )
    after = scanned_after(plan, scanned)
    left = group_problems(after, preview.remains + preview.introduces)
    # A plan may change what no finding code covers (`total_parameters` added to an index
    # that stated none: total-parameters-mismatch is about a stated count): it says so, and
    # what it changes, rather than "fixes 0 findings".
    changes = "; ".join(f"{w.path}: {', '.join(w.changes)}" for w in plan.writes)
    fixes = (
        f"fixes {plural(len(preview.fixes), 'finding')}"
        if preview.fixes or not changes
        else f"fixes no finding; it changes {changes}"
    )
    lines = [
        f"preview (every check re-run on the planned files, in memory): {fixes}"
        + (f", adds {plural(len(preview.introduces), 'finding')}" if preview.introduces else "")
    ]
    lines += issue_lines([issue_dict(p) for p in left]) or ["  nothing is left to fix"]
    return "\n".join(lines)


def _remaining_text(scanned: ScannedCheckpoint, remaining: list[Finding]) -> str:
    """The findings left after a repair, as issues with their fixes."""
    from inspector._internal.diagnosis.issues import group_problems
    from inspector._internal.report.text import issue_dict, issue_lines

    issues = [issue_dict(p) for p in group_problems(scanned, remaining)]
    return "\n".join([f"remaining: {plural(len(remaining), 'finding')}", *issue_lines(issues)])


def _journal_command(args: argparse.Namespace) -> int:
    """`repair --recover` / `--discard-journal`: the user decides about a journal that was
    not replayed on its own (written elsewhere, by someone else, or before a reboot), and
    `--recover` removes the temp files a killed run left (those established as ours)."""
    root = args.path
    if not isinstance(root, Path):
        print(
            f"ckpt-inspect: {legible(root)}: journals are local; run this on the local folder",
            file=sys.stderr,
        )
        return EXIT_CANNOT
    journal = read_journal(root)
    # What the recovery would remove under the lock, and the look-alikes it leaves.
    leftovers = find_leftovers(root, locked=True, outputs=True) if args.recover else None
    if journal is None and not leftovers:
        print(f"{legible(root)}: no unfinished write journal")
        if args.recover and not args.dry_run and os.path.lexists(root / LOCK):
            # A lock file a killed run left: free (the kernel dropped the lock with it), and
            # taking the lock then dropping it removes the file; a live holder is one line.
            with folder_lock(root):
                pass
            print(f"removed {legible(root / LOCK)}, left by a run that is gone")
        return EXIT_OK
    if journal is not None:
        print(journal.describe())
    if leftovers:
        print(f"{legible(root)}: temp files of killed runs")
        print("\n".join(f"  {line}" for line in leftovers.lines()))
    if journal is None and (leftovers is None or not leftovers.removable):
        return EXIT_OK  # only entries to review: nothing this command removes
    verb = "finish" if args.recover else "remove"
    if args.dry_run:
        return EXIT_OK
    if not args.yes and not confirm(f"{verb} this journal?" if journal else "remove them?"):
        print(f"not done (use --yes to {verb} it without asking)")
        return EXIT_FOUND
    with folder_lock(root):
        if args.discard_journal:
            discard_journal(root)
            print(f"removed {legible(root / JOURNAL)}; the files it names are untouched")
            return EXIT_OK
        done = recover_folder(root, confirmed=True)
    if journal is not None:
        shown = f": {', '.join(map(legible, done.renamed[:20]))}" if done.renamed else ""
        print(f"renamed {len(done.renamed)} files{shown}")
    if done.leftovers:
        print("\n".join(done.leftovers.lines()))
    return EXIT_OK
