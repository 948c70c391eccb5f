"""Do a tensor's stored chunks cover its full shape exactly once? The one coverage algorithm,
used by the DCP and the torch_dist checks. Pure.

Exact, never allocates the tensor, and bounded on hostile input. In order:

1. a chunk outside the full shape is reported at once (corrupt metadata);
2. a regular grid (how TP, EP and FSDP shard: along each axis the chunks' intervals tile
   the axis, and every cell of that grid is one chunk) is complete, proven in pure Python;
3. chunks that differ along one axis only (row- or column-sharded, possibly with a gap) are
   one sorted interval sweep along it;
4. otherwise a grid of counters over the chunk boundaries (one cell per box between
   consecutive boundaries on every axis) says exactly which regions no chunk or several
   chunks cover, up to `MAX_CELLS` cells and 32 axes;
5. past that only volumes are compared (`exact` False).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from math import prod

import numpy as np

__all__ = ["MAX_CELLS", "Box", "Chunk", "Coverage", "coverage"]

# (offsets, sizes) of one stored chunk.
Chunk = tuple[tuple[int, ...], tuple[int, ...]]
# A region as (start, stop) per axis.
Box = tuple[tuple[int, int], ...]

# Cells of the exact counter grid; past this only volumes are compared.
MAX_CELLS = 4_000_000
# Uncovered regions kept for a message; counting them all could be huge.
MAX_HOLES = 3


@dataclass(frozen=True, slots=True)
class Coverage:
    """What the chunks of one tensor cover.

    `covered` elements are in at least one chunk and `multiple` in more than one (both exact
    unless `exact` is False, when only the sum of chunk volumes, `volume`, is known). `holes`
    are a few uncovered boxes; `overlap` the first pair of overlapping chunks (indices into
    the input) and `overlap_at` where they meet; `outside` the first chunk that does not fit
    the full shape (then nothing else was computed).
    """

    total: int
    volume: int
    covered: int = 0
    multiple: int = 0
    holes: tuple[Box, ...] = ()
    overlap: tuple[int, int] | None = None
    overlap_at: tuple[int, ...] | None = None
    outside: int | None = None
    exact: bool = True

    @property
    def complete(self) -> bool:
        """Every element in exactly one chunk (as far as volumes tell when not exact)."""
        if self.outside is not None:
            return False
        if not self.exact:
            return self.volume == self.total
        return self.covered == self.total and self.multiple == 0


def coverage(full: tuple[int, ...], chunks: Iterable[Chunk]) -> Coverage:
    """How `chunks` ((offsets, sizes) each) cover a tensor of shape `full`."""
    chunks = list(chunks)
    total = prod(full)
    volume = sum(prod(s) for _, s in chunks)
    # 1. Chunks that do not fit are corrupt metadata; nothing else can be trusted.
    for i, (offsets, sizes) in enumerate(chunks):
        if len(offsets) != len(full) or len(sizes) != len(full):
            return Coverage(total, volume, outside=i)
        if any(o + s > d for o, s, d in zip(offsets, sizes, full, strict=True)):
            return Coverage(total, volume, outside=i)
    if total == 0:
        return Coverage(total, volume)
    live = [i for i, (_, sizes) in enumerate(chunks) if 0 not in sizes]
    if not live:
        return Coverage(total, volume, holes=(tuple((0, d) for d in full),))
    if not full:  # a scalar: every chunk is the whole tensor
        pair = (live[0], live[1]) if len(live) > 1 else None
        return Coverage(1, volume, 1, int(len(live) > 1), (), pair, () if pair else None)
    boxes = [chunks[i] for i in live]
    # 2. The common case by far: a regular grid (one chunk is the grid of one cell).
    if _regular_grid(full, boxes):
        return Coverage(total, volume, covered=total)
    # 3. One axis varies and the others span the tensor: one interval sweep.
    varying = [d for d in range(len(full)) if len({(o[d], s[d]) for o, s in boxes}) > 1]
    axis = varying[0] if varying else 0
    first_o, first_s = boxes[0]
    spans = all(first_o[d] == 0 and first_s[d] == full[d] for d in range(len(full)) if d != axis)
    if len(varying) <= 1 and spans:
        return _sweep(full, boxes, live, axis, volume)
    # 4. The exact counter grid, or 5. volumes only.
    bounds = [
        sorted({0, d, *(o[i] for o, _ in boxes), *(o[i] + s[i] for o, s in boxes)})
        for i, d in enumerate(full)
    ]
    # numpy arrays have at most 64 axes: a hostile 400-axis shape gets the volume check only.
    if len(full) > 32 or prod(len(b) - 1 for b in bounds) > MAX_CELLS:
        return Coverage(total, volume, exact=False)
    return _grid(full, boxes, live, bounds, volume)


def _regular_grid(full: tuple[int, ...], chunks: Sequence[Chunk]) -> bool:
    """True when the chunks are exactly the cells of a grid partition of `full`: along each
    axis their intervals tile [0, size) with neither gap nor overlap, and every cell of that
    grid appears once."""
    cells = 1
    for d, size in enumerate(full):
        pos = 0
        spans = sorted({(o[d], s[d]) for o, s in chunks})
        for start, length in spans:
            if start != pos or length == 0:
                return False
            pos = start + length
        if pos != size:
            return False
        cells *= len(spans)
    return cells == len(chunks) == len({o for o, _ in chunks})


def _sweep(
    full: tuple[int, ...], boxes: list[Chunk], live: list[int], axis: int, volume: int
) -> Coverage:
    """Chunks that differ along `axis` only and span every other axis: a sorted pass."""
    other = prod(full) // full[axis]
    order = sorted(range(len(boxes)), key=lambda k: (boxes[k][0][axis], boxes[k][1][axis]))
    covered = multiple = reach = 0
    holder: int | None = None
    holes: list[Box] = []
    overlap: tuple[int, int] | None = None
    at: tuple[int, ...] | None = None
    whole = tuple((0, d) for d in full)
    for k in order:
        start = boxes[k][0][axis]
        end = start + boxes[k][1][axis]
        if start > reach and len(holes) < MAX_HOLES:
            holes.append(_with(whole, axis, (reach, start)))
        if start < reach and holder is not None and overlap is None:
            overlap = (live[holder], live[k])
            at = tuple(start if d == axis else 0 for d in range(len(full)))
        if end > reach:
            covered += end - max(start, reach)
            reach, holder = end, k
    if reach < full[axis] and len(holes) < MAX_HOLES:
        holes.append(_with(whole, axis, (reach, full[axis])))
    if overlap is not None:
        multiple = _depth_two(boxes, axis)
    return Coverage(
        prod(full), volume, covered * other, multiple * other, tuple(holes), overlap, at
    )


def _depth_two(boxes: list[Chunk], axis: int) -> int:
    """Length along `axis` covered by two chunks or more."""
    events = sorted([(o[axis], 1) for o, _ in boxes] + [(o[axis] + s[axis], -1) for o, s in boxes])
    depth = length = 0
    prev = events[0][0]
    for pos, delta in events:
        if depth >= 2:
            length += pos - prev
        depth += delta
        prev = pos
    return length


def _with(box: Box, axis: int, span: tuple[int, int]) -> Box:
    return (*box[:axis], span, *box[axis + 1 :])


def _grid(
    full: tuple[int, ...], boxes: list[Chunk], live: list[int], bounds: list[list[int]], volume: int
) -> Coverage:
    """A counter per cell of the boundary grid: 0 uncovered, 2+ overlapped."""
    counts = np.zeros([len(b) - 1 for b in bounds], dtype=np.int32)
    index = [{v: i for i, v in enumerate(b)} for b in bounds]
    for offsets, sizes in boxes:
        cell = tuple(
            slice(index[d][o], index[d][o + s])
            for d, (o, s) in enumerate(zip(offsets, sizes, strict=True))
        )
        counts[cell] += 1
    cell_volume: np.ndarray = np.ones(counts.shape, dtype=np.int64)
    widths = [np.diff(np.asarray(b, dtype=np.int64)) for b in bounds]
    for d, w in enumerate(widths):
        cell_volume = cell_volume * w.reshape([-1 if i == d else 1 for i in range(len(widths))])
    total = prod(full)
    missing = int(cell_volume[counts == 0].sum())
    multiple = int(cell_volume[counts > 1].sum())
    holes = tuple(
        tuple((bounds[d][i], bounds[d][i + 1]) for d, i in enumerate(cell))
        for cell in np.argwhere(counts == 0)[:MAX_HOLES].tolist()
    )
    overlap: tuple[int, int] | None = None
    at: tuple[int, ...] | None = None
    if multiple:
        cell = np.argwhere(counts > 1)[0].tolist()
        at = tuple(bounds[d][i] for d, i in enumerate(cell))
        inside = [
            k
            for k, (o, s) in enumerate(boxes)
            if all(o[d] <= at[d] < o[d] + s[d] for d in range(len(full)))
        ]
        overlap = (live[inside[0]], live[inside[1]])
    return Coverage(total, volume, total - missing, multiple, holes, overlap, at)
