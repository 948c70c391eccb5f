"""Running a plan, alone or under torchrun: which process writes which outputs, the
barriers, the index written last by rank 0, then verification."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from inspector._internal.common.filenames import INDEX_NAME
from inspector._internal.findings.finding import Finding
from inspector._internal.plans.consolidate.dest import Dest, foreign_entries, is_complete, refusal
from inspector._internal.plans.consolidate.engine import (
    Progress,
    Sealer,
    copy_metadata,
    write_index,
    write_output,
)
from inspector._internal.plans.consolidate.records import ConsolidationResult, Execution
from inspector._internal.plans.consolidate.verify import verify as verify_output
from inspector.errors import InspectorError

if TYPE_CHECKING:
    # Only a type: the plan imports this module to execute itself.
    from inspector._internal.plans.consolidate.plan import ConsolidationPlan

__all__ = ["Distributed", "execute_plan"]


def execute_plan(plan: ConsolidationPlan, run: Execution) -> ConsolidationResult:
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
        replaced = tuple(f.name for f in foreign if f.replaced)
        if dist.rank == 0:
            backup = dest.retire(list(replaced))
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
            sealer = Sealer(dest, fsync=run.fsync)
            try:
                with ThreadPoolExecutor(max_workers=max(1, run.workers)) as pool:
                    list(pool.map(lambda o: write_output(plan, o, bar, sealer), todo))
            finally:
                sealer.wait()
        finally:
            bar.close()
        # 3. Everyone done: rank 0 copies the metadata files and writes the index last.
        dist.barrier()
        index_file: str | None = None
        copied: tuple[str, ...] = ()
        if dist.rank == 0:
            copied = copy_metadata(plan, dest)
            index_file = write_index(plan, dest)
    # Nobody returns before the index exists; rank 0 then verifies alone (it may take long).
    dist.finish()
    findings: Sequence[Finding] = ()
    checked = 0
    mismatches: Sequence[str] = ()
    if dist.rank == 0 and (run.verify or run.verify_data):
        findings, checked, mismatches = verify_output(plan, checks=run.verify, data=run.verify_data)
    return ConsolidationResult(
        dest=plan.dest,
        written=tuple(o.name for o in todo),
        skipped=tuple(o.name for o in skipped),
        bytes_written=bar.done,
        seconds=time.perf_counter() - started,
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
    )


class Distributed:
    """Rank and world size from the arguments or torchrun's environment; a gloo group on CPU
    when several processes share the work (created only if none exists)."""

    def __init__(self, rank: int, world_size: int, owns_group: bool) -> None:
        self.rank, self.world_size, self.owns_group = rank, world_size, owns_group

    @classmethod
    def start(cls, rank: int | None, world_size: int | None) -> Distributed:
        env_world = int(os.environ.get("WORLD_SIZE", "1"))
        world = world_size if world_size is not None else env_world
        me = rank if rank is not None else int(os.environ.get("RANK", "0"))
        if world <= 1:
            return cls(0, 1, False)
        if not 0 <= me < world:
            raise InspectorError(f"rank {me} is outside world size {world}")
        import torch.distributed as dist

        owns = not dist.is_initialized()
        if owns:
            dist.init_process_group("gloo", rank=me, world_size=world)
        return cls(dist.get_rank(), dist.get_world_size(), owns)

    def barrier(self) -> None:
        if self.world_size > 1:
            import torch.distributed as dist

            dist.barrier()

    def finish(self) -> None:
        if self.world_size > 1:
            import torch.distributed as dist

            dist.barrier()
            if self.owns_group:
                dist.destroy_process_group()
