"""Do a tensor's stored chunks cover its full shape exactly once? The one coverage algorithm,
used by the DCP and the torch_dist checks. Pure.

Exact, never allocates the tensor, and near-linear in the chunks on any input, because the
chunks come from untrusted metadata: the cheap proofs first (a regular grid, one sharded
axis), a difference grid with budgets after, volumes past the budgets
(`check-budget-exceeded`). The steps: docs/architecture.md, "checks/".
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import compress, islice
from math import prod
from operator import add, le

import numpy as np

__all__ = ["MAX_CELLS", "MAX_CORNERS", "Box", "Chunk", "Coverage", "coverage"]

# (offsets, sizes) of one stored chunk.
Chunk = tuple[tuple[int, ...], tuple[int, ...]]
# A region as (start, stop) per axis.
Box = tuple[tuple[int, int], ...]

# Points of the exact counter grid (boundaries per axis multiplied); past this, or past
# `MAX_CORNERS`, only volumes are compared. Real checkpoints need a few hundred at most:
# everything but a hostile file is a regular grid or a one-axis split.
MAX_CELLS = 4_000_000
# Corner updates of the counter grid: distinct chunks x 2 ** (axes some chunk does not span).
MAX_CORNERS = 16_000_000
# Uncovered regions kept for a message; counting them all could be huge.
MAX_HOLES = 3
# Cell volumes past this are summed as Python integers (a hostile shape of 2**40 x 2**40).
_INT64_SAFE = 1 << 62


@dataclass(frozen=True, slots=True)
class Coverage:
    """What the chunks of one tensor cover.

    `covered` elements are in at least one chunk and `multiple` in more than one (both exact
    unless `exact` is False, when only the sum of chunk volumes, `volume`, is known). `holes`
    are a few uncovered boxes; `overlap` the first pair of overlapping chunks (indices into
    the input) and `overlap_at` where they meet; `outside` the first chunk that does not fit
    the full shape (then nothing else was computed). `verified` is False when the chunks'
    volume equals the tensor's but the budget did not allow proving they tile it.
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
    def verified(self) -> bool:
        """False when nothing tells whether the chunks tile the tensor: not exact, and the
        volumes agree."""
        return self.exact or self.outside is not None or self.volume != self.total

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
    # Each distinct chunk is judged once and its volume counted times its repeats.
    counts = Counter(chunks)
    volume = sum(prod(s) * n for (_, s), n in counts.items())
    # 1. Chunks that do not fit are corrupt metadata; nothing else can be trusted.
    ndim = len(full)
    for chunk in counts:
        offsets, sizes = chunk
        if (
            len(offsets) != ndim
            or len(sizes) != ndim
            or not all(map(le, map(add, offsets, sizes), full))
        ):
            return Coverage(total, volume, outside=chunks.index(chunk))
    if total == 0:
        return Coverage(total, volume)
    live = [i for i, (_, sizes) in enumerate(chunks) if 0 not in sizes]
    if not live:
        return Coverage(total, volume, holes=(tuple((0, d) for d in full),))
    if not full:  # a scalar: every chunk is the whole tensor
        pair = (live[0], live[1]) if len(live) > 1 else None
        return Coverage(1, volume, 1, int(len(live) > 1), (), pair, () if pair else None)
    boxes = [chunks[i] for i in live]
    # The live chunks once each, in the order they are first listed.
    distinct = [c for c in counts if 0 not in c[1]]
    # 2. The common case by far: a regular grid (one chunk is the grid of one cell).
    if len(distinct) == len(boxes) and _regular_grid(full, distinct):
        return Coverage(total, volume, covered=total)
    # 3. One axis varies and the others span the tensor: one interval sweep.
    varying = [d for d in range(len(full)) if len({(o[d], s[d]) for o, s in distinct}) > 1]
    axis = varying[0] if varying else 0
    first_o, first_s = boxes[0]
    spans = all(first_o[d] == 0 and first_s[d] == full[d] for d in range(len(full)) if d != axis)
    if len(varying) <= 1 and spans:
        return _sweep(full, boxes, live, axis, volume)
    # 4. The exact counter grid over the axes some chunk does not span, or 5. volumes only.
    axes = [d for d, n in enumerate(full) if any(o[d] != 0 or s[d] != n for o, s in distinct)]
    bounds = [
        sorted({0, full[d], *(o[d] for o, _ in distinct), *(o[d] + s[d] for o, s in distinct)})
        for d in axes
    ]
    if prod(len(b) for b in bounds) > MAX_CELLS or len(distinct) << len(axes) > MAX_CORNERS:
        return Coverage(total, volume, exact=False)
    return _grid(full, boxes, live, axes, bounds, volume)


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
    full: tuple[int, ...],
    boxes: list[Chunk],
    live: list[int],
    axes: list[int],
    bounds: list[list[int]],
    volume: int,
) -> Coverage:
    """A counter per cell of the boundary grid over `axes` (0 uncovered, 2+ overlapped),
    from a difference grid: each distinct box adds its count at its 2**len(axes) corners
    with alternating signs, and a running sum along every axis gives the counters."""
    counts = Counter(boxes)
    index = [{v: i for i, v in enumerate(b)} for b in bounds]
    shape = tuple(len(b) for b in bounds)
    # Per distinct box and axis: the number of its first and of its one-past-last boundary.
    ends = np.asarray(
        [
            [index[k][o[d] + s[d] * upper] for k, d in enumerate(axes)]
            for upper in (0, 1)
            for o, s in counts
        ],
        dtype=np.int64,
    ).reshape(2, len(counts), len(axes))
    strides = np.asarray([prod(shape[k + 1 :]) for k in range(len(shape))], dtype=np.int64)
    lo = ends[0] @ strides
    # Per axis, how far (in flat positions) each box's upper corner is from its lower one.
    steps = [(ends[1][:, k] - ends[0][:, k]) * strides[k] for k in range(len(axes))]
    weight = np.fromiter(counts.values(), dtype=np.int64, count=len(counts))
    diff = np.zeros(prod(shape), dtype=np.int64)
    for corner in range(1 << len(axes)):
        flat = lo.copy()
        odd = False
        for k in range(len(axes)):
            if corner >> k & 1:
                flat += steps[k]
                odd = not odd
        np.add.at(diff, flat, -weight if odd else weight)
    grid = diff.reshape(shape)
    for k in range(len(axes)):
        np.cumsum(grid, axis=k, out=grid)
    cells = grid[tuple(slice(0, n - 1) for n in shape)]
    total = prod(full)
    # Elements per cell: the product of its widths, times the axes every chunk spans.
    spanned = prod(n for d, n in enumerate(full) if d not in axes)
    widths = [np.diff(np.asarray(b, dtype=object)) for b in bounds]
    uncovered, several = cells == 0, cells > 1
    missing = _volume_where(uncovered, widths, total) * spanned
    multiple = _volume_where(several, widths, total) * spanned
    first_holes = np.flatnonzero(uncovered)[:MAX_HOLES]
    holes = tuple(
        _full_box(full, axes, bounds, _cell(i, cells.shape)) for i in first_holes.tolist()
    )
    overlap: tuple[int, int] | None = None
    at: tuple[int, ...] | None = None
    if multiple:
        cell = _cell(int(np.argmax(several)), cells.shape)
        at = tuple(a for a, _ in _full_box(full, axes, bounds, cell))
        # The first two listed chunks that hold `at` (each distinct chunk tested once).
        holds = {
            box for box in counts if all(o <= a < o + s for o, s, a in zip(*box, at, strict=True))
        }
        first, second = islice(compress(live, map(holds.__contains__, boxes)), 2)
        overlap = (first, second)
    return Coverage(total, volume, total - missing, multiple, holes, overlap, at)


