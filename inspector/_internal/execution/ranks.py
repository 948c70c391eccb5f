"""Several processes sharing one job: under torchrun (`RANK`, `WORLD_SIZE`) or an explicit rank
and world size, on CPU over gloo. The one engine for every command that splits its work over
ranks (consolidation: output i on rank i % world size; `manifest`, `verify`: files balanced
by bytes, rank 0 gathers). Why JSON, never pickles, and why a group lives as long as the
process: docs/architecture.md, "execution/".
"""

from __future__ import annotations

import atexit
import heapq
import os
from collections.abc import Sequence
from typing import Any, TypeVar

from inspector.errors import InspectorError

__all__ = ["Distributed", "balance", "is_lead"]

T = TypeVar("T")

# The gloo group made beside a default group of another backend, made once per process (a
# new group is a collective every rank joins; a training loop would otherwise make one per
# save).
_CPU_GROUP: list[Any] = []


def is_lead() -> bool:
    """True in the process that prints and writes: rank 0 under torchrun, or a lone process."""
    return os.environ.get("RANK", "0") == "0"


class Distributed:
    """This process's rank and the world size (0 of 1 alone); collectives over gloo."""

    def __init__(self, rank: int, world_size: int, group: Any = None) -> None:
        self.rank, self.world_size, self.group = rank, world_size, group

    @classmethod
    def alone(cls) -> Distributed:
        return cls(0, 1)

    @classmethod
    def start(cls, rank: int | None = None, world_size: int | None = None) -> Distributed:
        """The ranks of this job, from the arguments or torchrun's environment; joins the
        job's process group, creating a gloo one (127.0.0.1 or `MASTER_ADDR`) if none
        exists. Every rank must call it at the same point."""
        env_world = int(os.environ.get("WORLD_SIZE", "1"))
        world = world_size if world_size is not None else env_world
        me = rank if rank is not None else int(os.environ.get("RANK", "0"))
        if world <= 1:
            return cls.alone()
        if not 0 <= me < world:
            raise InspectorError(f"rank {me} is outside world size {world}")
        import torch.distributed as dist

        if not dist.is_initialized():
            dist.init_process_group("gloo", rank=me, world_size=world)
            atexit.register(_destroy)
        return cls(dist.get_rank(), dist.get_world_size(), _cpu_group(dist))

    @property
    def lead(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        if self.world_size > 1:
            import torch.distributed as dist

            dist.barrier(group=self.group)

    def finish(self) -> None:
        """Nobody goes on before everyone is done (the group stays for later calls)."""
        self.barrier()

    # -- exchanging bytes -----------------------------------------------------------------

    def broadcast_bytes(self, data: bytes) -> bytes:
        """Rank 0's `data`, on every rank."""
        if self.world_size == 1:
            return data
        import torch
        import torch.distributed as dist

        size = torch.tensor([len(data) if self.lead else 0], dtype=torch.int64)
        dist.broadcast(size, src=0, group=self.group)
        n = int(size.item())
        if n == 0:
            return b""
        buf = _tensor_of(data) if self.lead else torch.empty(n, dtype=torch.uint8)
        dist.broadcast(buf, src=0, group=self.group)
        return data if self.lead else buf.numpy().tobytes()

    def all_gather_bytes(self, data: bytes) -> list[bytes]:
        """Every rank's `data`, in rank order, on every rank (each padded to the longest for
        the exchange: the ranks' shares are balanced, so are their results)."""
        if self.world_size == 1:
            return [data]
        import torch
        import torch.distributed as dist

        sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(self.world_size)]
        dist.all_gather(sizes, torch.tensor([len(data)], dtype=torch.int64), group=self.group)
        lengths = [int(s.item()) for s in sizes]
        longest = max(lengths)
        if longest == 0:
            return [b""] * self.world_size
        mine = torch.zeros(longest, dtype=torch.uint8)
        if data:
            mine[: len(data)] = _tensor_of(data)
        parts = [torch.empty(longest, dtype=torch.uint8) for _ in range(self.world_size)]
        dist.all_gather(parts, mine, group=self.group)
        return [p[:n].numpy().tobytes() for p, n in zip(parts, lengths, strict=True)]

    def share(self, items: Sequence[tuple[T, int]]) -> list[tuple[T, int]]:
        """This rank's part of `items` ((item, bytes), the same list on every rank), split
        by bytes with `balance`."""
        return balance(items, self.world_size)[self.rank]


def balance(items: Sequence[tuple[T, int]], parts: int) -> list[list[tuple[T, int]]]:
    """`items` ((item, bytes)) in `parts` lists of near-equal bytes: the largest first, each
    to the part with the fewest bytes so far (the lowest part on a tie). The largest part is
    at most 4/3 of the best split's, and the split depends only on the items' order and sizes,
    so every rank computes the same one."""
    out: list[list[tuple[T, int]]] = [[] for _ in range(max(1, parts))]
    heap = [(0, p) for p in range(len(out))]
    order = sorted(range(len(items)), key=lambda i: (-items[i][1], i))
    for i in order:
        load, p = heapq.heappop(heap)
        out[p].append(items[i])
        heapq.heappush(heap, (load + max(0, items[i][1]), p))
    return out


def _tensor_of(data: bytes) -> Any:
    import torch

    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def _cpu_group(dist: Any) -> Any:
    """None (the default group) when it is gloo; else one gloo group over every rank."""
    if dist.get_backend() == "gloo":
        return None
    if not _CPU_GROUP:
        _CPU_GROUP.append(dist.new_group(backend="gloo"))
    return _CPU_GROUP[0]


def _destroy() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
