"""Running a plan, alone or under torchrun: which process writes which outputs, the
barriers, the index written last by rank 0, then the recheck."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait

from inspector._internal.common.filenames import INDEX_NAME
from inspector._internal.execution.ranks import Distributed
from inspector._internal.execution.temps import Leftovers
from inspector._internal.findings.finding import Finding
from inspector._internal.plans.consolidate.dest import Dest, foreign_entries, is_complete, refusal
from inspector._internal.plans.consolidate.engine import (
    Finisher,
    Progress,
    copy_metadata,
    write_index,
    write_output,
)
from inspector._internal.plans.consolidate.recheck import recheck
from inspector._internal.plans.consolidate.records import (
    ConsolidationResult,
    Execution,
    OutputFile,
    PlanView,
)

__all__ = ["execute_plan"]


def _write_all(
    plan: PlanView, todo: list[OutputFile], bar: Progress, finisher: Finisher, workers: int
) -> None:
    """Every output of `todo`, `workers` at a time. The first that fails stops the run: the
    outputs not started are not written (those being written finish), and its error is
    raised."""
    failed = threading.Event()

    def one(output: OutputFile) -> None:
        if failed.is_set():  # taken from the queue after a failure, before it was cancelled
            return
        try:
            write_output(plan, output, bar, finisher)
        except BaseException:
            failed.set()
            raise

    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        futures = [pool.submit(one, o) for o in todo]
        wait(futures, return_when=FIRST_EXCEPTION)
        for future in futures:
            future.cancel()
    for future in futures:
        if not future.cancelled():
            future.result()  # the first failure, in plan order


def execute_plan(plan: PlanView, run: Execution) -> ConsolidationResult:
    started = time.perf_counter()
    dist = Distributed.start(run.rank, run.world_size)
    with Dest.open(plan.dest) as dest:
        # 1. Nothing is written into a DEST that holds anything but this plan's own output,
        # unless `overwrite`: every rank looks before any rank writes.
        foreign = foreign_entries(dest, plan)
        if foreign and not run.overwrite:
            raise refusal(plan.dest, foreign)
        dist.barrier()
        backup = None
        leftovers = Leftovers()
        replaced = tuple(f.name for f in foreign if f.replaced)
        if dist.rank == 0:
            backup = dest.retire(list(replaced))
            leftovers = dest.clear_leftovers(plan)
            # A stale index would make a half-rewritten folder look complete; the new one
            # comes last.
            dest.remove(INDEX_NAME)
        dist.barrier()
        # 2. Which outputs are ours (output i goes to rank i % world_size, as torch does),
        # each written as `<name>.partial` renamed when complete.
        mine = [o for o in plan.outputs if o.index % dist.world_size == dist.rank]
        skipped = [o for o in mine if run.resume and is_complete(dest, o)]
        todo = [o for o in mine if o not in skipped]
        bar = Progress(sum(o.size for o in todo), run.progress)
        try:
            finisher = Finisher(dest, fsync=run.fsync)
            try:
                _write_all(plan, todo, bar, finisher, run.workers)
            finally:
                finisher.wait()
        finally:
            bar.close()
        # 3. Everyone done: rank 0 copies the metadata files and writes the index last.
        dist.barrier()
        index_file: str | None = None
        copied: tuple[str, ...] = ()
        if dist.rank == 0:
            copied = copy_metadata(plan, dest)
            index_file = write_index(plan, dest) if plan.index_file else None
    # Nobody returns before the index exists; rank 0 then verifies alone (it may take long).
    dist.finish()
    findings: Sequence[Finding] = ()
    checked = 0
    mismatches: Sequence[str] = ()
    if dist.rank == 0 and (run.verify or run.verify_data):
        findings, checked, mismatches = recheck(plan, checks=run.verify, data=run.verify_data)
    return ConsolidationResult(
        dest=plan.dest,
        written=tuple(o.name for o in todo),
        skipped=tuple(o.name for o in skipped),
        bytes_written=bar.done,
        seconds=time.perf_counter() - started,
        copy_seconds=bar.seconds,
        index_file=index_file,
        metadata_files=copied,
        rank=dist.rank,
        world_size=dist.world_size,
        verified=dist.rank == 0 and run.verify,
        findings=tuple(findings),
        data_checked=checked,
        data_mismatches=tuple(mismatches),
        partial=plan.partial,
        backup=backup,
        replaced=replaced if backup is not None else (),
        leftovers=leftovers,
    )