def _volume_where(mask: np.ndarray, widths: list[np.ndarray], total: int) -> int:
    """Elements in the cells where `mask` is set (a cell holds the product of its widths
    along each axis). Within int64, one array of cell volumes; a hostile shape past it
    is contracted axis by axis in Python integers (bounded by `MAX_CELLS`)."""
    if not mask.any():
        return 0
    if total < _INT64_SAFE:
        volume = np.ones(mask.shape, dtype=np.int64)
        for k, w in enumerate(widths):
            shape = [-1 if i == k else 1 for i in range(len(widths))]
            volume = volume * w.astype(np.int64).reshape(shape)
        return int(volume[mask].sum())
    acc: np.ndarray = mask.astype(object)
    for w in reversed(widths):
        acc = (acc * w).sum(axis=-1)
    return int(acc)


def _cell(flat: int, shape: tuple[int, ...]) -> list[int]:
    return [int(i) for i in np.unravel_index(flat, shape)]


def _full_box(
    full: tuple[int, ...], axes: list[int], bounds: list[list[int]], cell: Sequence[int]
) -> Box:
    """The region of one counter cell, in every axis of the tensor."""
    spans = {d: (bounds[k][cell[k]], bounds[k][cell[k] + 1]) for k, d in enumerate(axes)}
    return tuple(spans.get(d, (0, n)) for d, n in enumerate(full))
