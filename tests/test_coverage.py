"""The one coverage algorithm (`inspector._internal.checks.coverage`) against a brute-force count of
every element, on any boxes: each of its paths (regular grid, one-axis sweep, counter grid,
volume-only) must agree with the truth or say it is not exact."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from inspector._internal.checks import coverage as cov

dims = st.lists(st.integers(1, 6), min_size=1, max_size=3)


@st.composite
def cases(draw: st.DrawFn) -> tuple[tuple[int, ...], list]:
    full = tuple(draw(dims))
    n = draw(st.integers(1, 6))
    chunks = []
    for _ in range(n):
        offsets = tuple(draw(st.integers(0, d)) for d in full)
        sizes = tuple(
            draw(st.integers(0, d - o + draw(st.sampled_from([0, 0, 0, 1]))))
            for d, o in zip(full, offsets, strict=True)
        )
        chunks.append((offsets, sizes))
    return full, chunks


@settings(max_examples=300, deadline=None)
@given(cases())
def test_coverage_matches_brute_force(case) -> None:
    full, chunks = case
    result = cov.coverage(full, chunks)
    outside = [
        i
        for i, (o, s) in enumerate(chunks)
        if any(a + b > d for a, b, d in zip(o, s, full, strict=True))
    ]
    if outside:
        assert result.outside == outside[0] and not result.complete
        return
    grid = np.zeros(full, dtype=np.int32)
    for o, s in chunks:
        grid[tuple(slice(a, a + b) for a, b in zip(o, s, strict=True))] += 1
    assert result.exact
    assert result.covered == int((grid > 0).sum())
    assert result.multiple == int((grid > 1).sum())
    assert result.complete == bool((grid == 1).all())
    for hole in result.holes:
        assert not grid[tuple(slice(a, b) for a, b in hole)].any()
    if result.overlap is not None:
        a, b = (chunks[k] for k in result.overlap)
        at = result.overlap_at
        assert all(o[d] <= at[d] < o[d] + s[d] for o, s in (a, b) for d in range(len(full)))
    else:
        assert not (grid > 1).any()


def test_regular_grid_and_sweep_paths() -> None:
    tp = [((0, 0), (4, 3)), ((0, 3), (4, 3)), ((4, 0), (4, 3)), ((4, 3), (4, 3))]
    assert cov.coverage((8, 6), tp).complete
    rows = [((0, 0), (2, 6)), ((4, 0), (4, 6))]  # rows 2-3 lost
    result = cov.coverage((8, 6), rows)
    assert result.covered == 36 and result.holes == (((2, 4), (0, 6)),)


def test_past_the_cell_cap_only_volumes_are_compared(monkeypatch) -> None:
    monkeypatch.setattr(cov, "MAX_CELLS", 3)
    boxes = [((0, 0), (2, 2)), ((2, 2), (2, 2)), ((0, 2), (2, 2)), ((2, 0), (1, 2))]
    result = cov.coverage((4, 4), boxes)
    assert not result.exact and not result.complete and result.volume == 14
